import os
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# The library tests and the checkout tests. A library test imports gamfunc, torch, numpy, the
# packages of the dev and plot extras and tests/' own library modules, and reads no file of the
# repository: it runs against an installed wheel, from a copy of tests/ (.ci/run's wheel job,
# `pytest -m "not checkout"`). A checkout test needs the repository: it imports reproduce/ or
# benchmarks/, or reads README.md, docs/, examples/, pyproject.toml or the source tree as files.
# Every module of tests/ not named here is a library module; tests/test_suite_split.py checks that
# it is. The named test modules are marked ``checkout`` and skip outside a checkout.
CHECKOUT = frozenset(
    {
        "test_benchmark_data_parallel",
        "test_benchmark_first_step",
        "test_benchmark_flops",
        "test_benchmark_gpu_check",
        "test_benchmark_hessian_vmap",
        "test_benchmark_input_pipeline",
        "test_benchmark_report",
        "test_benchmark_step_cost",
        "test_dali_data",
        "test_docs",
        "test_docs_architecture",
        "test_docs_flags",
        "test_docs_html",
        "test_docs_install",
        "test_docs_sections",
        "test_docs_site",
        "test_evidence",
        "test_examples",
        "test_gpu_data",
        "test_layers",
        "test_main_job",
        "test_metrics_full_data",
        "test_packaging",
        "test_readme",
        "test_reproduce_checkpoint",
        "test_reproduce_compile_cache",
        "test_reproduce_config",
        "test_reproduce_data",
        "test_reproduce_cheap_harness",
        "test_reproduce_fmnist",
        "test_reproduce_fmnist_harness",
        "test_reproduce_fsdp",
        "test_reproduce_layers",
        "test_reproduce_tensorboard",
        "test_reproduce_methods",
        "test_reproduce_models",
        "test_reproduce_presets",
        "test_reproduce_profiling",
        "test_reproduce_reliability",
        "test_reproduce_signals",
        "test_reproduce_step_mode",
        "test_reproduce_sweep",
        "test_reproduce_torchrun",
        "test_reproduce_train",
        "test_reproduce_transfer",
        "test_reproduce_trust",
        "test_reproduce_vmap_sweep",
        "test_strict_json",
        "test_suite_split",
        "test_theorem_scalars",
        "train_cli",  # running reproduce/train.py: the checkout tests' helper
    }
)
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
        if self.path.stem in CHECKOUT and not IN_CHECKOUT:
            pytest.skip(
                "a checkout test (tests/conftest.py: CHECKOUT): needs the repository",
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
        if item.path.parent == HERE and item.path.stem in CHECKOUT:
            item.add_marker(pytest.mark.checkout)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
