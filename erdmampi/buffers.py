"""The single buffer-spec parser (mpi4py's ``msgbuffer.pxi`` rules).

A message is ``buf``, ``[buf, type]``, ``[buf, count]``, ``[buf, count, type]``,
``[buf, (count, displ), type]`` or ``[buf, count, displ, type]``; vector
messages take counts/displacements per block.  ``buf`` is any object with
the buffer protocol, ``__dlpack__`` or ``__cuda_array_interface__``; ``type``
is a :class:`~erdmampi.datatype.Datatype` or a typecode string.  Everything
resolves to a :class:`BufMsg` holding a host address, a byte length and a
1-D NumPy view over exactly the message.

Device buffers (CUDA array interface; DLPack on a CUDA or ROCm device) are
staged through host memory: ``BufMsg.array`` is a host copy of the message's
bytes, and ``finish()`` copies it back after a receive.  Staging uses CuPy,
Numba or the CUDA runtime (``libcudart`` through ctypes), whichever works;
without any of them, or for another DLPack device type, a device buffer
raises ``BufferError`` with a clear message.  The "device staging" section
below states when the device is read and written (stream-ordered semantics).

Error types follow mpi4py: malformed specs raise ``TypeError``/``ValueError``,
unknown typecodes ``KeyError``, buffers that cannot be exported as required
(read-only for a receive, non-contiguous, non-native byte order)
``BufferError``.  Unlike mpi4py (which leaves it to MPI), a count that does not
fit in the buffer raises ``ValueError``: the engine must never write past it.
"""

import ctypes
import operator
import warnings

import numpy as np

from . import _pinned
from . import bf16 as _bf16
from . import dlpack as _dlpack
from ._membuf import empty_export as _EmptyExport
from . import typemap as _tm

from .datatype import DATATYPE_NULL, Datatype, asdatatype, from_format, PREDEFINED

__all__ = [
    "BottomType", "InPlaceType", "BufferAutomaticType",
    "BOTTOM", "IN_PLACE", "BUFFER_AUTOMATIC",
    "is_bottom", "is_in_place", "is_buffer_automatic",
    "BufMsg", "getbuffer", "message_p2p", "message_cco", "message_vector",
]

# -----------------------------------------------------------------------------
# Sentinels


class _Sentinel(_EmptyExport):
    __slots__ = ()
    _name = ""
    _value = 0

    def __new__(cls):
        inst = cls.__dict__.get("_instance")
        if inst is None:
            inst = object.__new__(cls)
            cls._instance = inst
        return inst

    def __bool__(self):
        return self._value != 0

    def __int__(self):
        return self._value

    def __index__(self):
        return self._value

    def __hash__(self):
        return hash(self._value)

    def __eq__(self, other):
        if isinstance(other, type(self)):
            return True
        if not _is_integral(other):
            return NotImplemented
        return self._value == operator.index(other)

    def __ne__(self, other):
        res = self.__eq__(other)
        return res if res is NotImplemented else not res

    def __repr__(self):
        return self._name

    def __reduce__(self):
        return self._name


class BottomType(_Sentinel):
    """Type of `BOTTOM`."""

    __slots__ = ()
    _name = "BOTTOM"
    _value = 0


class InPlaceType(_Sentinel):
    """Type of `IN_PLACE`."""

    __slots__ = ()
    _name = "IN_PLACE"
    _value = -1


class BufferAutomaticType(_Sentinel):
    """Type of `BUFFER_AUTOMATIC`."""

    __slots__ = ()
    _name = "BUFFER_AUTOMATIC"
    _value = 0


BOTTOM = BottomType()
IN_PLACE = InPlaceType()
BUFFER_AUTOMATIC = BufferAutomaticType()


def is_bottom(obj):
    """``None`` or `BOTTOM` (mpi4py treats both as MPI_BOTTOM)."""
    return obj is None or obj is BOTTOM


def is_in_place(obj):
    """``None`` or `IN_PLACE` (mpi4py treats both as MPI_IN_PLACE)."""
    return obj is None or obj is IN_PLACE


def is_buffer_automatic(obj):
    return obj is BUFFER_AUTOMATIC


def _is_integral(ob):
    try:
        operator.index(ob)
    except TypeError:
        return False
    try:
        len(ob)
    except TypeError:
        return True
    return False


# -----------------------------------------------------------------------------
# Buffer acquisition

_CPU_DEVICES = (1,)  # kDLCPU; every other DLPack device is staged or refused

# DLPack DLDeviceType values (dlpack.h) and the ones staged through the host
_DL_DEVICE_NAMES = {
    1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
    9: "VPI", 10: "ROCM", 11: "ROCMHost", 12: "ExtDev", 13: "CUDAManaged",
    14: "OneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA",
}
_DL_STAGED = (2, 3, 10, 11, 13)  # CUDA and ROCm memory (CuPy / CAI)


class _Raw:
    """A contiguous byte range: the result of exporting one object.

    For a device buffer ``raw`` is a host staging area of the same size,
    filled only where a message needs it: :meth:`stage_in` copies a byte
    range device -> host, :meth:`stage_out` host -> device (see the
    "device staging" section for the ordering rules).
    """

    __slots__ = ("obj", "raw", "fmt", "device", "_download", "_upload")

    def __init__(self, obj, raw, fmt, device=False, download=None, upload=None):
        self.obj = obj          # keep-alive
        self.raw = raw          # 1-D uint8 ndarray over the bytes (host)
        self.fmt = fmt          # format string, or None
        self.device = device
        self._download = download   # (host, start, stop) device -> host
        self._upload = upload       # (host, start, stop) host -> device

    def stage_in(self, start, stop):
        """Copy device bytes ``[start, stop)`` into the staging area."""
        if self.device and self._download is not None and stop > start:
            self._download(self.raw, start, stop)

    def stage_out(self, start, stop):
        """Copy staging bytes ``[start, stop)`` back to the device."""
        if self.device and self._upload is not None and stop > start:
            self._upload(self.raw, start, stop)


def _raw_from_memoryview(mv):
    if mv.nbytes == 0:
        # cast() refuses a zero-size multi-dimensional view: nothing to read anyway
        return np.empty(0, np.uint8)
    if mv.c_contiguous:
        src = mv if (mv.ndim == 1 and mv.format == "B") else mv.cast("B")
        return np.frombuffer(src, dtype=np.uint8)
    arr = np.asarray(mv)
    return arr.reshape(-1, order="F").view(np.uint8)


def _from_buffer_protocol(obj, readonly):
    """(raw, fmt) or raises the error PyObject_GetBuffer would raise."""
    mv = memoryview(obj)
    if not mv.contiguous:
        raise BufferError("memoryview: underlying buffer is not contiguous")
    if not readonly and mv.readonly:
        raise BufferError("Object is not writable.")
    return _raw_from_memoryview(mv), mv.format


def _from_dlpack(obj, readonly):
    try:
        dlpack_device = obj.__dlpack_device__
        obj.__dlpack__  # noqa: B018
    except AttributeError:
        raise NotImplementedError("dlpack: missing support") from None
    device_type, device_id = dlpack_device()
    if int(device_type) not in _CPU_DEVICES:
        return _from_dlpack_device(obj, readonly, int(device_type), int(device_id))
    return _dlpack_host(obj, _dlpack.read(obj, readonly))


def _dlpack_host(obj, view):
    """The bytes of a DLPack export that the CPU can address directly."""
    if view.nbytes and not view.addr:
        raise BufferError(f"dlpack: NULL data pointer with {view.nbytes} bytes")
    if view.nbytes:
        raw = np.frombuffer((ctypes.c_uint8 * view.nbytes).from_address(view.addr),
                            dtype=np.uint8)
    else:
        raw = np.empty(0, np.uint8)
    # the capsule stays referenced as long as the bytes are: its destructor,
    # the producer's, releases the tensor
    return _Raw((obj, view.capsule), raw, _view_format(view))


def _view_format(view):
    """The format of a DLPack view; bfloat16 (kDLBfloat) too: moved as 2-byte
    elements and reducible."""
    if view.dtype_code == 4 and view.dtype_bits == 16 and view.itemsize == 2:
        return _bf16.FORMAT
    return view.fmt


def _cai_format(typekind, itemsize):
    table = {
        "b": {1: "?"},
        "i": {1: "b", 2: "h", 4: "i", 8: "l"},
        "u": {1: "B", 2: "H", 4: "I", 8: "L"},
        "f": {2: "e", 4: "f", 8: "d", 16: "g"},
        "c": {4: "Ze", 8: "Zf", 16: "Zd", 32: "Zg"},
    }
    return table.get(typekind, {}).get(itemsize)


def _cai_is_contig(shape, strides, itemsize, order):
    size = itemsize
    dims = range(len(shape)) if order == "F" else reversed(range(len(shape)))
    for i in dims:
        if shape[i] > 1 and strides[i] != size:
            return False
        size *= shape[i]
    return True


def _cai_describe(obj, readonly):
    """Parse ``__cuda_array_interface__`` like mpi4py's Py_GetCAIBuffer.

    Returns ``(dev_ptr, nbytes, format)``.
    """
    cai = obj.__cuda_array_interface__
    typestr = cai["typestr"]
    shape = tuple(cai["shape"])
    strides = cai.get("strides")
    mask = cai.get("mask")
    dev_ptr, ro = cai["data"]
    size = 1
    for s in shape:
        size *= s
    if dev_ptr is None and size == 0:
        dev_ptr = 0
    byteorder, typekind, itemsize = typestr[0], typestr[1], int(typestr[2:])
    if byteorder == ">" or byteorder not in "<>|=":
        raise BufferError(
            f"__cuda_array_interface__: typestr {typestr!r} with "
            f"{'non-native' if byteorder == '>' else 'unrecognized'} byte order")
    if mask is not None:
        raise BufferError("__cuda_array_interface__: cannot handle masked arrays")
    if size < 0:
        raise BufferError(
            f"__cuda_array_interface__: buffer with negative size "
            f"(shape:{shape}, size:{size})")
    if strides is not None:
        strides = tuple(strides)
        if not (_cai_is_contig(shape, strides, itemsize, "C")
                or _cai_is_contig(shape, strides, itemsize, "F")):
            raise BufferError(
                f"__cuda_array_interface__: buffer is not contiguous "
                f"(shape:{shape}, strides:{strides}, itemsize:{itemsize})")
    if ro and not readonly:
        raise BufferError("__cuda_array_interface__: buffer is not writable")
    descr = cai.get("descr")
    if descr is not None and (len(descr) != 1 or descr[0] != ("", typestr)):
        warnings.warn("__cuda_array_interface__: ignoring 'descr' key", RuntimeWarning,
                      stacklevel=2)
    return int(dev_ptr), size * itemsize, _cai_format(typekind, itemsize)


def _from_cai(obj, readonly):
    """Stage a ``__cuda_array_interface__`` buffer (see "device staging")."""
    try:
        cai = obj.__cuda_array_interface__
    except AttributeError:
        raise NotImplementedError("missing CUDA array interface") from None
    dev_ptr, nbytes, fmt = _cai_describe(obj, readonly)
    stream = cai.get("stream") if isinstance(cai, dict) else None
    if stream == 0:
        # CAI v3: 0 is ambiguous (legacy or per-thread default) and disallowed
        raise BufferError("__cuda_array_interface__: stream 0 is not allowed "
                          "(use 1 for the legacy or 2 for the per-thread default stream)")
    if nbytes == 0:
        return _Raw(obj, np.empty(0, np.uint8), fmt, device=True)
    if not dev_ptr:
        raise BufferError("__cuda_array_interface__: NULL data pointer with "
                          f"{nbytes} bytes")
    if _cai_is_host(dev_ptr):
        # a CAI pointer into host memory (no GPU here, or pinned/pageable host
        # memory): the bytes are read and written in place, as MPI would
        raw = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(dev_ptr), dtype=np.uint8)
        return _Raw(obj, raw, fmt)
    download, upload = _device_copier(obj, dev_ptr, nbytes, stream)
    return _Raw(obj, _staging(nbytes), fmt, device=True,
                download=download, upload=None if readonly else upload)


# -- device staging --------------------------------------------------------
#
# Device buffers (``__cuda_array_interface__``, DLPack on a CUDA or ROCm
# device) never reach the engine: each message gets a host staging area of
# the buffer's size, and only the bytes the message covers are copied.
#
# Ordering (stream-ordered semantics, as CUDA-aware MPIs define them):
#
# * When the call that names the buffer starts (Send/Isend/Recv/Irecv,
#   any collective, also its I-variant), the producer's stream is
#   synchronised before the device is read: the CAI ``stream`` field
#   (v3: 1 = legacy default, 2 = per-thread default, else a ``cudaStream_t``;
#   ``None`` = nothing to wait for), or, for DLPack, the stream CuPy hands
#   to ``__dlpack__(stream=...)``.  Work queued on that stream *before* the
#   call is therefore seen; work queued after it is not.
# * Sends copy the message's bytes device -> host once, in that call: the
#   device buffer may be reused as soon as the call returns (even for Isend).
# * Receives copy the message's bytes device -> host in that call too (so
#   that bytes a short message does not write keep their device contents),
#   receive into the host area, and copy it host -> device when the
#   operation completes: inside a blocking call, or in the Wait/Test that
#   completes the request (for a nonblocking collective, in its progress
#   thread before Wait returns).  The upload is synchronous: when that call
#   returns the data is on the device, visible to work on any stream.
# * The device range a pending receive covers must not be touched until
#   completion (as in MPI); a receive request that is freed instead of
#   completed never copies back.
#
# The device is chosen by the pointer (CuPy and the CUDA runtime query its
# attributes; Numba copies through unified addressing in the current
# context).  Staging uses CuPy, else Numba (not its simulator, whose arrays
# are host memory exported as CPU DLPack), else ``libcudart`` via ctypes.
# Host areas from _PIN_MIN on are pinned: CuPy's pool, else _pinned.py's.


# staging areas from this size on are pinned (below it a plain array costs less
# than a trip to the pool)
_PIN_MIN = 64 * 1024


def _staging(nbytes):
    """A host staging area of ``nbytes``: pinned memory from CuPy's pinned
    pool where CuPy is installed, else from erdmampi's own pool (the CUDA
    runtime or Numba pins it), else a plain array.  Pinned copies are one
    DMA, and a pool hands the pages back for the next message: no page
    faults each time."""
    global _CUPYX
    if nbytes >= _PIN_MIN:
        if _CUPYX is None:
            try:
                import cupyx  # noqa: PLC0415
                _CUPYX = cupyx
            except Exception:  # noqa: BLE001  (missing, or broken against this numpy)
                _CUPYX = False
        try:
            if _CUPYX is not False:
                return _CUPYX.empty_pinned((nbytes,), np.uint8)
            pool = _pinned.default_pool(_CudaRuntime.load, _numba_cuda)
            if pool is not None:
                return pool.take(nbytes)
        except Exception:  # noqa: BLE001  (no driver, pinning refused: a plain array)
            pass
    return np.empty(nbytes, np.uint8)


_CUPYX = None   # the cupyx module once imported; False: not installed


def _pointer_attributes():
    """Room for a ``cudaPointerAttributes``: {int type; int device; void *dptr,
    *hptr; ...}.  The runtime writes the whole struct of its own version
    (CUDA 12+ appends reserved words), so the buffer is far larger than the
    four fields read: a tight one gets its neighbours on the heap overwritten."""
    return (ctypes.c_int * 256)()


class _CudaRuntime:
    """The CUDA runtime through ctypes (no Python GPU package needed)."""

    _lib = None

    @classmethod
    def load(cls):
        if cls._lib is None:
            for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12",
                         "libcudart.so.11.0"):
                try:
                    lib = ctypes.CDLL(name)
                except OSError:
                    continue
                vp, sz, cint = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
                for fn, args in (("cudaMemcpy", [vp, vp, sz, cint]),
                                 ("cudaStreamSynchronize", [vp]),
                                 ("cudaPointerGetAttributes", [vp, vp]),
                                 ("cudaGetDevice", [ctypes.POINTER(cint)]),
                                 ("cudaSetDevice", [cint]),
                                 ("cudaRuntimeGetVersion", [ctypes.POINTER(cint)]),
                                 ("cudaGetDeviceCount", [ctypes.POINTER(cint)]),
                                 ("cudaGetLastError", [])):
                    getattr(lib, fn).argtypes = args
                    getattr(lib, fn).restype = cint
                lib.cudaGetErrorString.argtypes = [cint]
                lib.cudaGetErrorString.restype = ctypes.c_char_p
                cls._lib = lib
                break
            else:
                cls._lib = False
        return cls._lib or None

    @classmethod
    def check(cls, rc, what):
        if rc != 0:
            msg = cls._lib.cudaGetErrorString(rc)
            raise BufferError(f"{what} failed with error {rc}"
                              f"{': ' + msg.decode() if msg else ''}")

    @classmethod
    def device_of(cls, ptr):
        """Device ordinal owning ``ptr`` (None: unknown, host or managed)."""
        lib = cls._lib
        ver = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(ver)) != 0 or ver.value < 11000:
            return None  # cudaPointerAttributes has this layout from CUDA 11
        attrs = _pointer_attributes()
        if lib.cudaPointerGetAttributes(attrs, ptr) != 0:
            return None
        return attrs[1] if attrs[0] == 2 else None  # cudaMemoryTypeDevice

    @classmethod
    def is_host(cls, ptr):
        """True when ``ptr`` is plain host memory: no usable driver or device
        (then no pointer can be device memory), or the driver says so."""
        lib = cls.load()
        if lib is None:
            return True
        count = ctypes.c_int(0)
        if lib.cudaGetDeviceCount(ctypes.byref(count)) != 0 or count.value == 0:
            lib.cudaGetLastError()
            return True
        ver = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(ver)) != 0 or ver.value < 11000:
            return False
        attrs = _pointer_attributes()
        if lib.cudaPointerGetAttributes(attrs, ptr) != 0:
            lib.cudaGetLastError()
            return True   # memory the driver does not know: host
        return attrs[0] in (0, 1)   # cudaMemoryTypeUnregistered / Host

    @classmethod
    def copier(cls, dev_ptr, stream):
        lib = cls._lib
        device = cls.device_of(dev_ptr)

        def on_device(fn):
            if device is None:
                return fn()
            cur = ctypes.c_int(0)
            cls.check(lib.cudaGetDevice(ctypes.byref(cur)), "cudaGetDevice")
            if cur.value == device:
                return fn()
            cls.check(lib.cudaSetDevice(device), "cudaSetDevice")
            try:
                return fn()
            finally:
                lib.cudaSetDevice(cur.value)

        def download(host, start, stop):
            def run():
                if stream is not None:
                    cls.check(lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
                cls.check(lib.cudaMemcpy(host.ctypes.data + start, dev_ptr + start,
                                         stop - start, 4), "cudaMemcpy")  # Default
            on_device(run)

        def upload(host, start, stop):
            def run():
                cls.check(lib.cudaMemcpy(dev_ptr + start, host.ctypes.data + start,
                                         stop - start, 4), "cudaMemcpy")
                # pageable H2D may return before the DMA lands: wait for it
                cls.check(lib.cudaStreamSynchronize(1), "cudaStreamSynchronize")
            on_device(run)

        return download, upload


def _cupy_copier(cupy, flat, stream):
    """Copy functions over ``flat``, a 1-D ``uint8`` CuPy array."""
    dev = flat.device

    def download(host, start, stop):
        with dev:
            if stream is not None:
                cupy.cuda.ExternalStream(stream).synchronize()
            s = cupy.cuda.get_current_stream()
            flat[start:stop].get(stream=s, out=host[start:stop])
            s.synchronize()

    def upload(host, start, stop):
        with dev:
            s = cupy.cuda.get_current_stream()
            flat[start:stop].set(host[start:stop], stream=s)
            s.synchronize()

    return download, upload


def _numba_cuda():
    """``numba.cuda`` if it can reach a real GPU, else None."""
    try:
        from numba import cuda  # noqa: PLC0415
    except Exception:  # noqa: BLE001  (missing, or broken against this numpy)
        return None
    if not hasattr(cuda, "from_cuda_array_interface"):
        return None  # the CUDA simulator: no device memory to stage
    try:
        return cuda if cuda.is_available() else None
    except Exception:  # noqa: BLE001  (driver errors while probing)
        return None


def _numba_copier(cuda, obj, dev_ptr, stream):
    def view(start, stop):
        desc = {"shape": (stop - start,), "typestr": "|u1", "strides": None,
                "data": (dev_ptr + start, False), "version": 3}
        return cuda.from_cuda_array_interface(desc, owner=obj, sync=False)

    def download(host, start, stop):
        if stream is not None:
            cuda.external_stream(stream).synchronize()
        s = cuda.default_stream()
        view(start, stop).copy_to_host(host[start:stop], stream=s)
        s.synchronize()

    def upload(host, start, stop):
        s = cuda.default_stream()
        view(start, stop).copy_to_device(host[start:stop], stream=s)
        s.synchronize()

    return download, upload


def _cai_is_host(dev_ptr):
    """Whether a CAI pointer is host memory (see _CudaRuntime.is_host)."""
    if _CudaRuntime.load() is not None:
        return _CudaRuntime.is_host(dev_ptr)
    return _numba_cuda() is None   # no runtime, no driver: cannot be device memory


def _device_copier(obj, dev_ptr, nbytes, stream=None):
    """``(download, upload)`` for ``nbytes`` of device memory at ``dev_ptr``:
    CuPy, else Numba, else libcudart (see "device staging")."""
    try:
        import cupy  # noqa: PLC0415
    except ImportError:
        cupy = None
    if cupy is not None:
        try:
            # device_id -1: CuPy asks the driver which device owns dev_ptr
            mem = cupy.cuda.UnownedMemory(dev_ptr, nbytes, obj, -1)
            flat = cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0))
        except Exception as exc:  # noqa: BLE001  (CUDA errors: bad pointer, no GPU)
            raise BufferError(f"__cuda_array_interface__: CuPy cannot access "
                              f"device pointer {dev_ptr:#x}: {exc}") from exc
        return _cupy_copier(cupy, flat, stream)
    cuda = _numba_cuda()
    if cuda is not None:
        return _numba_copier(cuda, obj, dev_ptr, stream)
    if _CudaRuntime.load() is not None:
        return _CudaRuntime.copier(dev_ptr, stream)
    raise BufferError(
        "__cuda_array_interface__: staging a device buffer through host "
        "memory needs CuPy, Numba (with a GPU) or the CUDA runtime (libcudart)")


def _from_dlpack_device(obj, readonly, device_type, device_id):
    """Stage a DLPack buffer on a CUDA/ROCm device; refuse other devices."""
    name = _DL_DEVICE_NAMES.get(device_type, "unknown")
    if device_type not in _DL_STAGED:
        raise BufferError(
            f"dlpack: buffer on device type {device_type} ({name}) is not "
            f"supported: only CPU memory, and CUDA or ROCm memory staged "
            f"through the host, can be communicated")
    # __dlpack__(stream=-1), as mpi4py asks: no stream ordering, the caller
    # has synchronised the producer's work (as with CUDA-aware MPI)
    view = _dlpack.read(obj, readonly)
    if view.nbytes and not view.addr:
        raise BufferError(f"dlpack: NULL data pointer with {view.nbytes} bytes")
    # pinned host memory, or any pointer when no driver could have made
    # device memory (or the driver says host): read in place, as MPI would
    if device_type in (3, 11) or not view.nbytes or _cai_is_host(view.addr):
        return _dlpack_host(obj, view)
    if device_type in (2, 13):
        # staged from the capsule's pointer with CuPy, Numba or libcudart;
        # the format comes from the DLPack dtype (bfloat16 included, which
        # has no __cuda_array_interface__ typestr)
        keep = (obj, view.capsule)
        download, upload = _device_copier(keep, view.addr, view.nbytes)
        return _Raw(keep, _staging(view.nbytes), _view_format(view), device=True,
                    download=download, upload=None if readonly else upload)
    try:
        import cupy  # noqa: PLC0415
    except ImportError:
        raise BufferError(
            f"dlpack: buffer on device type {device_type} ({name}) needs CuPy "
            f"for staging through host memory") from None
    with cupy.cuda.Device(device_id):
        # from_dlpack passes our current stream to __dlpack__(stream=...):
        # the producer orders its pending work before it
        darr = cupy.from_dlpack(obj)
    if not (darr.flags.c_contiguous or darr.flags.f_contiguous):
        raise BufferError("dlpack: buffer is not contiguous")
    fmt = _view_format(view)
    if darr.nbytes == 0:
        return _Raw(obj, np.empty(0, np.uint8), fmt, device=True)
    flat = cupy.ndarray((darr.nbytes,), cupy.uint8, darr.data)
    download, upload = _cupy_copier(cupy, flat, None)
    return _Raw((obj, darr), _staging(darr.nbytes), fmt, device=True,
                download=download, upload=None if readonly else upload)


def _device_memory(obj, path, readonly):
    """``(keep, address, nbytes)`` when ``obj`` exports, through ``path``,
    non-empty memory that the CUDA driver says is device memory; else None.
    Nothing is staged: this only describes."""
    if path is _from_dlpack:
        try:
            device_type = int(obj.__dlpack_device__()[0])
            obj.__dlpack__  # noqa: B018
        except AttributeError:
            raise NotImplementedError("dlpack: missing support") from None
        if device_type in _CPU_DEVICES or device_type in (3, 11):
            return None
        view = _dlpack.read(obj, readonly)
        if view.nbytes and view.addr and not _cai_is_host(view.addr):
            return (obj, view.capsule), view.addr, view.nbytes
        return None
    try:
        obj.__cuda_array_interface__  # noqa: B018
    except AttributeError:
        raise NotImplementedError("missing CUDA array interface") from None
    dev_ptr, nbytes, _ = _cai_describe(obj, readonly)
    if nbytes and dev_ptr and not _cai_is_host(dev_ptr):
        return obj, dev_ptr, nbytes
    return None


def export_for_membuf(obj, writable):
    """(owner, address, nbytes, readonly, device) of a DLPack or CAI exporter in host
    memory, for ``MPI.buffer(obj)`` (ext/python/membuf.c); NotImplementedError
    when ``obj`` exports neither."""
    for path in (_from_dlpack, _from_cai):
        try:
            try:
                readonly = False
                dev = _device_memory(obj, path, readonly)
                raw = None if dev else path(obj, readonly)
            except BufferError:
                if writable:
                    raise
                readonly = True
                dev = _device_memory(obj, path, readonly)
                raw = None if dev else path(obj, readonly)
        except NotImplementedError:
            continue
        if dev:
            # device memory: the buffer holds its address, and the CPU never
            # touches it through MPI.buffer (cast, indexing, tobytes refuse)
            return dev[0], dev[1], dev[2], readonly, True
        arr = raw.raw
        # a device exporter's memory (here host memory without a GPU) is
        # still not for the CPU to touch through MPI.buffer, as in mpi4py
        device = path is _from_cai or int(obj.__dlpack_device__()[0]) not in _CPU_DEVICES
        return raw, (arr.ctypes.data if arr.size else 0), arr.nbytes, readonly, device
    raise NotImplementedError("no DLPack or CUDA array interface")


def getbuffer(obj, readonly):
    """Export ``obj`` as contiguous bytes (mpi4py's PyMPI_GetBuffer order:
    buffer protocol, then DLPack, then CUDA array interface)."""
    try:
        raw, fmt = _from_buffer_protocol(obj, readonly)
        return _Raw(obj, raw, fmt)
    except (TypeError, BufferError, ValueError) as exc:
        first = exc
    try:
        for path in (_from_dlpack, _from_cai):
            try:
                return path(obj, readonly)
            except NotImplementedError:
                continue
        raise first
    finally:
        # the kept exception's traceback holds this frame: a cycle that would
        # keep ``obj`` alive until a garbage collection
        first = None


# -----------------------------------------------------------------------------
# Messages


class BufMsg:
    """One resolved message buffer.

    ``addr``/``nbytes``: host address and byte length of the whole message
    (``blocks`` blocks of ``count`` items each for block collectives, one
    block otherwise); ``array``: 1-D view of exactly those bytes with
    ``datatype.np_dtype`` (``uint8`` when the datatype has none);
    ``obj``: keep-alive reference; ``device``: the user buffer is device
    memory and ``array`` is its host staging copy.
    """

    __slots__ = ("obj", "addr", "nbytes", "count", "datatype", "array",
                 "device", "blocks", "_raw", "_offset", "_unpack")

    def __init__(self, obj, raw, offset, nbytes, count, datatype, array, blocks=1):
        self._unpack = None
        self.obj = obj
        self.blocks = blocks
        self._raw = raw
        self._offset = offset
        self.nbytes = nbytes
        self.count = count
        self.datatype = datatype
        self.array = array
        self.device = bool(raw is not None and raw.device)
        if raw is None or raw.raw.size == 0:
            self.addr = 0
        else:
            self.addr = raw.raw.ctypes.data + offset
        if self.device:
            # sends and receives alike start from the device contents
            raw.stage_in(offset, offset + nbytes)

    @classmethod
    def _plain(cls, arr, datatype):
        """The whole of a plain host array (see :func:`plain_datatype`)."""
        msg = cls.__new__(cls)
        msg.obj = arr
        msg.blocks = 1
        msg._raw = None
        msg._offset = 0
        msg.nbytes = arr.nbytes
        msg.count = arr.size
        msg.datatype = datatype
        msg.array = arr.reshape(-1)
        msg.device = False
        msg.addr = arr.ctypes.data
        msg._unpack = None
        return msg

    def finish(self):
        """After a receive completes: copy the message's bytes from the host
        staging area back to the device (synchronously; no-op for host
        buffers), or unpack a derived datatype's temporary into the user
        buffer.  Every completed receive path must call it once."""
        if self._unpack is not None:
            self._unpack()
        elif self.device:
            self._raw.stage_out(self._offset, self._offset + self.nbytes)

    def __repr__(self):
        return (f"<BufMsg addr={self.addr:#x} nbytes={self.nbytes} "
                f"count={self.count} datatype={self.datatype.Get_name()!r}"
                f"{' device' if self.device else ''}>")


def _array_view(raw_bytes, datatype, nitems):
    """1-D view of ``nitems`` datatype items over ``raw_bytes``."""
    dtype = datatype.np_dtype
    if dtype is None:
        return raw_bytes
    nelem = datatype._elements(nitems)
    span = nelem * dtype.itemsize
    return raw_bytes[:span].view(dtype) if span else np.empty(0, dtype)


def _extent(datatype, what):
    if datatype == DATATYPE_NULL:
        raise ValueError(f"message: cannot {what}, datatype is null")
    lb, extent = datatype.Get_extent()
    if extent <= 0:
        raise ValueError(
            f"message: cannot {what}, datatype extent {extent} "
            f"(lb:{lb}, ub:{lb + extent})")
    return extent


def _entries(length, datatype, extent):
    """The count inferred from a buffer of ``length`` bytes: whole entries."""
    if length % extent:
        lb = datatype.Get_extent()[0]
        raise ValueError(
            f"message: cannot infer count, buffer length {length} "
            f"is not a multiple of datatype extent {extent} "
            f"(lb:{lb}, ub:{lb + extent})")
    return length // extent


_BOTTOM_COUNT = "message: BOTTOM with a nonzero count (absolute addresses) is not supported"


def _unpack(msg, vector=False):
    """Split a spec into (buf, count(s), displ(s), type) like mpi4py."""
    o_count = o_displ = o_type = None
    if isinstance(msg, (list, tuple)):
        nargs = len(msg)
        if nargs == 2:
            o_buf, o_count = msg
            if isinstance(o_count, (Datatype, str)):
                o_count, o_type = None, o_count
            elif isinstance(o_count, tuple) or (not vector and isinstance(o_count, list)):
                o_count, o_displ = o_count
        elif nargs == 3:
            o_buf, o_count, o_type = msg
            if isinstance(o_count, tuple) or (not vector and isinstance(o_count, list)):
                o_count, o_displ = o_count
        elif nargs == 4:
            o_buf, o_count, o_displ, o_type = msg
        else:
            raise ValueError("message: expecting 2 to 4 items")
        return o_buf, o_count, o_displ, o_type
    if _has_buffer(msg) or hasattr(msg, "__dlpack__") or hasattr(msg, "__cuda_array_interface__"):
        return msg, None, None, None
    raise TypeError("message: expecting buffer or list/tuple")


def _has_buffer(obj):
    if isinstance(obj, (bytes, bytearray, memoryview, np.ndarray, _Sentinel)):
        return True
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    except (BufferError, ValueError):
        return True
    return True


def _basic(o_buf, o_type, readonly):
    """(raw or None, datatype) for the buffer part of a message."""
    if is_bottom(o_buf):
        return None, asdatatype(o_type)
    if isinstance(o_buf, _Sentinel):
        raise TypeError(f"message: {o_buf!r} is not a valid buffer here")
    raw = getbuffer(o_buf, readonly)
    if o_type is not None:
        datatype = asdatatype(o_type)
    elif raw.fmt is None:
        datatype = PREDEFINED["BYTE"]
    elif raw.fmt == _bf16.FORMAT:
        datatype = _bf16.datatype()
    else:
        datatype = from_format(raw.fmt)
    return raw, datatype


def _message_simple(msg, readonly, blocks):
    o_buf, o_count, o_displ, o_type = _unpack(msg)
    raw, datatype = _basic(o_buf, o_type, readonly)
    length = 0 if raw is None else raw.raw.size
    extent = 0
    offset = 0
    displ = 0
    if o_displ is not None:
        displ = operator.index(o_displ)
        if displ < 0:
            raise ValueError(f"message: negative displacement {displ}")
        if displ > 0:
            extent = _extent(datatype, "handle displacement")
            if displ * extent > length:
                raise ValueError(
                    f"message: displacement {displ} out of bounds, "
                    f"number of datatype entries {length // extent}")
            offset = displ * extent
            length -= offset
    count = 0
    if o_count is not None:
        count = operator.index(o_count)
        if count < 0:
            raise ValueError(f"message: negative count {count}")
        if count > 0 and o_buf is None:
            raise ValueError(f"message: buffer is None but count is {count}")
        if count > 0 and raw is None:
            if datatype._packs():   # a derived type of absolute addresses
                return _packed_message(o_buf, None, 0, count, max(blocks, 1), datatype,
                                       readonly)
            raise ValueError(_BOTTOM_COUNT)
    elif length > 0:
        if extent == 0:
            extent = _extent(datatype, "infer count")
        entries = _entries(length, datatype, extent)
        if blocks < 2:
            count = entries
        else:
            if entries % blocks:
                raise ValueError(
                    f"message: cannot infer count, number of entries "
                    f"{entries} is not a multiple of required "
                    f"number of blocks {blocks}")
            count = entries // blocks
    nblocks = blocks if blocks >= 2 else 1
    total = count * nblocks
    nbytes = 0
    if total > 0:
        if extent == 0:
            extent = _extent(datatype, "compute message size")
        nbytes = total * extent
        if nbytes > length:
            raise ValueError(
                f"message: count {count}"
                f"{f' x {nblocks} blocks' if nblocks > 1 else ''} out of bounds, "
                f"number of datatype entries {length // extent}")
    if total > 0 and datatype._packs():
        return _packed_message(o_buf, raw, offset, count, nblocks, datatype, readonly)
    raw_bytes = np.empty(0, np.uint8) if raw is None else raw.raw
    array = _array_view(raw_bytes[offset:offset + nbytes], datatype, total)
    return BufMsg(o_buf, raw, offset, nbytes, count, datatype, array, nblocks)


# -- derived datatypes with gaps ----------------------------------------------
#
# A message whose datatype does not lie in memory as it packs (a vector, a
# subarray, a struct with holes...) travels packed: the message is a
# temporary holding the packed items, described by ``datatype._wire()`` (the
# contiguous type of those bytes: same element dtype and count for the
# reductions).  Sends pack when the message is parsed; receives pack too (so
# the bytes a short message leaves alone keep their values) and unpack into
# the user buffer in ``finish()``.


def _packed_message(o_buf, raw, offset, count, nblocks, datatype, readonly):
    if not datatype._is_committed():
        from . import exceptions as _exc
        raise _exc.Exception(_exc.ERR_TYPE, "datatype has not been committed")
    total = count * nblocks
    ext = datatype._extent
    lo = offset + datatype._tlb + min(0, (total - 1) * ext)
    hi = offset + datatype._tlb + datatype._textent + max(0, (total - 1) * ext)
    if raw is None:
        # BOTTOM: the type map holds absolute addresses
        if lo <= 0:
            raise ValueError(_BOTTOM_COUNT)
        span = (ctypes.c_uint8 * (hi - lo)).from_address(lo)
        raw = _Raw(span, np.frombuffer(span, np.uint8), None)
        offset, lo, hi = -lo, 0, hi - lo
    rawbytes = raw.raw
    if lo < 0 or hi > rawbytes.size:
        raise ValueError(
            f"message: {total} datatype entries at byte {offset} reach bytes "
            f"[{lo}, {hi}), buffer has {rawbytes.size}")
    if raw.device:
        raw.stage_in(lo, hi)
    wire = datatype._wiretype
    if wire is None:
        wire = datatype._wire()
    layout = datatype._get_layout()
    size = total * datatype._size
    # sends and receives alike start from the packed user bytes (a short
    # receive then leaves the rest of the buffer as it was)
    tmp, addr = _tm.pack_new(layout, total, ext, rawbytes, offset, size)
    npd = wire.np_dtype
    array = tmp.view(npd) if npd is not None and size % npd.itemsize == 0 else tmp
    msg = BufMsg.__new__(BufMsg)
    msg.obj = o_buf
    msg.blocks = nblocks
    msg._raw = raw      # keep-alive of the user buffer
    msg._offset = 0
    msg.nbytes = size
    msg.count = count
    msg.datatype = wire
    msg.array = array
    msg.device = False
    msg.addr = addr
    msg._unpack = None if readonly else _Unpacker(layout, total, ext, tmp, raw, offset, lo, hi)
    return msg


# ``[array, count, datatype]`` with ``array`` an exact C-contiguous
# ``numpy.ndarray`` (writable unless sent) and ``datatype`` a committed type
# that packs: the same message as above without the generic parse.  What a
# datatype needs is looked up once (by identity, checked against its record,
# which Free replaces); anything unusual (bounds, flags, count) goes the
# generic way, which raises the right error.
_PACKED_TYPES = {}        # id(datatype) -> (datatype, record, layout, wire, npd, ext, lo, hi, size)
_PACKED_TYPES_MAX = 256
_operator_index = operator.index


def _packed_type(dt):
    ent = _PACKED_TYPES.get(id(dt))
    if ent is not None and ent[0] is dt and ent[1] is dt._r:
        return ent
    if not isinstance(dt, Datatype) or not dt._is_committed() or not dt._packs():
        return None
    if len(_PACKED_TYPES) >= _PACKED_TYPES_MAX:
        _PACKED_TYPES.clear()
    wire = dt._wire()
    ent = (dt, dt._r, dt._get_layout(), wire, wire.np_dtype, dt._extent, dt._tlb,
           dt._tlb + dt._textent, dt._size)
    _PACKED_TYPES[id(dt)] = ent
    return ent


def packed_spec(spec, readonly):
    """The :class:`BufMsg` of a ``[array, count, datatype]`` spec of the shape
    above, else ``None``.  ``spec`` must be an exact 3-item list or tuple."""
    arr, count, dt = spec
    if type(arr) is not _ndarray or type(count) is not int or count <= 0:
        return None
    ent = _packed_type(dt)
    if ent is None or not dt._is_committed():
        return None
    flags = arr.flags
    if not flags.c_contiguous or not (readonly or flags.writeable):
        return None
    _, _, layout, wire, npd, ext, tlb, tub, isize = ent
    length = arr.nbytes
    lo = tlb + min(0, (count - 1) * ext)
    hi = tub + max(0, (count - 1) * ext)
    if count * ext > length or lo < 0 or hi > length:
        return None
    size = count * isize
    tmp, addr = _tm.pack_new(layout, count, ext, arr, 0, size)
    msg = BufMsg.__new__(BufMsg)
    msg.obj = arr
    msg.blocks = 1
    msg._raw = None
    msg._offset = 0
    msg.nbytes = size
    msg.count = count
    msg.datatype = wire
    msg.array = tmp.view(npd) if npd is not None and size % npd.itemsize == 0 else tmp
    msg.device = False
    msg.addr = addr
    msg._unpack = None if readonly else _ArrayUnpacker(layout, count, ext, tmp, arr)
    return msg


class _ArrayUnpacker:
    """:func:`packed_spec`'s receive ``finish()``: into the array."""

    __slots__ = ("layout", "count", "extent", "tmp", "arr")

    def __init__(self, layout, count, extent, tmp, arr):
        self.layout, self.count, self.extent, self.tmp, self.arr = layout, count, extent, tmp, arr

    def __call__(self):
        if self.tmp.size:
            _tm.unpack_array(self.layout, self.count, self.extent, self.tmp, self.arr)


class _Unpacker:
    """A packed receive's ``finish()``: scatter the temporary into the user
    buffer (and on to the device)."""

    __slots__ = ("layout", "count", "extent", "tmp", "raw", "offset", "lo", "hi")

    def __init__(self, layout, count, extent, tmp, raw, offset, lo, hi):
        self.layout, self.count, self.extent, self.tmp = layout, count, extent, tmp
        self.raw, self.offset, self.lo, self.hi = raw, offset, lo, hi

    def __call__(self):
        raw = self.raw
        if self.tmp.size:
            _tm.unpack(self.layout, self.count, self.extent, self.tmp, 0, raw.raw,
                       self.offset)
        if raw.device:
            raw.stage_out(self.lo, self.hi)


# -- fast path: a plain NumPy array -------------------------------------------
#
# ``buf`` alone, an exact ``numpy.ndarray`` (no subclass), C-contiguous,
# non-empty, writable unless sent: the parser above would export all of its
# bytes and pick ``from_format(format)`` for its dtype.  The datatype of such
# a dtype is learnt from the parser's first answer and cached (by dtype object
# identity: ``np.dtype('q') == np.dtype('l')`` although their formats differ),
# only where it is a committed datatype of exactly one element of the dtype.

_ndarray = np.ndarray
_ND_TYPES = {}        # id(dtype) -> (dtype, Datatype)
_ND_TYPES_MAX = 64


def plain_datatype(arr, readonly):
    """The datatype ``message_p2p(arr, readonly)`` resolves to when ``arr`` is
    a plain array that message covers whole (see above), else ``None``
    (``arr`` must be an exact ``numpy.ndarray``).  Never raises."""
    flags = arr.flags
    if not flags.c_contiguous or not (readonly or flags.writeable) or not arr.size:
        return None
    dt = arr.dtype
    ent = _ND_TYPES.get(id(dt))
    if ent is not None and ent[0] is dt:
        return ent[1]
    if dt.isbuiltin == 1 and dt.isnative and len(_ND_TYPES) < _ND_TYPES_MAX:
        # first sight of this dtype: let the parser resolve (and cache) it
        try:
            _learn_plain(arr, _message_simple(arr, readonly, 1))
        except Exception:
            return None     # whoever parses it for real reports the problem
        ent = _ND_TYPES.get(id(dt))
        if ent is not None and ent[0] is dt:
            return ent[1]
    return None


# ``[buf, datatype]`` with ``buf`` an exact, C-contiguous, non-empty
# ``numpy.ndarray`` and ``datatype`` a predefined datatype without gaps
# (size == extent, lb 0): the parser would send or fill all of ``buf``'s
# bytes whenever they are a whole number of entries (it raises otherwise, so
# that case is left to it).  Keyed by datatype identity.
_SPEC_TYPES = {id(dt): (dt, dt._extent) for dt in PREDEFINED.values()
               if dt is not DATATYPE_NULL and dt._size > 0 and dt._size == dt._extent
               and dt._lb == 0}


def plain_spec(spec, readonly):
    """The array of a ``[array, datatype]`` spec that covers all of the
    array's bytes (see above), else ``None``.  ``spec`` must be an exact list
    or tuple.  Never raises."""
    if len(spec) != 2:
        return None
    arr, dt = spec
    if type(arr) is not _ndarray:
        return None
    ent = _SPEC_TYPES.get(id(dt))
    if ent is None or ent[0] is not dt:
        return None
    flags = arr.flags
    n = arr.nbytes
    if not flags.c_contiguous or not (readonly or flags.writeable) or not n or n % ent[1]:
        return None
    return arr


def plain_size(dt):
    """Bytes of one element of a datatype plain_spec accepts."""
    return _SPEC_TYPES[id(dt)][1]


def plain_counted(spec, readonly):
    """The array of an ``[array, count, datatype]`` spec (an exact list or
    tuple) whose count covers the whole array, as ``[array, datatype]``
    would (see plain_spec), else ``None``.  Never raises."""
    if len(spec) != 3:
        return None
    arr, count, dt = spec
    if type(count) is not int or count <= 0:
        return None
    arr = plain_spec((arr, dt), readonly)
    return arr if arr is not None and count * plain_size(dt) == arr.nbytes else None


def _learn_plain(arr, msg):
    """Cache ``msg.datatype`` for ``arr.dtype`` if it fits the fast path."""
    dt = arr.dtype
    datatype = msg.datatype
    if (len(_ND_TYPES) < _ND_TYPES_MAX and dt.isbuiltin == 1 and dt.isnative
            and datatype.np_dtype == dt and datatype._elements(1) == 1
            and datatype.Get_extent() == (0, dt.itemsize) and datatype._is_committed()
            and msg.nbytes == arr.nbytes):
        _ND_TYPES[id(dt)] = (dt, datatype)


def message_p2p(spec, readonly):
    """Resolve a point-to-point message spec (``readonly``: a send buffer)."""
    t = type(spec)
    if t is _ndarray:
        datatype = plain_datatype(spec, readonly)
        if datatype is not None:
            return BufMsg._plain(spec, datatype)
        return _message_simple(spec, readonly, 1)
    if (t is list or t is tuple) and len(spec) == 3:
        msg = packed_spec(spec, readonly)
        if msg is not None:
            return msg
    return _message_simple(spec, readonly, 1)


def message_cco(spec, readonly, blocks):
    """Resolve a block collective message spec.

    ``count`` is the per-block count: given explicitly, or (like mpi4py) the
    buffer length divided by ``blocks`` when ``blocks >= 2``, the whole
    buffer otherwise.  ``msg.blocks == max(blocks, 1)``; ``nbytes`` and
    ``array`` cover all blocks (block ``i`` is
    ``array.reshape(blocks, -1)[i]``).  Buffers MPI ignores (the receive
    buffer of Gather at a non-root...) should not be parsed at all, as
    mpi4py skips them.
    """
    return _message_simple(spec, readonly, blocks)


def _int_list(seq, n, what):
    values = [operator.index(x) for x in seq]
    if len(values) != n:
        raise ValueError(f"expecting {n} items, got {len(values)}")
    return values


def message_vector(spec, readonly, size):
    """Resolve a vector collective message spec for ``size`` blocks.

    Returns ``(msg, counts, displs)``: ``msg.array`` views the whole buffer
    as items of ``msg.datatype``; block ``i`` is
    ``msg.array[displs[i]:displs[i] + counts[i]]`` (in items, times
    ``datatype._mult`` elements for contiguous derived types).
    """
    o_buf, o_counts, o_displs, o_type = _unpack(spec, vector=True)
    raw, datatype = _basic(o_buf, o_type, readonly)
    bsize = 0 if raw is None else raw.raw.size
    extent = None
    if o_counts is None:
        csize = 0
        if bsize > 0:
            extent = _extent(datatype, "infer count")
            csize = _entries(bsize, datatype, extent)
        counts = [csize // size + (csize % size > i) for i in range(size)]
    elif _is_integral(o_counts):
        counts = [operator.index(o_counts)] * size
    else:
        counts = _int_list(o_counts, size, "counts")
    if o_displs is None:
        displs, acc = [], 0
        for c in counts:
            displs.append(acc)
            acc += c
    elif _is_integral(o_displs):
        stride = operator.index(o_displs)
        displs = [stride * i for i in range(size)]
    else:
        displs = _int_list(o_displs, size, "displs")
    for c in counts:
        if c < 0:
            raise ValueError(f"message: negative count {c}")
    for d in displs:
        if d < 0:
            raise ValueError(f"message: negative displacement {d}")
    nitems = 0
    if raw is not None and bsize:
        if extent is None and datatype != DATATYPE_NULL and datatype.Get_extent()[1] > 0:
            extent = datatype.Get_extent()[1]
        nitems = bsize // extent if extent else 0
    need = max((d + c for c, d in zip(counts, displs) if c > 0), default=0)
    if need > 0 and raw is None and o_buf is not None and datatype._packs():
        return _packed_message(o_buf, None, 0, need, 1, datatype, readonly), counts, displs
    if need > 0:
        if raw is None:
            if o_buf is None:
                raise ValueError(f"message: buffer is None but count is {max(counts)}")
            raise ValueError(_BOTTOM_COUNT)
        if extent is None:
            extent = _extent(datatype, "compute message size")
            nitems = bsize // extent
        if need > nitems:
            raise ValueError(
                f"message: counts and displacements need {need} datatype "
                f"entries, buffer has {nitems}")
    if need > 0 and datatype._packs():
        # block i is packed items displs[i]:displs[i] + counts[i] of the temporary
        return _packed_message(o_buf, raw, 0, need, 1, datatype, readonly), counts, displs
    raw_bytes = np.empty(0, np.uint8) if raw is None else raw.raw
    array = _array_view(raw_bytes[: nitems * (extent or 0)], datatype, nitems)
    msg = BufMsg(o_buf, raw, 0, nitems * (extent or 0), nitems, datatype, array)
    return msg, counts, displs


def type_mismatch(smsg, rmsg):
    """mpi4py's message, naming the two datatypes (e.g. a float32 array sent
    into a float64 one)."""
    def name(t):
        try:
            return t.Get_name() or "a derived datatype"
        except Exception:
            return "a derived datatype"
    return ValueError(f"mismatch in send and receive MPI datatypes (send {name(smsg.datatype)}"
                      f", receive {name(rmsg.datatype)})")
