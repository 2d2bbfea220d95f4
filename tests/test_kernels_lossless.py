"""The lossless codec (kernels/lossless.py): bit-exact round trips for every
dtype and awkward size, special float values, the benchmark's data kinds,
CPU <-> CUDA (simulator unless NUMBA_ENABLE_CUDASIM=0) cross-decoding,
corruption fuzzing and output-buffer errors.

Besides the real mode modules (used when present), the driver is exercised
with a small mode defined here (id 15, "constant block": a block whose
bytes are all equal encodes to that one byte), so its dispatch, raw
fallback and error paths are tested whatever modes exist.
"""

import numpy as np
import pytest

from erdmampi import kernels
from erdmampi.kernels import format as fmt
from erdmampi.kernels.format import HEADER_SIZE, CodecError

from erdmampi.kernels import lossless  # noqa: E402
from numba import cuda, njit  # noqa: E402

from bench import codec_data  # noqa: E402

Lossless = lossless.Lossless

# -- the test mode (id 15) ------------------------------------------------

MODE_ID = 15


def max_block_bytes(block_bytes, itemsize):
    return block_bytes


@njit(cache=True, nogil=True)
def estimate_block(src, itemsize, isfloat):
    if src.size == 0:
        return -1
    v = src[0]
    for i in range(0, src.size, 64):  # a sample
        if src[i] != v:
            return -1
    return 1


@njit(cache=True, nogil=True)
def encode_block(src, itemsize, isfloat, dst):
    if src.size == 0 or dst.size < 1:
        return -1
    v = src[0]
    for i in range(src.size):
        if src[i] != v:
            return -1
    dst[0] = v
    return 1


@njit(cache=True, nogil=True)
def decode_block(enc, itemsize, isfloat, dst):
    if enc.size != 1:
        return -1
    for i in range(dst.size):
        dst[i] = enc[0]
    return 0


@cuda.jit
def _enc_kernel(src, nblocks, block_bytes, last_bytes, scratch, slot_bytes, sizes):
    i = cuda.grid(1)
    if i >= nblocks:
        return
    n = block_bytes if i < nblocks - 1 else last_bytes
    base = i * block_bytes
    v = src[base]
    for j in range(n):
        if src[base + j] != v:
            sizes[i] = -1
            return
    scratch[i * slot_bytes] = v
    sizes[i] = 1


@cuda.jit
def _dec_kernel(payload, offsets, lengths, block_ids, nsel, block_bytes, last_bytes,
                nblocks, dst, err):
    j = cuda.grid(1)
    if j >= nsel:
        return
    b = block_ids[j]
    if b < 0 or b >= nblocks or lengths[j] != 1:
        err[0] = 1
        return
    n = block_bytes if b < nblocks - 1 else last_bytes
    v = payload[offsets[j]]
    for k in range(n):
        dst[b * block_bytes + k] = v


def encode_blocks_cuda(src, nblocks, block_bytes, last_bytes, itemsize, isfloat,
                       scratch, slot_bytes, sizes, stream):
    _enc_kernel[nblocks, 1, stream](src, nblocks, block_bytes, last_bytes, scratch,
                                    slot_bytes, sizes)


def decode_blocks_cuda(payload, offsets, lengths, block_ids, nsel, block_bytes,
                       last_bytes, nblocks, itemsize, isfloat, dst, err, stream):
    if nsel:
        _dec_kernel[nsel, 1, stream](payload, offsets, lengths, block_ids, nsel,
                                     block_bytes, last_bytes, nblocks, dst, err)


TEST_MODULES = {15: __name__}


def _test_codec(block_bytes=256):
    return Lossless(block_bytes=block_bytes, _modules=TEST_MODULES)


# -- helpers ----------------------------------------------------------------

DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8",
          "c8", "c16", "?"]


def _data(dt, n, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dt)
    if dt.kind == "b":
        return rng.random(n) < 0.3
    if dt.kind in "iu":
        # smooth-ish integers with runs of zeros: every mode has a chance
        x = np.cumsum(rng.integers(-3, 4, n)) * (rng.random(n) < 0.7)
        return x.astype(dt)
    if dt.kind == "c":
        return (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(dt)
    return (rng.standard_normal(n) * 0.01).astype(dt)


def _roundtrip(c, x):
    enc = c.encode(x)
    assert enc.size <= c.max_encoded_size(x.size, x.dtype)
    y = c.decode(enc)
    assert y.dtype == x.dtype and y.shape == (x.size,)
    assert y.tobytes() == x.tobytes()
    out = np.empty_like(x)
    c.decode(enc, out)
    assert out.tobytes() == x.tobytes()
    return enc


# -- round trips --------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_roundtrip_sizes_every_dtype(dt):
    c = kernels.get("lossless")
    be = c.block_bytes // np.dtype(dt).itemsize
    for n in (0, 1, be - 1, be, be + 1, 3 * be + 5):
        enc = _roundtrip(c, _data(dt, n, n))
        hdr = fmt.parse(enc)[0]
        assert hdr.codec_id == 1 and hdr.count == n and hdr.block_elems == be
        assert kernels.decode(enc).tobytes() == _data(dt, n, n).tobytes()


def test_special_floats():
    c = kernels.get("lossless")
    for dt in ("f2", "f4", "f8"):
        fi = np.finfo(dt)
        specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0,
                             fi.tiny, -fi.tiny, fi.tiny / 4, fi.max, -fi.max,
                             fi.eps, 1.0], dtype=dt)
        x = np.tile(specials, 700)
        # a NaN with a payload survives bit-exactly
        xb = x.view(f"u{np.dtype(dt).itemsize}")
        xb[5] = xb[0] | 1
        np.random.default_rng(1).shuffle(x[: x.size // 2])
        _roundtrip(c, x)


def test_constant_zero_and_random_blocks():
    c = kernels.get("lossless")
    _roundtrip(c, np.zeros(10000, np.float32))
    _roundtrip(c, np.full(10000, 7, np.int64))
    r = np.random.default_rng(3).integers(0, 256, 30000, dtype=np.uint8)
    enc = _roundtrip(c, r)
    # incompressible: stored raw, overhead is header + table only
    assert enc.size <= r.size + HEADER_SIZE + 4 * (-(-r.size // c.block_bytes))


@pytest.mark.parametrize("kind", sorted(codec_data.KINDS))
def test_bench_kinds_small(kind):
    c = kernels.get("lossless")
    x = codec_data.make(kind, 64 << 10)
    enc = _roundtrip(c, x)
    # the mode meant for each kind compresses it when that mode is present
    if {"gradients": 1, "smooth": 2, "sparse": 3}[kind] in c.modes():
        assert enc.size < x.nbytes


def test_bytes_like_encodings():
    c = kernels.get("lossless")
    x = np.arange(5000, dtype=np.int64)
    enc = c.encode(x)
    for e in (bytes(enc), bytearray(enc), memoryview(bytes(enc))):
        assert np.array_equal(kernels.decode(e), x)
    # a read-only source encodes the same
    ro = np.frombuffer(x.tobytes(), np.int64)
    assert not ro.flags.writeable
    assert c.encode(ro).tobytes() == enc.tobytes()
    # bytes past the end of the encoding are ignored
    assert np.array_equal(c.decode(np.concatenate([enc, np.ones(7, np.uint8)])), x)


def test_odd_dtypes_and_2d():
    c = kernels.get("lossless")
    x = np.arange(3000, dtype=">i4")
    enc = c.encode(x)
    assert fmt.parse(enc)[0].dtype.kind == "V"
    out = np.empty_like(x)
    c.decode(enc, out)
    assert out.tobytes() == x.tobytes()
    s = np.array(["abc", "", "xyzw"] * 400)
    out = np.empty_like(s)
    c.decode(c.encode(s), out)
    assert np.array_equal(out, s)
    m = np.arange(60, dtype=np.float64).reshape(6, 10)
    assert np.array_equal(c.decode(c.encode(m)), m.ravel())
    assert np.array_equal(c.decode(c.encode(m.T)), m.T.ravel())


def test_block_bytes_option_and_geometry():
    c = Lossless(block_bytes=1000)          # rounded to a multiple of 8
    x = _data("c16", 500)                   # itemsize 16: lcm 16
    enc = _roundtrip(c, x)
    hdr = fmt.parse(enc)[0]
    assert hdr.block_elems * 16 == 992
    c = Lossless(block_bytes=24)
    enc = _roundtrip(c, _data("V3", 0) if False else np.arange(100, dtype="u1"))
    assert fmt.parse(enc)[0].block_elems == 24
    with pytest.raises(TypeError, match="too large"):
        Lossless().encode(np.zeros(2, dtype=f"V{(1 << 20) + 8}"))
    with pytest.raises(ValueError):
        Lossless(block_bytes=4)
    with pytest.raises(ValueError):
        Lossless(block_bytes=lossless.MAX_BLOCK_BYTES + 8)


def test_mode_params():
    assert lossless.mode_params("f4") == (4, True)
    assert lossless.mode_params("c8") == (4, True)
    assert lossless.mode_params("c16") == (8, True)
    assert lossless.mode_params("i8") == (8, False)
    assert lossless.mode_params("?") == (1, False)
    assert lossless.mode_params("V12") == (4, False)
    assert lossless.mode_params("V3") == (1, False)


# -- the driver with the test mode -------------------------------------------

def _mixed(n_blocks=6, block=256):
    """Blocks alternating constant (test mode) and random (raw)."""
    rng = np.random.default_rng(9)
    parts = []
    for b in range(n_blocks):
        if b % 2 == 0:
            parts.append(np.full(block, b + 1, np.uint8))
        else:
            parts.append(rng.integers(0, 256, block, dtype=np.uint8))
    parts.append(np.full(37, 200, np.uint8))  # a short constant last block
    return np.concatenate(parts)


@pytest.mark.parametrize("reeval", [1, 2, 16])
def test_driver_uses_mode_and_raw_fallback(reeval):
    c = Lossless(block_bytes=256, reeval=reeval, _modules=TEST_MODULES)
    assert list(c.modes()) == [15]
    x = _mixed()
    enc = _roundtrip(c, x)
    hdr, table, payload = fmt.parse(enc)
    modes = (table >> 28).tolist()
    sizes = (table & fmt.SIZE_MASK).tolist()
    assert modes == [15, 0, 15, 0, 15, 0, 15]
    assert sizes == [1, 256, 1, 256, 1, 256, 1]
    assert payload[0] == 1 and payload[1 + 256] == 3
    # runs of one kind, then a change: the sticky path must notice
    x = np.concatenate([np.full(256 * 5, 4, np.uint8), _mixed(), np.zeros(300, np.uint8)])
    table = fmt.parse(_roundtrip(c, x))[1]
    assert (table >> 28).tolist() == [15] * 5 + [15, 0, 15, 0, 15, 0] + [0, 15]


def test_reeval_keeps_ratio_close():
    for kind in sorted(codec_data.KINDS):
        x = codec_data.make(kind, 128 << 10)
        a = _roundtrip(Lossless(reeval=1), x).size
        b = _roundtrip(Lossless(reeval=16), x).size
        assert b <= a * 1.05 + 64, kind
    with pytest.raises(ValueError):
        Lossless(reeval=0)


def test_driver_rejects_bad_mode_blocks():
    c = _test_codec()
    enc = c.encode(_mixed()).copy()
    hdr, table, _ = fmt.parse(enc)

    def rewrite(tab):
        head = fmt.pack_header(1, hdr.dtype, hdr.count, hdr.block_elems, tab,
                               hdr.payload_sum)
        pay = enc[hdr.payload_offset:hdr.total_size]
        return np.concatenate([np.frombuffer(head, np.uint8),
                               tab.view(np.uint8), pay])

    # a valid-checksum table claiming a mode nobody implements
    t = table.copy()
    t[0] = (9 << 28) | 1
    with pytest.raises(CodecError, match="block 0 uses mode 9"):
        c.decode(rewrite(t))
    # moving one byte from a raw block to a mode block: sizes still add up
    t = table.copy()
    t[0] = (15 << 28) | 2
    t[1] = 255
    with pytest.raises(CodecError, match="block 0"):
        c.decode(rewrite(t))
    # the default codec does not know mode 15
    with pytest.raises(CodecError, match="mode 15"):
        kernels.get("lossless").decode(enc)


def test_mode_discovery():
    # a missing module is skipped silently, an incomplete one with a warning
    c = Lossless(_modules={13: "erdmampi.kernels._no_such_mode"})
    assert c.modes() == {}
    with pytest.warns(RuntimeWarning, match="lacks"):
        assert lossless.available_modes({12: "numpy"}) == {}
    # a wrong MODE_ID is an error, not a silent skip
    with pytest.raises(RuntimeError, match="MODE_ID"):
        lossless.available_modes({14: __name__})
    x = np.arange(3000, dtype=np.int32)
    assert np.array_equal(c.decode(c.encode(x)), x)


def test_restrict_modes():
    c = Lossless(modes=[])
    x = codec_data.make("sparse", 32 << 10)
    enc = _roundtrip(c, x)
    assert np.all((fmt.parse(enc)[1] >> 28) == 0)


# -- corruption ----------------------------------------------------------------

def test_truncation_every_prefix():
    c = _test_codec(64)
    x = np.concatenate([np.zeros(64, np.uint8), np.arange(50, dtype=np.uint8)])
    enc = c.encode(x)
    for k in range(enc.size):
        with pytest.raises(CodecError):
            c.decode(enc[:k])


def _fuzz(c, enc, rng, rounds):
    for _ in range(rounds):
        bad = enc.copy()
        nflip = rng.integers(1, 4)
        for i in rng.integers(0, enc.size, nflip):
            bad[i] ^= np.uint8(rng.integers(1, 256))
        if np.array_equal(bad, enc):
            continue
        try:
            c.decode(bad)
        except CodecError:
            continue
        # only the reserved header bytes are unchecked
        diff = np.nonzero(bad != enc)[0]
        assert np.all((diff >= 44) & (diff < 48)), diff


def test_fuzz_corruption_caught():
    rng = np.random.default_rng(11)
    c = kernels.get("lossless")
    for kind in sorted(codec_data.KINDS):
        enc = c.encode(codec_data.make(kind, 24 << 10))
        _fuzz(c, enc, rng, 150)
    tc = _test_codec()
    _fuzz(tc, tc.encode(_mixed()), rng, 150)


def test_mode_decoders_survive_garbage():
    """Payload bytes that pass the checksum but are garbage for a mode (the
    table and checksums are recomputed): a CodecError, never a crash."""
    rng = np.random.default_rng(12)
    c = kernels.get("lossless")
    for kind in sorted(codec_data.KINDS):
        enc = c.encode(codec_data.make(kind, 24 << 10))
        hdr, table, payload = fmt.parse(enc)
        for _ in range(60):
            pay = payload.copy()
            i = rng.integers(0, pay.size, rng.integers(1, 6))
            pay[i] = rng.integers(0, 256, i.size, dtype=np.uint8)
            t = table.copy()
            # sometimes also shift a block boundary by one byte
            if rng.random() < 0.3 and t.size > 1:
                j = rng.integers(0, t.size - 1)
                if (t[j] & fmt.SIZE_MASK) > 1 and (t[j] >> 28) != 0:
                    t[j] -= 1
                    t[j + 1] += 1
            from erdmampi.kernels._checksum import checksum32
            head = fmt.pack_header(1, hdr.dtype, hdr.count, hdr.block_elems, t,
                                   int(checksum32(pay)))
            bad = np.concatenate([np.frombuffer(head, np.uint8), t.view(np.uint8), pay])
            try:
                y = c.decode(bad)
                assert y.size == hdr.count
            except CodecError:
                pass


# -- output buffers ----------------------------------------------------------

def test_out_buffer_errors():
    c = kernels.get("lossless")
    x = np.linspace(0, 1, 5000, dtype=np.float32)
    with pytest.raises(ValueError, match="too small"):
        c.encode(x, np.empty(100, np.uint8))
    buf = np.empty(c.max_encoded_size(x.size, x.dtype) + 10, np.uint8)
    enc = c.encode(x, buf)
    assert enc.base is buf or np.shares_memory(enc, buf)
    with pytest.raises(CodecError, match="dtype"):
        c.decode(enc, np.empty(5000, np.float64))
    with pytest.raises(CodecError, match="dtype"):
        c.decode(enc, np.empty(5000, np.int32))
    with pytest.raises(CodecError, match="elements"):
        c.decode(enc, np.empty(4999, np.float32))
    with pytest.raises(ValueError, match="read-only"):
        ro = np.empty(5000, np.float32)
        ro.flags.writeable = False
        c.decode(enc, ro)
    with pytest.raises(CodecError, match="codec id"):
        c.decode(kernels.get("raw").encode(x))


# -- CUDA (simulator in CI) ---------------------------------------------------

def test_cuda_test_mode_cross():
    c = _test_codec(64)
    x = np.concatenate([np.full(64, 3, np.uint8),
                        np.arange(64, dtype=np.uint8),
                        np.full(20, 9, np.uint8)])
    enc = c.encode(x)
    genc = c.encode_cuda(cuda.to_device(x))
    assert isinstance(genc, np.ndarray)
    assert genc.tobytes() == enc.tobytes()
    assert (fmt.parse(genc)[1] >> 28).tolist() == [15, 0, 15]
    assert c.decode(genc).tobytes() == x.tobytes()
    assert c.decode_cuda(enc).copy_to_host().tobytes() == x.tobytes()
    # device output for encode, device input for decode
    hout = np.zeros(c.max_encoded_size(x.size, x.dtype) + 3, np.uint8)
    hv = c.encode_cuda(cuda.to_device(x), hout)
    assert np.shares_memory(hv, hout) and hv.tobytes() == enc.tobytes()
    with pytest.raises(ValueError, match="too small"):
        c.encode_cuda(cuda.to_device(x), np.zeros(10, np.uint8))
    dout = cuda.device_array(c.max_encoded_size(x.size, x.dtype), np.uint8)
    v = c.encode_cuda(cuda.to_device(x), dout)
    assert v.copy_to_host().tobytes() == enc.tobytes()
    d = cuda.device_array(x.size, np.uint8)
    c.decode_cuda(v, d)
    assert d.copy_to_host().tobytes() == x.tobytes()
    # corruption on the device path
    bad = enc.copy()
    bad[-1] ^= 1
    with pytest.raises(CodecError):
        c.decode_cuda(bad)
    with pytest.raises(CodecError):
        c.decode_cuda(enc[:-1])
    with pytest.raises(CodecError, match="elements"):
        c.decode_cuda(enc, cuda.device_array(x.size + 1, np.uint8))


def test_cuda_empty_and_tiny():
    c = _test_codec(64)
    for x in (np.zeros(0, np.float32), np.array([1.5], np.float32)):
        enc = c.encode(x)
        genc = c.encode_cuda(cuda.to_device(x))
        assert genc.tobytes() == enc.tobytes()
        assert c.decode_cuda(enc).copy_to_host().tobytes() == x.tobytes()


@pytest.mark.parametrize("kind", sorted(codec_data.KINDS))
def test_cuda_real_modes_cross(kind):
    """CPU encode -> CUDA decode and CUDA encode -> CPU decode with every
    available mode, a few blocks of each bench kind."""
    c = Lossless(block_bytes=1024)
    x = codec_data.make(kind, 1024 + 512)   # one full block, one short
    enc = c.encode(x)
    assert c.decode_cuda(enc).copy_to_host().tobytes() == x.tobytes()
    genc = c.encode_cuda(cuda.to_device(x))
    assert c.decode(genc).tobytes() == x.tobytes()
    # the modes chosen on the GPU are real ones where the CPU found some
    if np.any(fmt.parse(enc)[1] >> 28):
        assert np.any(fmt.parse(genc)[1] >> 28)
