"""Derived datatypes: Pack/Unpack and communication against NumPy slicing."""
import pickle

import numpy as np
import pytest

from erdmampi import MPI

SELF = MPI.COMM_SELF


def _pack(dt, arr, count=None):
    dt.Commit()
    out = bytearray(dt.Pack_size(count if count is not None else 1, SELF))
    pos = dt.Pack(arr, out, 0, SELF)
    assert pos == len(out)
    return out


@pytest.mark.parametrize("count,blen,stride", [(3, 2, 5), (4, 1, 3), (2, 3, 3), (1, 4, 7)])
def test_vector_pack_matches_slicing(count, blen, stride):
    dt = MPI.DOUBLE.Create_vector(count, blen, stride)
    a = np.arange(64, dtype="f8")
    packed = np.frombuffer(_pack(dt, a[: dt.extent // 8]), "f8")
    want = np.concatenate([a[i * stride:i * stride + blen] for i in range(count)])
    assert np.array_equal(packed, want)
    dt.Free()


def test_negative_stride_hvector():
    dt = MPI.INT.Create_hvector(3, 1, -8).Commit()
    assert dt.Get_extent() == (-16, 20)
    lay = dt._get_layout()
    assert lay.off.tolist() == [0, -8, -16]
    dt.Free()


@pytest.mark.parametrize("order", [MPI.ORDER_C, MPI.ORDER_F])
def test_subarray_roundtrip(order):
    sizes, subsizes, starts = [4, 5, 6], [2, 3, 2], [1, 2, 3]
    dt = MPI.INT.Create_subarray(sizes, subsizes, starts, order).Commit()
    npo = "C" if order == MPI.ORDER_C else "F"
    a = np.arange(4 * 5 * 6, dtype="i4").reshape(sizes, order=npo)
    sl = tuple(slice(s, s + m) for s, m in zip(starts, subsizes))
    packed = np.frombuffer(_pack(dt, a), "i4")
    assert np.array_equal(packed, a[sl].ravel(order=npo))
    b = np.full_like(a, -1)
    assert dt.Unpack(bytes(packed), 0, b, SELF) == packed.nbytes
    c = np.full_like(a, -1)
    c[sl] = a[sl]
    assert np.array_equal(b, c)
    dt.Free()


def test_struct_padding_and_roundtrip():
    npd = np.dtype([("i", "i4"), ("d", "f8"), ("c", "S3")], align=True)
    dt = MPI.Datatype.Create_struct(
        [1, 1, 3], [npd.fields[n][1] for n in npd.names], [MPI.INT, MPI.DOUBLE, MPI.CHAR])
    assert dt.extent == npd.itemsize
    x = np.zeros(4, npd)
    x["i"], x["d"], x["c"] = [1, 2, 3, 4], [0.5, 1.5, 2.5, 3.5], [b"abc", b"de", b"f", b""]
    out = bytearray(dt.Commit().Pack_size(4, SELF))
    dt.Pack(x, out, 0, SELF)
    assert len(out) == 4 * 15
    y = np.zeros_like(x)
    SELF.Sendrecv([x, 4, dt], 0, 0, [y, 4, dt], 0, 0)
    assert (x == y).all()
    dt.Free()


def test_send_column_receive_contiguous():
    a = np.arange(30, dtype="i8").reshape(5, 6)
    col2 = MPI.LONG.Create_subarray([5, 6], [5, 1], [0, 2]).Commit()
    col4 = MPI.LONG.Create_subarray([5, 6], [5, 1], [0, 4]).Commit()
    got = np.zeros(5, "i8")
    SELF.Sendrecv([a, 1, col2], 0, 0, [got, MPI.LONG], 0, 0)
    assert np.array_equal(got, a[:, 2])
    back = np.full((5, 6), -1, "i8")
    st = MPI.Status()
    SELF.Sendrecv([got, MPI.LONG], 0, 0, [back, 1, col4], 0, 0, status=st)
    assert np.array_equal(back[:, 4], a[:, 2])
    assert (back[:, :4] == -1).all() and (back[:, 5] == -1).all()
    assert st.Get_count(col4) == 1 and st.Get_elements(col4) == 5
    col2.Free()
    col4.Free()


def test_external32_is_big_endian():
    a = np.array([1, 2], "i4")
    out = bytearray(MPI.INT.Pack_external_size("external32", 2))
    MPI.INT.Pack_external("external32", a, out, 0)
    assert bytes(out) == b"\0\0\0\1\0\0\0\2"
    b = np.zeros(2, "i4")
    MPI.INT.Unpack_external("external32", out, 0, b)
    assert np.array_equal(a, b)


def test_pickle_and_decode():
    dt = MPI.DOUBLE.Create_subarray([4, 4], [2, 2], [1, 1]).Commit()
    dt2 = pickle.loads(pickle.dumps(dt))
    assert dt2.decode()[1:] == dt.decode()[1:]
    assert dt2.Get_true_extent() == dt.Get_true_extent() == (40, 48)
    assert pickle.loads(pickle.dumps(MPI.INT)) is MPI.INT
    dt.Free()
    dt2.Free()
