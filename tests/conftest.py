import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The library tests and the checkout tests, by folder. A library test (tests/library/) imports
# gamfunc, torch, numpy, the packages of the dev and plot extras and the shared helpers of tests/
# (helpers, models, registry), and reads no file of the repository: it runs against an installed
# wheel, from a copy of tests/ without checkout/ (.ci/run's wheel job). A checkout test
# (tests/checkout/) needs the repository: it imports reproduce/ or benchmarks/, or reads README.md,
# docs/, examples/, pyproject.toml or the source tree as files. tests/checkout/test_suite_split.py
# checks each module against its folder. The checkout tests are marked ``checkout`` and skip
# outside a checkout.
LIBRARY = HERE / "library"
CHECKOUT = HERE / "checkout"
# A checkout test may use a library test module's helpers (test_readme: the facade's Lightning
# module), whichever folders a run collects; never the other way round.
sys.path.insert(1, str(LIBRARY))
# A checkout: the repository around tests/, not a copy of tests/ beside an installed wheel.
IN_CHECKOUT = (HERE.parent / "reproduce").is_dir()


# A test module that cannot be imported for want of a package of an extra (reproduce/ imports them
# at its top) is skipped with the package named, not a collection error: the suite runs with [dev].
from helpers import OPTIONAL  # noqa: E402


class _SkipWithoutExtras(pytest.Module):
    """A test module whose import skips where a package of an extra is missing, and a checkout test
    module that skips outside a checkout.

    pytest raises ``CollectError`` from the ImportError of the test module; its cause names the
    missing module. (``_getobj`` is pytest's hook point for importing the module, pytest 8 and 9.)
    """

    def _getobj(self):
        if self.path.is_relative_to(CHECKOUT) and not IN_CHECKOUT:
            pytest.skip(
                "a checkout test (tests/checkout/): needs the repository",
                allow_module_level=True,
            )
        try:
            return super()._getobj()
        except self.CollectError as e:
            cause = e.__cause__
            name = getattr(cause, "name", None) or ""
            if isinstance(cause, ModuleNotFoundError) and name.split(".")[0] in OPTIONAL:
                pytest.skip(
                    f'needs {name.split(".")[0]}: pip install -e ".[reproduce]"',
                    allow_module_level=True,
                )
            raise


def pytest_pycollect_makemodule(module_path, parent):
    return _SkipWithoutExtras.from_parent(parent, path=module_path)


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    """The doctests (``--doctest-modules``, pyproject.toml) are gamfunc's examples: the modules of
    tests/ hold none, and importing one as a doctest module would bypass the skips above."""
    collected = yield
    return [c for c in collected if type(c).__name__ != "DoctestModule"]


def pytest_report_header(config):
    import gamfunc

    return f"gamfunc {gamfunc.__version__} from {Path(gamfunc.__file__).parent}"


def pytest_configure(config):
    # pytest-xdist runs one process per core (-n auto): each torch then takes its share of the cores
    # for its intra-op threads, not all of them, so the workers' thread pools do not contend.
    # The processes a test starts (train.py, torchrun, the GPU check's workers) inherit the share.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(share)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.is_relative_to(CHECKOUT):
            item.add_marker(pytest.mark.checkout)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
