"""DLPack consumer: read a producer's capsule as mpi4py's Py_GetDLPackBuffer does.

The capsule is *not* consumed: it is kept alive beside the exported bytes and
never renamed, so the producer's own capsule destructor releases the tensor
(calls its deleter once) when the last reference goes.  Consuming it instead
(renaming to ``used_dltensor`` and calling the deleter ourselves) would race
the producer's destructor, which may free the managed tensor first.

``read(obj, readonly)`` returns a :class:`View`: data address, byte size,
item size, mpi4py's format string, the read-only flag and the DLPack device.
"""

import ctypes

__all__ = ["View", "read", "DL_CPU"]

DL_CPU = 1
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat, _kDLComplex, _kDLBool = 0, 1, 2, 4, 5, 6
_FLAG_READ_ONLY = 1 << 0


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_uint), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


_api = ctypes.pythonapi
_IsValid = _api.PyCapsule_IsValid
_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_IsValid.restype = ctypes.c_int
_GetPointer = _api.PyCapsule_GetPointer
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_GetPointer.restype = ctypes.c_void_p


class View:
    """What one exported DLPack tensor describes (host address space or device)."""

    __slots__ = ("capsule", "addr", "nbytes", "itemsize", "fmt", "readonly",
                 "device_type", "device_id", "dtype_code", "dtype_bits")

    def __init__(self, **kw):
        for k, v in kw.items():
            setattr(self, k, v)


def _is_contig(t, order):
    ndim = t.ndim
    if not t.strides:
        return order != "F" or ndim <= 1
    size = 1
    idx = range(ndim) if order == "F" else range(ndim - 1, -1, -1)
    for i in idx:
        dim = t.shape[i]
        if dim > 1 and size != t.strides[i]:
            return False
        size *= dim
    return True


def _check_shape(t):
    if t.ndim < 0:
        raise BufferError("dlpack: number of dimensions is negative")
    if t.ndim > 0 and not t.shape:
        raise BufferError("dlpack: shape is NULL")
    for i in range(t.ndim):
        if t.shape[i] < 0:
            raise BufferError("dlpack: shape item is negative")
    if t.strides:
        for i in range(t.ndim):
            if t.strides[i] < 0:
                raise BufferError("dlpack: strides item is negative")


_INT_FMT = {8: "b", 16: "h", 32: "i", 64: "l"}
_UINT_FMT = {8: "B", 16: "H", 32: "I", 64: "L"}
_FLOAT_FMT = {16: "e", 32: "f", 64: "d", 128: "g"}
_COMPLEX_FMT = {32: "Ze", 64: "Zf", 128: "Zd", 256: "Zg"}


def _format(code, bits, lanes):
    """(format, itemsize) as mpi4py's dlpack_get_format/itemsize; None = bytes."""
    if lanes != 1:
        if code == _kDLFloat and lanes == 2 and bits in (32, 64, 128):
            return {32: "Zf", 64: "Zd", 128: "Zg"}[bits], bits // 8 * 2
        return None, 1
    fmt = None
    if code == _kDLBool and bits == 8:
        fmt = "?"
    elif code == _kDLInt:
        fmt = _INT_FMT.get(bits)
    elif code == _kDLUInt:
        fmt = _UINT_FMT.get(bits)
    elif code == _kDLFloat:
        fmt = _FLOAT_FMT.get(bits)
    elif code == _kDLComplex:
        fmt = _COMPLEX_FMT.get(bits)
    return fmt, (bits + 7) // 8


def read(obj, readonly):
    """Describe ``obj``'s DLPack export; NotImplementedError without DLPack."""
    try:
        dlpack = obj.__dlpack__
        dlpack_device = obj.__dlpack_device__
    except AttributeError:
        raise NotImplementedError("dlpack: missing support") from None
    device_type, device_id = dlpack_device()
    device_type, device_id = int(device_type), int(device_id)
    name = b"dltensor_versioned"
    try:   # DLPack 1.x
        if device_type == DL_CPU:
            capsule = dlpack(max_version=(1, 0), copy=False)
        else:
            capsule = dlpack(stream=-1, max_version=(1, 0), copy=False)
        versioned = True
    except TypeError:   # DLPack 0.x
        versioned, name = False, b"dltensor"
        capsule = dlpack() if device_type == DL_CPU else dlpack(stream=-1)
    try:
        valid = _IsValid(capsule, name)
    except ctypes.ArgumentError:
        valid = 0
    if not valid:
        raise BufferError("dlpack: invalid capsule object")
    pointer = _GetPointer(capsule, name)
    if versioned:
        managed = _DLManagedTensorVersioned.from_address(pointer)
        if managed.version.major < 1:
            raise BufferError("dlpack: unexpected version")
        tensor = managed.dl_tensor
        is_readonly = bool(managed.flags & _FLAG_READ_ONLY)
    else:
        tensor = _DLManagedTensor.from_address(pointer).dl_tensor
        is_readonly = False
    _check_shape(tensor)
    if not (_is_contig(tensor, "C") or _is_contig(tensor, "F")):
        raise BufferError("dlpack: buffer is not contiguous")
    if is_readonly and not readonly:
        raise BufferError("dlpack: buffer is not writable")
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    count = 1
    for i in range(tensor.ndim):
        count *= tensor.shape[i]
    nbytes = count * ((bits * lanes + 7) // 8)
    fmt, itemsize = _format(code, bits, lanes)
    return View(capsule=capsule, addr=(tensor.data or 0) + tensor.byte_offset,
                nbytes=nbytes, itemsize=itemsize, fmt=fmt, readonly=is_readonly,
                device_type=device_type, device_id=device_id,
                dtype_code=code, dtype_bits=bits)
