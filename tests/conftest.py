"""Shared pytest configuration: markers and the repository on sys.path for tests.harness."""
import os
import sys
from pathlib import Path

# CUDA kernels run under Numba's simulator unless a real GPU run asks
# otherwise (NUMBA_ENABLE_CUDASIM=0, as on the lent GPU machine).  Set before
# any test module imports numba.cuda.
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes seconds (multi-process jobs, ssh); runs by default, "
                   "deselect with -m 'not slow'")


def _ensure_launcher_importable():
    """Make ``erdmampi.launcher`` importable from the tree when erdmampi is not installed."""
    import importlib.util
    repo = TESTS.parent
    if str(repo) not in sys.path:
        sys.path.append(str(repo))
    try:
        if importlib.util.find_spec("erdmampi.launcher") is not None:
            return
    except ImportError:
        return
    spec = importlib.util.spec_from_file_location(
        "erdmampi.launcher", repo / "launcher" / "__init__.py",
        submodule_search_locations=[str(repo / "launcher")])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)


_ensure_launcher_importable()
