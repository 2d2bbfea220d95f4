"""Device buffers (CUDA array interface, DLPack) through the buffer API.

What runs where:

* CI (no GPU): Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) on 2 and
  4 ranks (tests/scripts/gpu_numba.py).  Simulator arrays are host memory
  and honestly say so: no ``__cuda_array_interface__``, DLPack device CPU.
  So they travel as host buffers, and this checks that numba.cuda code
  tested under the simulator works unchanged with erdmampi; it cannot
  exercise host staging.  Also run here: the refusals (DLPack device types
  that are not staged, device memory with no staging backend, CAI stream 0)
  and zero-size device buffers, none of which touch device memory.
* A real NVIDIA GPU: the same rank script through Numba's CAI staging, and
  tests/scripts/gpu_cupy_check.py (CuPy: every receive path, CAI streams,
  DLPack-only producers, each staging backend).  Without a GPU these are
  skipped with a reason saying so.  No test ever declares host memory as
  device memory.
"""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

from _ranks import assert_ok, run_script
from erdmampi import buffers as B
from erdmampi.datatype import PREDEFINED as D

_NO_GPU = "needs an NVIDIA GPU with its CUDA driver: none found on this machine"


def _has(module):
    try:
        __import__(module)
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def _gpu():
    """Whether a CUDA GPU is usable (asked in a child, outside the simulator)."""
    code = ("ok = 0\n"
            "try:\n import cupy; ok = cupy.cuda.runtime.getDeviceCount() > 0\n"
            "except Exception: pass\n"
            "if not ok:\n"
            " try:\n  from numba import cuda; ok = cuda.is_available()\n"
            " except Exception: pass\n"
            "print(int(bool(ok)))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=120).stdout.strip()
    except subprocess.TimeoutExpired:
        return False
    return out.endswith("1")


needs_numba = pytest.mark.skipif(not _has("numba"), reason="numba is not installed")
needs_gpu = pytest.mark.skipif("not _gpu()", reason=_NO_GPU)
no_gpu_only = pytest.mark.skipif("_gpu()", reason="a GPU is present: staging would be attempted")


# -- Numba CUDA simulator: runs in CI --------------------------------------------

@needs_numba
@pytest.mark.parametrize("nprocs", [2, 4])
def test_numba_simulator_arrays(nprocs):
    p = run_script("gpu_numba.py", nprocs, timeout=120, env={"NUMBA_ENABLE_CUDASIM": "1"})
    assert_ok(p, "gpu_numba.py", nprocs)


@needs_numba
def test_simulator_arrays_are_host_dlpack_not_cai():
    """Why CI cannot exercise staging: the simulator exports no CAI and says
    its memory is CPU memory; erdmampi then uses it in place."""
    code = """if 1:
        import numpy as np
        from numba import cuda
        from erdmampi import buffers as B
        d = cuda.to_device(np.arange(4, dtype="i"))
        assert not hasattr(d, "__cuda_array_interface__")
        assert tuple(d.__dlpack_device__()) == (1, 0)
        assert B._numba_cuda() is None          # never used as a staging backend
        m = B.message_p2p([d, (2, 1), "i"], readonly=False)
        assert not m.device and m.count == 2
        m.array[:] = 7
        m.finish()
        assert d.copy_to_host().tolist() == [0, 7, 7, 3]
        print("ok")
    """
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr


# -- refusals and zero-size buffers: run in CI ---------------------------------------

class DLPackDevice:
    """A DLPack producer on a given device type whose memory must never be
    read: ``__dlpack__`` fails the test if called."""

    def __init__(self, device_type):
        self._device = (device_type, 0)

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, **kwargs):
        raise AssertionError("erdmampi exported a buffer it should have refused")


@pytest.mark.parametrize("device_type,name", [
    (4, "OpenCL"), (7, "Vulkan"), (8, "Metal"), (14, "OneAPI"), (15, "WebGPU"),
    (99, "unknown"),
])
@pytest.mark.parametrize("readonly", [True, False])
def test_dlpack_unsupported_device_type_is_refused(device_type, name, readonly):
    with pytest.raises(BufferError, match=rf"device type {device_type} \({name}\) is not supported"):
        B.message_p2p(DLPackDevice(device_type), readonly=readonly)
    with pytest.raises(BufferError, match="not supported"):
        B.message_cco([DLPackDevice(device_type), D["DOUBLE"]], readonly, 2)


class DLPackHostAsDevice:
    """Host memory exported with a CUDA/ROCm device type, as mpi4py's tests do
    without a GPU (a device export gets ``stream=-1``, ignored here)."""

    def __init__(self, arr, device_type):
        self._arr, self._device = arr, (device_type, 0)

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, stream=None, **kwargs):
        return self._arr.__dlpack__(**kwargs)


@no_gpu_only
@pytest.mark.parametrize("device_type", [2, 3, 10, 13])
def test_dlpack_device_pointer_without_gpu_is_used_in_place(device_type):
    # no driver could have made device memory: the pointer is host memory
    arr = np.arange(4, dtype="f8")
    m = B.message_p2p(DLPackHostAsDevice(arr, device_type), readonly=False)
    assert not m.device and m.count == 4
    m.array[:] = 5.0
    m.finish()
    assert arr.tolist() == [5.0] * 4


class CAIDescription:
    """Only a ``__cuda_array_interface__`` description; tests using it never
    let erdmampi copy (they check refusals, or describe zero bytes)."""

    def __init__(self, **kw):
        cai = {"data": (0, False), "typestr": "<f8", "shape": (4,), "version": 3}
        cai.update(kw)
        self.__cuda_array_interface__ = cai


def test_cai_stream_zero_is_refused():
    with pytest.raises(BufferError, match="stream 0 is not allowed"):
        B.message_p2p(CAIDescription(stream=0), readonly=True)


@pytest.mark.parametrize("readonly", [True, False])
def test_zero_size_device_buffer_needs_no_backend(readonly):
    for obj in (CAIDescription(data=(None, False), shape=(0,), stream=1),
                CAIDescription(data=(None, False), shape=(3, 0))):
        m = B.message_p2p(obj, readonly=readonly)
        assert (m.device, m.nbytes, m.count, m.addr) == (True, 0, 0, 0)
        assert m.datatype == D["DOUBLE"]
        m.finish()


@no_gpu_only
def test_cai_pointer_without_gpu_is_used_in_place():
    arr = np.arange(4, dtype="f8")
    m = B.message_p2p(CAIDescription(data=(arr.ctypes.data, False)), readonly=False)
    assert not m.device and m.count == 4
    m.array[:] = 3.0
    m.finish()
    assert arr.tolist() == [3.0] * 4


def test_pointer_attributes_hold_the_cuda13_struct():
    """cudaPointerGetAttributes writes its whole struct (CUDA 13: 4 fields and
    8 reserved longs, 88 bytes); a smaller buffer corrupts the heap."""
    import ctypes
    assert ctypes.sizeof(B._pointer_attributes()) >= 4 + 4 + 8 + 8 + 8 * 8


def test_mpi_buffer_of_device_memory_holds_the_address(monkeypatch):
    """MPI.buffer over device memory (the driver says so) keeps the device
    address and refuses CPU access, as mpi4py's buffer does; nothing is
    staged.  The driver's answer is simulated here: the pointer is never
    dereferenced."""
    from erdmampi import MPI
    monkeypatch.setattr(B, "_cai_is_host", lambda ptr: False)
    arr = np.arange(4, dtype="f8")
    buf = MPI.buffer.frombuffer(CAIDescription(data=(arr.ctypes.data, False)))
    assert (buf.address, buf.nbytes, buf.readonly) == (arr.ctypes.data, 32, False)
    for touch in (lambda: buf.cast("B"), lambda: buf.tobytes(), lambda: buf[0]):
        with pytest.raises(BufferError):
            touch()
    ro = MPI.buffer.frombuffer(CAIDescription(data=(arr.ctypes.data, True)), readonly=True)
    assert ro.readonly and ro.address == arr.ctypes.data


def test_null_device_pointer_is_refused():
    # a NULL pointer with bytes behind it is never read, GPU or not
    with pytest.raises(BufferError, match="NULL"):
        B.message_p2p(CAIDescription(), readonly=True)


# -- a real GPU ----------------------------------------------------------------------

@needs_numba
@needs_gpu
@pytest.mark.parametrize("nprocs", [2, 4])
def test_numba_device_arrays_staged(nprocs):
    env = {"NUMBA_ENABLE_CUDASIM": "0"}
    assert_ok(run_script("gpu_numba.py", nprocs, timeout=300, env=env), "gpu_numba.py", nprocs)


@pytest.mark.skipif(not _has("cupy"), reason="CuPy is not installed")
@needs_gpu
@pytest.mark.parametrize("nprocs", [2, 3])
def test_cupy_check(nprocs):
    p = run_script("gpu_cupy_check.py", nprocs, timeout=300)
    assert_ok(p, "gpu_cupy_check.py", nprocs)


@needs_gpu
def test_gpu_staging_copies_only_the_message():
    cp = pytest.importorskip("cupy")
    a = cp.arange(10, dtype="i")
    m = B.message_p2p([a, (3, 4), "i"], readonly=False)
    assert m.device and m.count == 3
    assert m.array.tolist() == [4, 5, 6]
    m.array[:] = -1
    m.finish()
    assert cp.asnumpy(a).tolist() == [0, 1, 2, 3, -1, -1, -1, 7, 8, 9]
    np.testing.assert_array_equal(B.message_p2p(a, True).array,
                                  [0, 1, 2, 3, -1, -1, -1, 7, 8, 9])


# -- erdmampi's own pinned pool (staging without CuPy) --------------------------

def test_size_classes_waste_at_most_a_quarter():
    from erdmampi._pinned import size_class
    for n in (1, 4095, 4096, 65536, 65537, 100_000, 1 << 20, (1 << 20) + 1, 3 << 24,
              (64 << 20) - 1):
        c = size_class(n)
        assert n <= c <= max(4096, n + n // 4), (n, c)
        assert size_class(c) == c
    assert {size_class(n) for n in range(1 << 20, 2 << 20, 997)} == {
        (1 << 20) + k * (1 << 18) for k in range(5)}


def test_pinned_pool_hands_areas_back_and_bounds_what_it_keeps():
    """The pool's bookkeeping, over plain memory from ctypes (the allocators
    that pin are exercised on a GPU by the test below)."""
    import ctypes
    import gc
    from erdmampi._pinned import PinnedPool
    live, freed = {}, []

    def alloc(size):
        buf = ctypes.create_string_buffer(size)
        live[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf), ctypes.addressof(buf)

    def free(handle):
        freed.append(live.pop(handle))

    pool = PinnedPool(alloc, free, keep=3 << 20)
    a = pool.take(1 << 20)
    assert a.nbytes == 1 << 20 and a.dtype == np.uint8 and a.flags.writeable
    a[:] = 7
    addr = a.ctypes.data
    del a
    gc.collect()
    assert pool.idle_bytes() == 1 << 20 and not freed
    b = pool.take((1 << 20) - 100)          # same class: the same area again
    assert b.ctypes.data == addr and pool.pinned == 1 and pool.idle_bytes() == 0
    view = b[10:20]
    del b
    gc.collect()
    assert pool.idle_bytes() == 0           # a view still holds the area
    assert (view == 7).all()
    del view
    gc.collect()
    assert pool.idle_bytes() == 1 << 20
    areas = [pool.take(2 << 20) for _ in range(3)]   # 6 MiB in use, 1 MiB idle
    assert pool.pinned == 4
    del areas
    gc.collect()
    # 1 + 2 MiB kept (the bound is 3 MiB), the other two areas unpinned
    assert pool.idle_bytes() == 3 << 20 and len(freed) == 2


_PINNED_CHILD = r"""
import sys, time
sys.modules["cupy"] = sys.modules["cupyx"] = None      # staging without CuPy
import numpy as np
from numba import cuda
from erdmampi import buffers as B, _pinned
d = cuda.to_device(np.arange(1 << 20, dtype=np.float32))
m = B.message_p2p(d, readonly=True)
pool = _pinned._POOL
assert m.device and pool, (m.device, pool)
addr = m.array.ctypes.data
assert m.array.view(np.float32)[-1] == (1 << 20) - 1
m.finish(); del m
m = B.message_p2p(d, readonly=True)
assert m.array.ctypes.data == addr and pool.pinned == 1, (pool.pinned,)
# the driver knows the area as page-locked host memory
attrs = B._pointer_attributes()
lib = B._CudaRuntime.load()
if lib is not None:
    assert lib.cudaPointerGetAttributes(attrs, addr) == 0 and attrs[0] == 1, attrs[0]
print("pinned ok", "runtime" if lib is not None else "numba")
"""


@needs_numba
@needs_gpu
def test_staging_without_cupy_is_pinned_and_reused():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    p = subprocess.run([sys.executable, "-c", _PINNED_CHILD], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and "pinned ok" in p.stdout, p.stdout + p.stderr
