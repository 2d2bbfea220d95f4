import array
import json
import pathlib
import pickle

import numpy as np
import pytest

from erdmampi import buffers as B
from erdmampi import datatype as D
from erdmampi import op as O

REF = json.loads((pathlib.Path(__file__).parent / "data" / "mpi4py_reference.json").read_text())


def _specs():
    """The (label, inbuf, inoutbuf) list of tests/data/gen_mpi4py_reference.py,
    built with erdmampi objects."""
    a = np.arange(12, dtype="i4")
    b = np.zeros(12, dtype="i4")
    ro = np.arange(12, dtype="i4")
    ro.flags.writeable = False
    INT, DOUBLE = D.INT, D.DOUBLE
    return [
        ("buf", a, b),
        ("[buf, type]", [a, INT], [b, INT]),
        ("[buf, count]", [a, 5], [b, 5]),
        ("[buf, count, type]", [a, 5, INT], [b, 5, INT]),
        ("[buf, count, 'i']", [a, 5, "i"], [b, 5, "i"]),
        ("[buf, (count, displ), type]", [a, (5, 2), INT], [b, (5, 2), INT]),
        ("[buf, count, displ, type]", [a, 5, 2, INT], [b, 5, 2, INT]),
        ("(buf, count, displ, type)", (a, 5, 2, INT), (b, 5, 2, INT)),
        ("[buf, (count, displ)]", [a, (5, 2)], [b, (5, 2)]),
        ("[buf, [count, displ]]", [a, [5, 2]], [b, [5, 2]]),
        ("[buf, BYTE]", [a, D.BYTE], [b, D.BYTE]),
        ("[buf, DOUBLE] 48 bytes", [a, DOUBLE], [b, DOUBLE]),
        ("[buf, DOUBLE_INT] 48 bytes", [a, D.DOUBLE_INT], [b, D.DOUBLE_INT]),
        ("[None, 0, INT]", [None, 0, INT], [None, 0, INT]),
        ("[None, INT]", [None, INT], [None, INT]),
        ("[BOTTOM, 0, INT]", [B.BOTTOM, 0, INT], [B.BOTTOM, 0, INT]),
        ("[None, 3, INT]", [None, 3, INT], [None, 3, INT]),
        ("int", 5, 5),
        ("None", None, None),
        ("str", "abc", "abc"),
        ("[]", [], []),
        ("[buf]", [a], [b]),
        ("5 items", [a, 1, 2, INT, 0], [b, 1, 2, INT, 0]),
        ("negative count", [a, -1, INT], [b, -1, INT]),
        ("negative displ", [a, 1, -1, INT], [b, 1, -1, INT]),
        ("displ out of bounds", [a, 1, 13, INT], [b, 1, 13, INT]),
        ("displ at end", [a, 0, 12, INT], [b, 0, 12, INT]),
        ("float count", [a, 1.5, INT], [b, 1.5, INT]),
        ("unknown typecode", [a, 2, "x"], [b, 2, "x"]),
        ("DATATYPE_NULL", [a, D.DATATYPE_NULL], [b, D.DATATYPE_NULL]),
        ("odd length for DOUBLE", [a[:3], DOUBLE], [b[:3], DOUBLE]),
        ("read-only recv", a, ro),
        ("bytes recv", a[:1].view("B")[:4].copy(), b"abcd"),
        ("non-contiguous", a[::2], b[::2]),
        ("2-D C", a.reshape(3, 4), b.reshape(3, 4)),
        ("2-D F", np.asfortranarray(a.reshape(3, 4)), np.asfortranarray(b.reshape(3, 4))),
        ("big-endian", a.astype(">i4"), b.astype(">i4")),
        ("count > buffer", [a, 20, INT], [b, 20, INT]),
        ("mismatch count", [a, 5, INT], [b, 6, INT]),
        ("mismatch type", [a, INT], [b, D.FLOAT]),
    ]


_seen = []
_PROBE = O.Op.Create(lambda a, b, dt: _seen.append((dt, len(a))), commute=True)
_CANON = {}
for _n, _dt in D.PREDEFINED.items():
    _CANON.setdefault(_dt.handle, _n)


def _probe(x, y):
    _seen.clear()
    try:
        _PROBE.Reduce_local(x, y)
    except BaseException as exc:  # noqa: BLE001
        return {"error": type(exc).__name__, "message": str(exc)}
    if not _seen:
        return {"datatype": None, "nbytes": 0}
    dt, nbytes = _seen[0]
    return {"datatype": _CANON[dt.handle], "nbytes": nbytes}


def _same_type(ours, ref_name):
    return ours is None and ref_name is None or D.PREDEFINED[ours] == D.PREDEFINED[ref_name]


@pytest.mark.parametrize("label,x,y", _specs(), ids=[s[0] for s in _specs()])
def test_spec_parsing_matches_mpi4py(label, x, y):
    ref = REF["msgspec"][label]
    got = _probe(x, y)
    if label == "count > buffer":
        # mpi4py leaves this to MPI (undefined behaviour); we refuse it
        assert got["error"] == "ValueError" and "out of bounds" in got["message"]
        return
    if "error" in ref:
        assert got.get("error") == ref["error"], got
        if ref["error"] in ("ValueError", "TypeError") and "message:" in ref["message"]:
            assert got["message"] == ref["message"]
        return
    assert "error" not in got, got
    assert got["nbytes"] == ref["nbytes"]
    assert _same_type(got["datatype"], ref["datatype"])


def _format_objects():
    out = {}
    for code in "?bhilqBHILQefdgFDGSU":
        dtype = np.dtype(code + ("1" if code in "SU" else ""))
        out["numpy:" + code] = (np.zeros(6, dtype), np.zeros(6, dtype))
    for code in "bBhHiIlLqQfd":
        out["array:" + code] = (array.array(code, [0] * 6), array.array(code, [0] * 6))
    out["bytearray"] = (bytearray(6), bytearray(6))
    out["bytes->bytearray"] = (b"abcdef", bytearray(6))
    out["numpy:>i4"] = (np.zeros(4, ">i4"), np.zeros(4, ">i4"))
    out["numpy:structured"] = (np.zeros(3, "f8,i4"), np.zeros(3, "f8,i4"))
    out["numpy:M"] = (np.zeros(6, "M8[s]"), np.zeros(6, "M8[s]"))
    out["numpy:m"] = (np.zeros(6, "m8[s]"), np.zeros(6, "m8[s]"))
    return out


@pytest.mark.parametrize("key", sorted(REF["formats"]))
def test_datatype_from_buffer_format_matches_mpi4py(key):
    x, y = _format_objects()[key]
    ref = REF["formats"][key]
    got = _probe(x, y)
    if "error" in ref:
        assert got.get("error") == ref["error"], got
    else:
        assert got["nbytes"] == ref["nbytes"]
        assert _same_type(got["datatype"], ref["datatype"])


# -- BufMsg contract ---------------------------------------------------------

def test_bufmsg_fields_for_displacement():
    a = np.arange(10, dtype="f8")
    m = B.message_p2p([a, (3, 2), D.DOUBLE], readonly=False)
    assert m.addr == a.ctypes.data + 16
    assert (m.nbytes, m.count, m.datatype, m.device) == (24, 3, D.DOUBLE, False)
    assert m.array.dtype == np.float64 and m.array.tolist() == [2.0, 3.0, 4.0]
    m.array[:] = -1  # a receive writes straight into the user buffer
    m.finish()
    assert a[2:5].tolist() == [-1.0] * 3 and a[5] == 5.0
    assert m.obj is a


def test_bufmsg_typecode_string_and_bytes():
    m = B.message_p2p([bytearray(8), "i"], readonly=False)
    assert (m.datatype, m.count, m.array.dtype) == (D.INT, 2, np.dtype("i4"))
    m = B.message_p2p(b"abc", readonly=True)
    assert (m.datatype, m.count, m.nbytes) == (D.UNSIGNED_CHAR, 3, 3)
    assert bytes(m.array) == b"abc"


def test_bufmsg_no_np_dtype_gives_bytes_and_pairs_give_structured():
    m = B.message_p2p([bytearray(5), D.PACKED], readonly=False)
    assert m.array.dtype == np.uint8 and m.count == 5
    pairs = np.zeros(3, D.FLOAT_INT.np_dtype)
    m = B.message_p2p([pairs, D.FLOAT_INT], readonly=True)
    assert m.count == 3 and m.array.dtype == D.FLOAT_INT.np_dtype


def test_contiguous_derived_datatype_elements():
    a = np.arange(12, dtype="i4")
    t = D.INT.Create_contiguous(3)
    m = B.message_p2p([a, t], readonly=True)
    assert m.count == 4 and m.nbytes == 48 and m.array.size == 12
    m = B.message_p2p([a, 2, 1, t], readonly=True)
    assert m.array.tolist() == [3, 4, 5, 6, 7, 8]


def test_empty_messages():
    for spec in ([None, D.INT], [B.BOTTOM, 0, D.INT], [np.zeros(0), D.DOUBLE], np.zeros(0)):
        m = B.message_p2p(spec, readonly=False)
        assert m.count == 0 and m.nbytes == 0 and m.array.size == 0
    with pytest.raises(ValueError, match="BOTTOM"):
        B.message_p2p([B.BOTTOM, 2, D.INT], readonly=False)


def test_fortran_order_buffer_is_taken_in_memory_order():
    f = np.asfortranarray(np.arange(6, dtype="i4").reshape(2, 3))
    m = B.message_p2p(f, readonly=True)
    assert m.array.tolist() == [0, 3, 1, 4, 2, 5]


def test_read_only_errors():
    with pytest.raises(BufferError, match="not writable"):
        B.message_p2p(b"abcd", readonly=False)
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="not writable"):
        B.message_p2p(ro, readonly=False)
    assert B.message_p2p(ro, readonly=True).count == 3
    with pytest.raises(BufferError, match="not writable"):
        B.message_p2p(memoryview(bytearray(4)).toreadonly(), readonly=False)


# -- DLPack ------------------------------------------------------------------

class DLPackOnly:
    """Exposes a NumPy array only through DLPack (no buffer protocol)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


def test_dlpack_only_object_send_and_receive():
    arr = np.arange(6, dtype="f4")
    obj = DLPackOnly(arr)
    with pytest.raises(TypeError):
        memoryview(obj)
    m = B.message_p2p(obj, readonly=True)
    assert (m.datatype, m.count, m.addr) == (D.FLOAT, 6, arr.ctypes.data)
    m = B.message_p2p([obj, (2, 1), D.FLOAT], readonly=False)
    m.array[:] = 9
    m.finish()
    assert arr.tolist() == [0, 9, 9, 3, 4, 5]
    # DLPack int64 maps to 'l' (LONG) like mpi4py's dlpack_get_format
    assert B.message_p2p(DLPackOnly(np.zeros(2, "q")), True).datatype == D.LONG


def test_dlpack_errors_match_mpi4py():
    ro = np.zeros(4)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="dlpack: buffer is not writable"):
        B.message_p2p(DLPackOnly(ro), readonly=False)
    with pytest.raises(BufferError, match="dlpack: buffer is not contiguous"):
        B.message_p2p(DLPackOnly(np.arange(8)[::2]), readonly=True)


class FakeDevice(DLPackOnly):
    """Host memory exported as a CUDA tensor (what mpi4py's tests use without
    a GPU); the stream argument of a device export is accepted and ignored."""

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA

    def __dlpack__(self, stream=None, **kwargs):
        return self._arr.__dlpack__(**kwargs)


def test_dlpack_device_pointer_without_driver_is_host_memory():
    from erdmampi.buffers import _CudaRuntime
    if _CudaRuntime.load() is not None and not _CudaRuntime.is_host(0):
        pytest.skip("a CUDA driver with a device is present")
    arr = np.arange(4, dtype="f8")
    m = B.message_p2p(FakeDevice(arr), readonly=False)
    assert m.count == 4 and m.array.tolist() == arr.tolist()
    m.array[0] = 42.0               # read and written in place, as MPI would
    assert arr[0] == 42.0


# -- CUDA array interface: parsing only (no GPU here) --------------------------

class CAI:
    def __init__(self, **cai):
        base = {"data": (1 << 40, False), "typestr": "<f4", "shape": (4,), "version": 3}
        base.update(cai)
        self.__cuda_array_interface__ = base


@pytest.mark.parametrize("kw,match", [
    ({"mask": object()}, "masked"),
    ({"typestr": ">f4"}, "byte order"),
    ({"shape": (4, 4), "strides": (4, 32)}, "not contiguous"),
    ({"data": (1 << 40, True)}, "not writable"),
])
def test_cai_rejections(kw, match):
    with pytest.raises(BufferError, match=match):
        B.message_p2p(CAI(**kw), readonly=False)


def test_cai_description():
    assert B._cai_describe(CAI(), True) == (1 << 40, 16, "f")
    assert B._cai_describe(CAI(typestr="<c8", shape=(2, 3)), True)[1:] == (48, "Zf")
    assert B._cai_describe(CAI(typestr="|V4"), True)[2] is None
    assert B._cai_describe(CAI(shape=(0,), data=(None, False)), True)[:2] == (0, 0)


def test_cai_without_staging_backend_is_a_clear_error():
    for mod in ("cupy", "numba"):
        try:
            __import__(mod)
            pytest.skip(f"{mod} present")
        except ImportError:
            pass
    # with libcudart but no GPU/driver, cudaMemcpy fails: also a BufferError
    with pytest.raises(BufferError, match="CuPy, Numba or the CUDA runtime|cudaMemcpy failed"):
        B.message_p2p(CAI(), readonly=True)


# -- collective messages ---------------------------------------------------------

def test_message_cco_infers_per_block_count():
    a = np.arange(12, dtype="i4")
    m = B.message_cco(a, readonly=True, blocks=4)
    assert (m.count, m.blocks, m.nbytes, m.array.size) == (3, 4, 48, 12)
    assert m.array.reshape(4, -1)[1].tolist() == [3, 4, 5]
    m = B.message_cco([a, 2, D.INT], readonly=True, blocks=4)
    assert (m.count, m.nbytes, m.array.size) == (2, 32, 8)
    m = B.message_cco(a, readonly=True, blocks=0)
    assert (m.count, m.blocks) == (12, 1)
    with pytest.raises(ValueError, match="not a multiple of required number of blocks 5"):
        B.message_cco(a, readonly=True, blocks=5)
    with pytest.raises(ValueError, match="out of bounds"):
        B.message_cco([a, 4, D.INT], readonly=False, blocks=4)


def test_message_cco_against_mpi4py_scatter_rules():
    MPI = pytest.importorskip("mpi4py.MPI")
    comm = MPI.COMM_SELF
    send = np.arange(6, dtype="i4")
    recv = np.zeros(6, dtype="i4")
    comm.Scatter(send, recv, root=0)  # size 1: one block of 6
    assert B.message_cco(send, True, comm.Get_size()).count == 6
    assert B.message_cco(recv, False, 0).count == 6


def test_message_vector_defaults_and_forms():
    a = np.arange(10, dtype="f8")
    m, counts, displs = B.message_vector(a, readonly=True, size=3)
    assert counts == [4, 3, 3] and displs == [0, 4, 7]
    assert m.datatype == D.DOUBLE and m.array.size == 10
    _, counts, displs = B.message_vector([a, [1, 2, 3]], readonly=True, size=3)
    assert counts == [1, 2, 3] and displs == [0, 1, 3]
    _, counts, displs = B.message_vector([a, ([1, 2, 3], [7, 0, 2])], readonly=True, size=3)
    assert counts == [1, 2, 3] and displs == [7, 0, 2]
    _, counts, displs = B.message_vector([a, 2, 3, D.DOUBLE], readonly=True, size=3)
    assert counts == [2, 2, 2] and displs == [0, 3, 6]
    _, counts, displs = B.message_vector([a, [2, 2, 2], [0, 3, 6], "d"], readonly=True, size=3)
    assert counts == [2, 2, 2] and displs == [0, 3, 6]
    m, counts, _ = B.message_vector([a, D.DOUBLE], readonly=True, size=2)
    assert counts == [5, 5]
    # a list as second item is counts (not (counts, displs)) for vectors
    _, counts, displs = B.message_vector([a, [3, 3]], readonly=True, size=2)
    assert counts == [3, 3] and displs == [0, 3]


def test_message_vector_errors():
    a = np.arange(10, dtype="f8")
    with pytest.raises(ValueError, match="expecting 3 items, got 2"):
        B.message_vector([a, [1, 2]], readonly=True, size=3)
    with pytest.raises(ValueError, match="need 11"):
        B.message_vector([a, ([5, 5], [0, 6])], readonly=True, size=2)
    with pytest.raises(ValueError, match="negative"):
        B.message_vector([a, ([-1, 5], [0, 1])], readonly=True, size=2)
    with pytest.raises(BufferError):
        B.message_vector(b"12345678", readonly=False, size=2)


def test_message_vector_against_mpi4py():
    MPI = pytest.importorskip("mpi4py.MPI")
    a = np.arange(7, dtype="i4")
    out = np.zeros(7, dtype="i4")
    MPI.COMM_SELF.Scatterv([a, ([3], [4]), MPI.INT], [out, 3, MPI.INT], root=0)
    _, counts, displs = B.message_vector([a, ([3], [4]), D.INT], True, 1)
    assert a[displs[0]:displs[0] + counts[0]].tolist() == out[:3].tolist()


# -- sentinels -------------------------------------------------------------------

def test_sentinels_like_mpi4py():
    assert repr(B.BOTTOM) == "BOTTOM" and repr(B.IN_PLACE) == "IN_PLACE"
    assert int(B.BOTTOM) == 0 and int(B.IN_PLACE) == -1 and int(B.BUFFER_AUTOMATIC) == 0
    assert B.BOTTOM == 0 and B.IN_PLACE == -1 and B.IN_PLACE != 0
    assert B.BottomType() is B.BOTTOM and B.InPlaceType() is B.IN_PLACE
    assert B.IN_PLACE != B.BOTTOM and B.BOTTOM != "x"
    assert pickle.loads(pickle.dumps(B.IN_PLACE)) is B.IN_PLACE
    assert B.is_in_place(None) and B.is_in_place(B.IN_PLACE) and not B.is_in_place(B.BOTTOM)
    assert B.is_bottom(None) and B.is_bottom(B.BOTTOM)
    MPI = pytest.importorskip("mpi4py.MPI")
    assert int(MPI.IN_PLACE) == int(B.IN_PLACE) and int(MPI.BOTTOM) == int(B.BOTTOM)
    assert int(MPI.BUFFER_AUTOMATIC) == int(B.BUFFER_AUTOMATIC)
    with pytest.raises(TypeError):
        B.message_p2p(B.IN_PLACE, readonly=True)
