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


# -- the C pack/unpack engine (typemap.pack/unpack, ext/src/erdma_pack.c) ----

_C_LAYOUTS = {     # every shape of typemap._Plan
    "vector": lambda: MPI.DOUBLE.Create_vector(5, 1, 3),       # one 8-byte run per block
    "vector_i4": lambda: MPI.INT.Create_vector(7, 1, 2),       # 4-byte runs
    "vector_blocks": lambda: MPI.SHORT.Create_vector(4, 3, 5),  # 6-byte runs (memcpy)
    "hvector_neg": lambda: MPI.INT.Create_hvector(3, 1, -8),
    "column": lambda: MPI.DOUBLE.Create_subarray([6, 7], [6, 1], [0, 3]),
    "subarray3d": lambda: MPI.INT.Create_subarray([4, 5, 6], [2, 3, 2], [1, 2, 3]),
    "struct": lambda: MPI.Datatype.Create_struct([1, 2, 1], [0, 4, 16],
                                                 [MPI.CHAR, MPI.INT, MPI.DOUBLE]),
    "indexed": lambda: MPI.INT.Create_indexed([2, 1, 3], [5, 0, 9]),
    "resized_col": lambda: MPI.DOUBLE.Create_vector(4, 1, 4).Create_resized(0, 8),
    "contig": lambda: MPI.DOUBLE.Create_contiguous(3),
}


def _ref_pack(dt, count, src, base):
    """Packed bytes by plain slicing of the message's runs."""
    starts, lens = dt._get_layout().message_runs(count, dt.extent, base)
    return b"".join(bytes(src[s:s + n]) for s, n in zip(starts.tolist(), lens.tolist()))


@pytest.mark.parametrize("name", sorted(_C_LAYOUTS))
@pytest.mark.parametrize("count", [0, 1, 3])
@pytest.mark.parametrize("odd", [0, 3])
def test_c_pack_matches_slicing(name, count, odd):
    from erdmampi import typemap as tm
    dt = _C_LAYOUTS[name]().Commit()
    lay, ext = dt._get_layout(), dt.extent
    lo, hi = dt.true_lb + min(0, (count - 1) * ext), dt.true_ub + max(0, (count - 1) * ext)
    base = odd - min(lo, 0)                       # odd: unaligned items
    src = np.random.default_rng(7).integers(0, 256, base + max(hi, 0) + 5, dtype=np.uint8)
    size = count * dt.size
    out = np.zeros(size + odd + 2, np.uint8)
    assert tm.pack(lay, count, ext, src, base, out, odd) == odd + size
    assert bytes(out[odd:odd + size]) == _ref_pack(dt, count, src, base)
    assert not out[:odd].any() and not out[odd + size:].any()
    tmp, addr = tm.pack_new(lay, count, ext, src, base, size)
    assert bytes(tmp) == bytes(out[odd:odd + size]) and (addr != 0) == (size > 0)
    # unpack into a blank buffer: exactly the type map's bytes come back
    back = np.zeros_like(src)
    assert tm.unpack(lay, count, ext, out, odd, back, base) == odd + size
    want = np.zeros_like(src)
    starts, lens = lay.message_runs(count, ext, base)
    for s, n in zip(starts.tolist(), lens.tolist()):
        want[s:s + n] = src[s:s + n]
    assert np.array_equal(back, want)
    dt.Free()


def test_c_pack_halo_column_and_numpy_fallback(monkeypatch):
    from erdmampi import typemap as tm
    n = 9
    a = np.random.default_rng(1).random((n + 2, n + 2))
    col = MPI.DOUBLE.Create_subarray([n + 2, n + 2], [n, 1], [1, n]).Commit()
    row = MPI.DOUBLE.Create_subarray([n + 2, n + 2], [1, n], [n + 1, 1]).Commit()
    for dt, sl in ((col, a[1:n + 1, n]), (row, a[n + 1, 1:n + 1])):
        assert np.array_equal(np.frombuffer(_pack(dt, a), "f8"), sl)
        c_packed = bytes(_pack(dt, a))
        monkeypatch.setattr(tm, "_eng", None)     # the NumPy path agrees
        assert bytes(_pack(dt, a)) == c_packed
        monkeypatch.undo()
    # a receive through a packed message unpacks into the column only
    b = np.zeros_like(a)
    SELF.Sendrecv([a, 1, col], 0, 5, [b, 1, col], 0, 5)
    c = np.zeros_like(a)
    c[1:n + 1, n] = a[1:n + 1, n]
    assert np.array_equal(b, c)
    col.Free()
    row.Free()


def test_c_pack_refuses_read_only_destination():
    from erdmampi import typemap as tm
    dt = MPI.INT.Create_vector(2, 1, 2).Commit()
    lay = dt._get_layout()
    dst = np.zeros(16, np.uint8)
    dst.flags.writeable = False
    with pytest.raises(ValueError):
        tm.unpack(lay, 1, dt.extent, np.ones(8, np.uint8), 0, dst, 0)
    dt.Free()


def test_packed_spec_fast_path_and_fallbacks():
    from erdmampi import buffers
    a = np.arange(30, dtype="f8").reshape(5, 6)
    col = MPI.DOUBLE.Create_subarray([5, 6], [5, 1], [0, 2]).Commit()
    msg = buffers.packed_spec([a, 1, col], True)
    assert msg is not None and np.array_equal(msg.array, a[:, 2])
    b = np.zeros_like(a)
    rmsg = buffers.message_p2p([b, 1, col], False)
    rmsg.array[:] = a[:, 2]
    rmsg.finish()
    want = np.zeros_like(a)
    want[:, 2] = a[:, 2]
    assert np.array_equal(b, want)
    # the generic parse takes (and reports) everything else
    assert buffers.packed_spec([a, 2, col], True) is None
    with pytest.raises(ValueError):
        buffers.message_p2p([a, 2, col], True)
    ro = a.copy()
    ro.flags.writeable = False
    assert buffers.packed_spec([ro, 1, col], False) is None
    assert buffers.packed_spec([a[:, ::2], 1, col], True) is None
    assert buffers.packed_spec([a, np.int64(1), col], True) is None
    assert np.array_equal(buffers.message_p2p([a, np.int64(1), col], True).array, a[:, 2])
    col.Free()
    assert buffers.packed_spec([a, 1, col], True) is None     # Free is seen
    with pytest.raises(ValueError):
        buffers.message_p2p([a, 1, col], True)
