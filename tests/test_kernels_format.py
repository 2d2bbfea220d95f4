"""The container (kernels/format.py), the Numba checksums (kernels/_checksum.py)
and the raw codec (kernels/raw.py): header/table validation, truncation and
corruption of every byte, CPU/CUDA agreement (CUDA under the simulator
unless NUMBA_ENABLE_CUDASIM=0)."""

import numpy as np
import pytest

from erdmampi import kernels
from erdmampi.kernels import format as fmt
from erdmampi.kernels.format import HEADER_SIZE, CodecError

from erdmampi.kernels import _checksum  # noqa: E402
from numba import cuda  # noqa: E402


# -- checksum ---------------------------------------------------------------

LENGTHS = [0, 1, 2, 3, 4, 5, 7, 8, 63, 64, 65, 4095, 4096, 4097, 4100, 8193, 12345]


@pytest.mark.parametrize("n", LENGTHS)
def test_checksum_cpu_matches_reference(n):
    b = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    assert int(_checksum.checksum32(b)) == fmt.checksum32(b)


def test_checksum_cpu_large_and_extreme_words():
    # all-ones words make both sums wrap mod 2**64 quickly
    b = np.full(3 * 4096 * 4 + 3, 0xFF, np.uint8)
    assert int(_checksum.checksum32(b)) == fmt.checksum32(b)
    b = np.random.default_rng(7).integers(0, 256, 1 << 18, dtype=np.uint8)
    assert int(_checksum.checksum32(b)) == fmt.checksum32(b)


def test_checksum_unaligned_slice():
    b = np.random.default_rng(3).integers(0, 256, 9000, dtype=np.uint8)
    for off in (1, 2, 3):
        assert int(_checksum.checksum32(b[off:])) == fmt.checksum32(b[off:])


def test_checksum_split_sums_combine():
    # the linearity the CUDA reduction relies on
    b = np.random.default_rng(5).integers(0, 256, 4 * 5000, dtype=np.uint8)
    a1, a2 = _checksum.sums(b[:4 * 1234], 0)
    c1, c2 = _checksum.sums(b[4 * 1234:], 1234)
    with np.errstate(over="ignore"):
        assert int(_checksum.fold(a1 + c1, a2 + c2)) == fmt.checksum32(b)


def test_checksum_detects_single_byte_and_swap():
    b = np.random.default_rng(1).integers(0, 256, 1000, dtype=np.uint8)
    ref = fmt.checksum32(b)
    c = b.copy()
    c[500] ^= 1
    assert int(_checksum.checksum32(c)) != ref
    c = b.copy()
    c[0:4], c[4:8] = b[4:8], b[0:4]
    if not np.array_equal(c, b):
        assert int(_checksum.checksum32(c)) != ref


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 1023, 1026])
def test_checksum_cuda_matches(n):
    b = np.random.default_rng(n + 100).integers(0, 256, n, dtype=np.uint8)
    d = cuda.to_device(b)
    assert _checksum.checksum32_cuda(d) == fmt.checksum32(b)


# -- header / parse ---------------------------------------------------------

def _small():
    return kernels.get("raw").encode(np.arange(11, dtype=np.int32))


def test_header_fields():
    x = np.arange(11, dtype=np.int32)
    enc = kernels.get("raw").encode(x)
    hdr, table, payload = fmt.parse(enc)
    assert hdr.codec_id == 0 and hdr.dtype == np.dtype("<i4")
    assert hdr.count == 11 and hdr.nblocks == 1
    assert hdr.payload_len == 44 and int(table[0]) == 44
    assert payload.tobytes() == x.tobytes()
    assert kernels.header(enc) == hdr
    # trailing bytes are ignored
    assert fmt.parse(np.concatenate([enc, np.zeros(9, np.uint8)]))[0] == hdr


def test_parse_every_truncation():
    enc = _small()
    for k in range(enc.size):
        with pytest.raises(CodecError):
            fmt.parse(enc[:k])
        with pytest.raises(CodecError):
            kernels.decode(enc[:k])


def test_parse_every_flipped_byte():
    enc = _small()
    for i in range(enc.size):
        for bit in (0, 7):
            bad = enc.copy()
            bad[i] ^= 1 << bit
            if i >= 44 and i < 48:
                # the reserved header bytes are not covered by a checksum;
                # they must still not break decoding
                out = kernels.decode(bad)
                assert np.array_equal(out, np.arange(11, dtype=np.int32))
                continue
            with pytest.raises(CodecError):
                kernels.decode(bad)


def test_parse_wrong_codec_and_magic():
    enc = _small()
    with pytest.raises(CodecError, match="codec id"):
        fmt.parse(enc, codec_id=1)
    bad = enc.copy()
    bad[:4] = np.frombuffer(b"XXXX", np.uint8)
    with pytest.raises(CodecError, match="magic"):
        fmt.parse(bad)
    with pytest.raises(CodecError):
        fmt.parse(b"")


def test_pack_header_geometry_checked_by_parse():
    table = np.array([8, 8], "<u4")
    # 3 elements of 1 per block need 3 blocks, not 2
    head = fmt.pack_header(0, np.uint8, 3, 1, table, 0)
    with pytest.raises(CodecError, match="blocks"):
        fmt.parse(head + table.tobytes() + bytes(16))
    head = fmt.pack_header(0, np.uint8, 5, 0, np.zeros(0, "<u4"), 0)
    with pytest.raises(CodecError, match="zero block"):
        fmt.parse(head)


def test_table_entry_and_dtype_codes():
    assert fmt.table_entry(5, 3) == (3 << 28) | 5
    with pytest.raises(ValueError):
        fmt.table_entry(1 << 28, 0)
    with pytest.raises(ValueError):
        fmt.table_entry(1, 16)
    for dt in ["i1", "u2", "f4", "c16", "?", "V3"]:
        assert fmt.code_dtype(*fmt.dtype_code(dt)) == np.dtype(dt)
    with pytest.raises(CodecError):
        fmt.code_dtype(ord("x"), 4)
    with pytest.raises(CodecError):
        fmt.code_dtype(ord("f"), 3)


# -- raw codec --------------------------------------------------------------

DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8",
          "c8", "c16", "?"]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("n", [0, 1, 17])
def test_raw_roundtrip(dt, n):
    r = kernels.get("raw")
    x = (np.random.default_rng(n).standard_normal(n) * 50).astype(dt)
    enc = r.encode(x)
    assert enc.size == r.max_encoded_size(n, dt)
    y = kernels.decode(enc)
    assert y.dtype == np.dtype(dt) and y.tobytes() == x.tobytes()
    out = np.empty(n, dt)
    assert r.decode(enc, out) is not None and out.tobytes() == x.tobytes()


def test_raw_multiblock_and_odd_dtypes():
    r = type(kernels.get("raw"))(block_bytes=24)
    x = np.arange(20, dtype=np.int64)
    enc = r.encode(x)
    hdr, table, _ = fmt.parse(enc)
    assert hdr.nblocks == 7 and hdr.block_elems == 3 and int(table[-1]) == 16
    assert np.array_equal(r.decode(enc), x)
    for dt in ["M8[s]", ">i4", "U3"]:
        x = np.array(["ab", "c", "def"]).astype(dt) if dt == "U3" else \
            np.arange(5).astype(dt)
        enc = r.encode(x)
        assert fmt.parse(enc)[0].dtype.kind == "V"
        out = np.empty_like(x)
        r.decode(enc, out)
        assert out.tobytes() == x.tobytes()


def test_raw_out_errors():
    r = kernels.get("raw")
    x = np.arange(10, dtype=np.float32)
    with pytest.raises(ValueError, match="too small"):
        r.encode(x, np.empty(10, np.uint8))
    enc = r.encode(x)
    with pytest.raises(CodecError, match="dtype"):
        r.decode(enc, np.empty(10, np.int32))
    with pytest.raises(CodecError, match="elements"):
        r.decode(enc, np.empty(9, np.float32))
    with pytest.raises(CodecError, match="codec id"):
        kernels.get("lossless").decode(enc) if _has_lossless() else \
            fmt.parse(enc, codec_id=1)


def _has_lossless():
    try:
        kernels.get("lossless")
        return True
    except ImportError:
        return False


def test_raw_cuda_matches_cpu():
    r = kernels.get("raw")
    x = np.random.default_rng(2).standard_normal(37).astype(np.float32)
    enc = r.encode(x)
    genc = r.encode_cuda(cuda.to_device(x))
    assert isinstance(genc, np.ndarray) and genc.tobytes() == enc.tobytes()
    dout = cuda.device_array(enc.size + 3, np.uint8)
    v = r.encode_cuda(cuda.to_device(x), dout)
    assert v.copy_to_host().tobytes() == enc.tobytes()
    # decode host encoding and device encoding onto the device
    assert r.decode_cuda(enc).copy_to_host().tobytes() == x.tobytes()
    d = cuda.device_array(37, np.float32)
    r.decode_cuda(cuda.to_device(enc), d)
    assert d.copy_to_host().tobytes() == x.tobytes()
    bad = enc.copy()
    bad[-1] ^= 4
    with pytest.raises(CodecError, match="checksum"):
        r.decode_cuda(bad)
    with pytest.raises(CodecError):
        r.decode_cuda(cuda.to_device(enc[:HEADER_SIZE + 6]))
    with pytest.raises(CodecError, match="dtype"):
        r.decode_cuda(enc, cuda.device_array(37, np.int32))
