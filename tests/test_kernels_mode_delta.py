"""Lossless block mode 2 (DELTA): round trips, format, validation, CUDA.

CPU kernels are Numba-compiled (cached); CUDA kernels run under the
simulator (tests/conftest.py) on two or three small blocks.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

from erdmampi.kernels import _mode_delta as M
from ptxcheck import assert_compiles  # noqa: E402

RNG = np.random.default_rng(1234)


def enc(a, itemsize=None, isfloat=None, room=None, pred=-1, mask=-1):
    a = np.ascontiguousarray(a)
    src = a.reshape(-1).view(np.uint8)
    itemsize = a.dtype.itemsize if itemsize is None else itemsize
    isfloat = a.dtype.kind == "f" if isfloat is None else isfloat
    dst = np.zeros(src.size if room is None else room, np.uint8)
    k = M._encode(src, itemsize, isfloat, dst, pred, mask)
    return (None if k < 0 else dst[:k].copy()), src, itemsize, isfloat


def roundtrip(a, **kw):
    e, src, itemsize, isfloat = enc(a, **kw)
    if e is None:
        return None
    out = np.full(src.size, 0xA5, np.uint8)
    assert M.decode_block(e, itemsize, isfloat, out) == 0
    assert out.tobytes() == src.tobytes()
    return e


def smooth(n, dtype=np.float32, seed=0):
    t = np.linspace(0, 6, n)
    r = np.random.default_rng(seed)
    return (1000 + 300 * np.sin(t) + 1e-3 * r.standard_normal(n)).astype(dtype)


def specials(dtype):
    fi = np.finfo(dtype)
    u = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]
    nbits = 8 * np.dtype(dtype).itemsize
    vals = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, fi.max, -fi.max,
                     fi.tiny, -fi.tiny, fi.smallest_subnormal,
                     -fi.smallest_subnormal, 1.0, -1.0], dtype=dtype)
    payloads = np.array([(1 << (nbits - 1)) - 1, (1 << nbits) - 1,
                         ((1 << (nbits - 1)) - 1) ^ 1, 1 << (nbits - 2) | 1],
                        dtype=np.uint64).astype(u).view(dtype)  # NaNs
    return np.concatenate([vals, payloads, smooth(200, dtype), vals[::-1]])


def int_extremes(dtype):
    ii = np.iinfo(dtype)
    base = np.array([ii.min, ii.max, 0, 1, ii.min + 1, ii.max - 1, -1 if ii.min else 2],
                    dtype=dtype)
    ramp = (np.arange(300) * 7 + 11).astype(dtype)
    return np.concatenate([base, ramp, base[::-1], ramp[::-3]])


FLOATS = [np.float16, np.float32, np.float64]
INTS = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64]


def test_contract_constants():
    assert M.MODE_ID == 2
    for it in (1, 2, 4, 8):
        assert M.word_size(it) == it
    assert M.word_size(16) == 8 and M.word_size(12) == 4
    assert M.word_size(6) == 2 and M.word_size(3) == 1
    # worst case: every plane of every group stored, plus headers
    assert M.max_block_bytes(8192, 4) == 1 + 4 + 64 * 4 + 8192


@pytest.mark.parametrize("dtype", FLOATS)
def test_smooth_float_compresses(dtype):
    a = smooth(8192 // np.dtype(dtype).itemsize, dtype)
    e = roundtrip(a)
    assert e is not None and e.size < 0.8 * a.nbytes
    assert 1 <= e[0] & 7 <= 3          # a delta predictor
    assert M.estimate_block(a.view(np.uint8), a.itemsize, True) < a.nbytes


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("pred", range(5))
@pytest.mark.parametrize("mask", [0, 1])
def test_float_specials_every_variant(dtype, pred, mask):
    a = specials(dtype)
    room = M.max_block_bytes(a.nbytes, a.itemsize)
    e = roundtrip(a, room=room, pred=pred, mask=mask)
    assert e is not None and e[0] == pred | (8 * mask)
    assert e.size <= room


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("pred", range(5))
def test_int_extremes_every_variant(dtype, pred):
    a = int_extremes(dtype)
    room = M.max_block_bytes(a.nbytes, a.itemsize)
    for mask in (0, 1):
        e = roundtrip(a, room=room, pred=pred, mask=mask)
        assert e is not None and e.size <= room


@pytest.mark.parametrize("itemsize", [1, 2, 3, 4, 5, 8, 12, 16])
def test_any_length_and_itemsize(itemsize):
    for n in (1, 2, 31, 32, 33, 63, 65, 100):
        a = RNG.integers(0, 256, n * itemsize, dtype=np.uint8)
        for pred in range(5):
            e = roundtrip(a, itemsize=itemsize, isfloat=itemsize in (2, 4, 8),
                          room=M.max_block_bytes(a.size, itemsize) + 1, pred=pred)
            assert e is not None
        # automatic choice on random bytes never beats raw: refused
        assert enc(a, itemsize=itemsize, isfloat=False)[0] is None or n < 4


def test_small_integers_and_trailing_zeros():
    a = RNG.integers(0, 1000, 2048).astype(np.int32)       # random small
    e = roundtrip(a)
    assert e is not None and e[0] & 7 == 0 and e.size < 0.4 * a.nbytes
    b = (np.cumsum(RNG.integers(-3, 4, 1024)) * 256).astype(np.int64)
    e = roundtrip(b)                                         # low planes zero
    assert e is not None and e[0] & 8 and e.size < 0.15 * b.nbytes
    c = np.zeros(1000, np.float32)                           # constant
    e = roundtrip(c)
    assert e is not None and e.size == 1 + 4 + 32               # headers only


def test_refuses_when_no_room():
    a = smooth(2048)
    e, src, _, _ = enc(a)
    assert e is not None
    dst = np.zeros(e.size - 1, np.uint8)
    assert M.encode_block(src, 4, True, dst) == -1
    dst = np.zeros(e.size, np.uint8)
    assert M.encode_block(src, 4, True, dst) == e.size
    assert M.encode_block(src[:6], 4, True, dst) == -1     # not a multiple
    assert M.encode_block(src[:0], 4, True, dst) == -1


def test_smooth_benchmark_field_bits():
    from bench.codec_data import make
    x = make("smooth", 4 << 20)     # 101^3 grid (16 MiB, the benchmark: 20.0)
    b = x.view(np.uint8)
    dst = np.empty(8192, np.uint8)
    out = np.empty(8192, np.uint8)
    total = 0
    for i in range(0, b.size, 8192):
        k = M.encode_block(b[i:i + 8192], 4, True, dst)
        assert k > 0
        assert M.decode_block(dst[:k], 4, True, out) == 0
        assert out.tobytes() == b[i:i + 8192].tobytes()
        total += k
    assert total * 8 / x.size < 22.0       # the codec's target is <= 24


# -- decoder validation -------------------------------------------------------

def _valid_encodings():
    out = []
    for a, pred, mask in ((smooth(300), 2, 0), (smooth(300), 3, 1),
                          (int_extremes(np.int16), 4, 1),
                          (int_extremes(np.uint8), 0, 0),
                          (smooth(100, np.float64), 1, 1)):
        e, src, it, fl = enc(a, room=M.max_block_bytes(a.nbytes, a.itemsize),
                             pred=pred, mask=mask)
        out.append((e, src, it, fl))
    return out


def test_decode_rejects_truncation_extension_and_wrong_size():
    for e, src, it, fl in _valid_encodings():
        out = np.empty(src.size, np.uint8)
        for k in range(e.size):
            assert M.decode_block(e[:k], it, fl, out) < 0
        longer = np.concatenate([e, np.zeros(1, np.uint8)])
        assert M.decode_block(longer, it, fl, out) < 0
        for d in (-32 * it, 32 * it):          # another group count
            assert M.decode_block(e, it, fl, np.empty(src.size + d, np.uint8)) < 0
        if it > 1:                             # not a whole element
            assert M.decode_block(e, it, fl, np.empty(src.size + 1, np.uint8)) < 0


def test_decode_rejects_bad_fields():
    e, src, it, fl = _valid_encodings()[0]        # float32, D2, WIDTH
    out = np.empty(src.size, np.uint8)
    for var in (5, 6, 7, 0x10, 0x82):
        bad = e.copy()
        bad[0] = var
        assert M.decode_block(bad, it, fl, out) == M.E_VARIANT
    bad = e.copy()
    bad[5] = 33                                   # width > 32 planes
    assert M.decode_block(bad, it, fl, out) == M.E_WIDTH
    bad = e.copy()
    bad[5] += 1                                   # one plane more than stored
    assert M.decode_block(bad, it, fl, out) == M.E_LENGTH
    # NONE with a nonzero seed
    e0, src0, it0, fl0 = _valid_encodings()[3]
    bad = e0.copy()
    bad[1] = 1
    assert M.decode_block(bad, it0, fl0, np.empty(src0.size, np.uint8)) == M.E_SEED
    # a set bit in the padding of the last group (300 = 9*32 + 12 elements)
    a = np.zeros(300, np.float32)
    ez, srcz, _, _ = enc(a, room=4096, pred=1, mask=0)
    hdr = 1 + 4 + 10
    bad = np.concatenate([ez[:hdr - 1], [1], ez[hdr:], np.array([0, 0, 0, 0x80], np.uint8)])
    assert M.decode_block(bad, 4, True, np.empty(1200, np.uint8)) == M.E_PAD
    bad[-1] = 0
    bad[-4] = 1                                   # element 0 of the group: fine
    assert M.decode_block(bad, 4, True, np.empty(1200, np.uint8)) == 0


def test_decode_fuzz_in_process():
    """Random bytes and mutations: a status code, never a crash; whatever
    decodes must re-encode to something that decodes identically."""
    rng = np.random.default_rng(7)
    encs = _valid_encodings()
    for trial in range(3000):
        e, src, it, fl = encs[trial % len(encs)]
        if trial % 3 == 0:
            bad = rng.integers(0, 256, rng.integers(0, 2 * e.size), dtype=np.uint8)
        else:
            bad = e.copy()
            for _ in range(rng.integers(1, 4)):
                bad[rng.integers(0, bad.size)] = rng.integers(0, 256)
            if trial % 5 == 0:
                bad = bad[:rng.integers(0, bad.size + 1)]
        out = np.empty(src.size, np.uint8)
        assert M.decode_block(bad, it, fl, out) <= 0


BOUNDSCHECK_FUZZ = r"""
import numpy as np
from erdmampi.kernels import _mode_delta as M
rng = np.random.default_rng(11)
cases = []
for dt, fl in ((np.float32, True), (np.float64, True), (np.uint8, False), (np.int16, False)):
    a = (1000 + 300 * np.sin(np.linspace(0, 5, 70))).astype(dt)
    src = a.view(np.uint8)
    for pred in range(5):
        for mask in (0, 1):
            dst = np.zeros(M.max_block_bytes(src.size, a.itemsize), np.uint8)
            k = M._encode(src, a.itemsize, fl, dst, pred, mask)
            cases.append((dst[:k].copy(), src, a.itemsize, fl))
ok = 0
for t in range(6000):
    e, src, it, fl = cases[t % len(cases)]
    if t % 4 == 0:
        bad = rng.integers(0, 256, rng.integers(0, 2 * e.size + 2), dtype=np.uint8)
    else:
        bad = e.copy()
        for _ in range(rng.integers(1, 3)):
            bad[rng.integers(0, bad.size)] = rng.integers(0, 256)
        if t % 3 == 0:
            bad = bad[:rng.integers(0, bad.size + 1)]
    out = np.empty(src.size + (t % 7 == 0) * it, np.uint8)
    r = M.decode_block(bad, it, fl, out)
    assert r <= 0
    ok += r == 0
    assert M.estimate_block(bad[:bad.size // it * it], it, fl) >= 0
    d2 = np.empty(M.max_block_bytes(bad.size, it), np.uint8)
    k = M.encode_block(bad[:bad.size // it * it], it, fl, d2)
    if k > 0:
        o2 = np.empty(bad.size // it * it, np.uint8)
        assert M.decode_block(d2[:k], it, fl, o2) == 0
        assert o2.tobytes() == bad[:bad.size // it * it].tobytes()
for it in (1, 2, 3, 4, 5, 8, 12, 16):
    fl = it in (2, 4, 8)
    for n in (1, 31, 33, 70):
        a = rng.integers(0, 256, n * it, dtype=np.uint8)
        for pred in range(5):
            for mask in (0, 1):
                d = np.zeros(M.max_block_bytes(a.size, it), np.uint8)
                k = M._encode(a, it, fl, d, pred, mask)
                o = np.empty(a.size, np.uint8)
                assert k > 0 and M.decode_block(d[:k], it, fl, o) == 0
                assert o.tobytes() == a.tobytes()
        assert M.encode_block(a, it, fl, np.zeros(a.size // 2, np.uint8)) == -1
print("FUZZ-OK", ok)
"""


@pytest.mark.slow
def test_fuzz_with_bounds_checking(tmp_path):
    """The same kernels compiled with NUMBA_BOUNDSCHECK=1 (a private cache):
    any out-of-bounds access in decode, encode or estimate raises."""
    env = dict(os.environ, NUMBA_BOUNDSCHECK="1", NUMBA_CACHE_DIR=str(tmp_path))
    p = subprocess.run([sys.executable, "-c", BOUNDSCHECK_FUZZ], env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "FUZZ-OK" in p.stdout


# -- CUDA (simulator unless NUMBA_ENABLE_CUDASIM=0 on a GPU machine) ---------

cuda_mark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # sim: u64 wraps


def _cuda():
    from numba import cuda
    if not cuda.is_available():
        pytest.skip("no CUDA (and no simulator)")
    return cuda


def _blocks(a, bb):
    src = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    nblocks = -(-src.size // bb)
    return src, nblocks, src.size - (nblocks - 1) * bb


def _cpu_encodings(src, nblocks, bb, last, it, fl, preds=None):
    encs = []
    for i in range(nblocks):
        blk = src[i * bb:i * bb + (bb if i < nblocks - 1 else last)]
        d = np.zeros(M.max_block_bytes(bb, it), np.uint8)
        p = -1 if preds is None else preds[i % len(preds)]
        k = M._encode(blk, it, fl, d, p, -1)
        assert k > 0
        encs.append(d[:k].copy())
    return encs


def _gpu_decode(cuda, encs, ids, nblocks, bb, last, it, fl, nbytes):
    offs = np.cumsum([0] + [e.size for e in encs])[:-1].astype(np.int64)
    lens = np.array([e.size for e in encs], np.int64)
    out = cuda.to_device(np.full(nbytes, 0xEE, np.uint8))
    err = cuda.to_device(np.zeros(1, np.int32))
    M.decode_blocks_cuda(cuda.to_device(np.concatenate(encs)), cuda.to_device(offs),
                         cuda.to_device(lens), cuda.to_device(np.asarray(ids, np.int32)),
                         len(ids), bb, last, nblocks, it, fl, out, err)
    return out.copy_to_host(), int(err.copy_to_host()[0])


@cuda_mark
@pytest.mark.parametrize("a", [smooth(700), int_extremes(np.int16)[:450],
                               smooth(200, np.float64)], ids=["f32", "i16", "f64"])
def test_cuda_encode_matches_cpu_and_round_trips(a):
    cuda = _cuda()
    bb = 1024
    src, nblocks, last = _blocks(a, bb)
    slot = M.max_block_bytes(bb, a.itemsize)
    scratch = cuda.device_array(nblocks * slot, np.uint8)
    sizes = cuda.device_array(nblocks, np.int32)
    fl = a.dtype.kind == "f"
    M.encode_blocks_cuda(cuda.to_device(src), nblocks, bb, last, a.itemsize, fl,
                         scratch, slot, sizes)
    sz = sizes.copy_to_host()
    sc = scratch.copy_to_host()
    cpu = []
    for i in range(nblocks):
        blk = src[i * bb:i * bb + (bb if i < nblocks - 1 else last)]
        d = np.zeros(blk.size, np.uint8)
        k = M.encode_block(blk, a.itemsize, fl, d)
        assert k == sz[i]
        if k < 0:
            continue
        assert sc[i * slot:i * slot + k].tobytes() == d[:k].tobytes()  # same bytes
        cpu.append(d[:k])
        out = np.empty(blk.size, np.uint8)             # GPU -> CPU
        assert M.decode_block(sc[i * slot:i * slot + k], a.itemsize, fl, out) == 0
        assert out.tobytes() == blk.tobytes()
    if len(cpu) == nblocks:                            # CPU -> GPU
        out, err = _gpu_decode(cuda, cpu, range(nblocks), nblocks, bb, last,
                               a.itemsize, fl, src.size)
        assert err == 0 and out.tobytes() == src.tobytes()


@cuda_mark
def test_cuda_decodes_every_predictor_and_a_selection():
    cuda = _cuda()
    a = np.concatenate([specials(np.float32)] * 2)[:300]
    bb = 256
    src, nblocks, last = _blocks(a, bb)                 # 5 blocks, last partial
    encs = _cpu_encodings(src, nblocks, bb, last, 4, True, preds=[0, 1, 2, 3, 4])
    assert sorted(e[0] & 7 for e in encs) == [0, 1, 2, 3, 4]
    out, err = _gpu_decode(cuda, encs, range(nblocks), nblocks, bb, last, 4, True, src.size)
    assert err == 0 and out.tobytes() == src.tobytes()
    sel = [4, 1]                                        # only these blocks
    out, err = _gpu_decode(cuda, [encs[4], encs[1]], sel, nblocks, bb, last, 4, True, src.size)
    assert err == 0
    for i in range(nblocks):
        lo, hi = i * bb, min(src.size, (i + 1) * bb)
        if i in sel:
            assert out[lo:hi].tobytes() == src[lo:hi].tobytes()
        else:
            assert (out[lo:hi] == 0xEE).all()


@cuda_mark
def test_cuda_decode_flags_corruption():
    cuda = _cuda()
    a = smooth(128)
    bb = 512
    src, nblocks, last = _blocks(a, bb)
    (e,) = _cpu_encodings(src, nblocks, bb, last, 4, True)
    for bad, ids in ((e[:-1], [0]),                           # truncated
                     (np.concatenate([e, [0]]).astype(np.uint8), [0]),  # too long
                     (np.concatenate([[7], e[1:]]).astype(np.uint8), [0]),  # variant
                     (e, [3])):                                # no such block
        out, err = _gpu_decode(cuda, [bad], ids, nblocks, bb, last, 4, True, src.size)
        assert err == 1
    bad = e.copy()
    bad[5] = 40                                               # width > 32
    out, err = _gpu_decode(cuda, [bad], [0], nblocks, bb, last, 4, True, src.size)
    assert err == 1


@pytest.mark.slow
def test_cuda_kernels_compile_to_ptx():
    """The simulator does not type-check: compile the kernels for a real GPU
    (needs NVVM, not a GPU).  Caught builtin min() and a computed
    shared-array shape, which numba's CUDA target rejects."""
    assert_compiles(r"""
from erdmampi.kernels import _mode_delta as d
enc, dec = d._cuda_kernels()
b = T.boolean
ptx(enc, (A8, i, i, i, i, b, A8, i, A32))
ptx(dec, (A8, A64, A64, A32, i, i, i, i, i, b, A8, A32))
""")
