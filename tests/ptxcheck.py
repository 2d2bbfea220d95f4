"""Compile CUDA kernels to PTX for sm_90 without a GPU (needs NVVM only).

Numba's simulator runs kernels as Python and type-checks nothing, so code
that would not compile for a real GPU passes every simulator test; this
compiles it for real in a subprocess (the simulator switch is read at import).
"""
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_PRELUDE = r"""
import os
os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
from numba import cuda, types as T
from numba.cuda.cudadrv import nvvm
if not nvvm.is_available():
    print("NO-NVVM")
    raise SystemExit(0)
import numba.cuda.dispatcher as D
class _Dev:                      # no GPU needed: device functions for sm_90
    compute_capability = (9, 0)
D.get_current_device = lambda: _Dev()
A8 = T.Array(T.uint8, 1, "C"); A32 = T.Array(T.int32, 1, "C")
A64 = T.Array(T.int64, 1, "C"); i = T.int64
def ptx(kernel, sig):
    return cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))[0]
"""


def assert_compiles(body: str) -> None:
    """Run ``body`` after the prelude (which defines ``ptx(kernel, sig)`` and
    the array types A8/A32/A64 and ``i``); it must print PTX-OK."""
    r = subprocess.run([sys.executable, "-c", _PRELUDE + body + '\nprint("PTX-OK")\n'],
                       capture_output=True, text=True, timeout=600, cwd=str(REPO))
    if "NO-NVVM" in r.stdout:
        pytest.skip("NVVM not available")
    assert r.returncode == 0 and "PTX-OK" in r.stdout, r.stderr[-3000:]
