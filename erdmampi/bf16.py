"""bfloat16 elements (torch's bf16 tensors arriving through DLPack).

MPICH 4.0 has no bfloat16 type (``MPI.BFLOAT16`` is ``DATATYPE_NULL``, as
in mpi4py), and mpi4py treats such a DLPack tensor as bytes.  erdmampi keeps
that for data movement and gives the buffer a 2-byte element type of its own
so that reductions work: SUM, PROD, MAX and MIN compute in float32 and round
back to bfloat16 (round to nearest even, NaN kept NaN), as torch does.
"""

import numpy as np

__all__ = ["FORMAT", "DTYPE", "datatype", "reduce", "to_float32", "from_float32"]

FORMAT = "<bf16>"                     # buffers' format marker for a bf16 export
DTYPE = np.dtype([("bf16", "<u2")])   # reduce dtype marker: no C reducer knows it
_OPS = {"SUM": np.add, "PROD": np.multiply, "MAX": np.maximum, "MIN": np.minimum}
_type = None


def to_float32(u16):
    """float32 values of bf16 bit patterns (a uint16 array)."""
    return (u16.astype(np.uint32) << 16).view(np.float32)


def from_float32(f32):
    """bf16 bit patterns (uint16) of float32 values, rounded to nearest even."""
    bits = np.ascontiguousarray(f32, dtype=np.float32).view(np.uint32)
    rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) >> 16
    nan = np.isnan(f32)
    out = rounded.astype(np.uint16)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)   # quiet NaN
    return out


def reduce(opname, inarr, inoutarr):
    """``inoutarr = inarr OP inoutarr`` on bf16 bit patterns (uint16 views)."""
    fn = _OPS.get(opname)
    if fn is None:
        return False
    a = np.frombuffer(inarr, dtype=np.uint16) if not isinstance(inarr, np.ndarray) \
        else inarr.view(np.uint16)
    io = inoutarr.view(np.uint16) if isinstance(inoutarr, np.ndarray) \
        else np.frombuffer(inoutarr, dtype=np.uint16)
    res = fn(to_float32(a.reshape(-1)), to_float32(io.reshape(-1)))
    io.reshape(-1)[:] = from_float32(res)
    return True


def datatype():
    """The erdmampi datatype of bf16 elements (made on first use)."""
    global _type
    if _type is None:
        from .datatype import PREDEFINED, Datatype
        proto = PREDEFINED["UINT16_T"]
        fields = dict(vars(proto._r))
        fields.update(_name="erdmampi_bfloat16", np_dtype=np.dtype(np.uint16),
                      _reduce_dtype=DTYPE, _base=None)
        _type = Datatype._make(**fields)
    return _type
