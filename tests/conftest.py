import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


# A test module that cannot be imported for want of a package of an extra (reproduce/ imports them
# at its top) is skipped with the package named, not a collection error: the suite runs with [dev].
from helpers import OPTIONAL


class _SkipWithoutExtras(pytest.Module):
    """A test module whose import skips where a package of an extra is missing.

    pytest raises ``CollectError`` from the ImportError of the test module; its cause names the
    missing module. (``_getobj`` is pytest's hook point for importing the module, pytest 8 and 9.)
    """

    def _getobj(self):
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
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
