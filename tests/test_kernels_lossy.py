"""Lossy codecs (bf16, blockwise int8/int4): error bounds, error feedback,
decode_accumulate, validation, CPU/CUDA wire format (CUDA simulator), and a
small data-parallel training run that converges with error feedback."""

import numpy as np
import pytest

from erdmampi import kernels
from erdmampi.kernels import CodecError, ErrorFeedback
from erdmampi.kernels.lossy import BF16, Int4, Int8

from bench.codec_data import make

ALL = [BF16, Int8, Int4]


def _data(n, seed=0, dtype=np.float32):
    """Values over many magnitudes, both signs, some exact zeros."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * np.exp(rng.uniform(-6, 6, n))
    x[::17] = 0.0
    return x.astype(dtype)


def _bf16_ref(x32):
    """bfloat16 round-to-nearest-even of float32 values, as float32 (numpy
    reference, independent of the kernels: via float64 arithmetic)."""
    x = x32.astype(np.float64)
    m, e = np.frexp(np.abs(x))            # |x| = m * 2**e, m in [0.5, 1)
    e = np.maximum(e, -125)               # bfloat16 subnormals: fixed quantum
    q = np.ldexp(np.rint(np.ldexp(np.abs(x), 8 - e)), e - 8)
    return (np.sign(x) * q).astype(np.float32)


def _groups_absmax(v, g):
    n = v.size
    pad = (-n) % g
    a = np.abs(np.concatenate([v, np.zeros(pad, v.dtype)])).reshape(-1, g).max(1)
    return np.repeat(a, g)[:n]


# -- registry and round trips -------------------------------------------------

@pytest.mark.parametrize("name,cls,cid", [("bf16", BF16, 8), ("int8", Int8, 9),
                                          ("int4", Int4, 10)])
def test_registry(name, cls, cid):
    c = kernels.get(name)
    assert type(c) is cls and c.codec_id == cid and not c.lossless
    assert kernels.by_id(cid) is c


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 255, 256, 1000])
def test_roundtrip_shape_dtype(cls, dtype, n):
    c = cls(block=256) if cls is not Int4 else cls(group=64, block=256)
    x = _data(n, dtype=dtype)
    enc = c.encode(x)
    assert len(enc) == c.encoded_size(n) == c.max_encoded_size(n, dtype)
    h = kernels.header(enc)
    assert h.count == n and h.dtype == np.dtype(dtype) and h.codec_id == c.codec_id
    y = kernels.decode(enc)
    assert y.dtype == np.dtype(dtype) and y.shape == (n,)
    out = np.full(n, 7, dtype)
    assert c.decode(enc, out) is out
    np.testing.assert_array_equal(out, y)
    if dtype is np.float64 and n:
        # float64 input is converted to float32 first: same payload as float32
        e32 = c.encode(x.astype(np.float32))
        np.testing.assert_array_equal(e32[48:], enc[48:])


def test_ratios():
    n = 1 << 20
    assert 1.99 < BF16().ratio() <= 2.0
    assert Int8().ratio() == pytest.approx(32 / (8 + 32 / 256), rel=2e-3)
    assert Int8().ratio() >= 3.5
    assert Int4().ratio() == pytest.approx(32 / (4 + 32 / 128), rel=2e-3)
    assert Int8().encoded_size(n) == 48 + 4 * (n // 8192) + n + 4 * (n // 256)


# -- error bounds ------------------------------------------------------------

def test_bf16_round_to_nearest_even_and_bound():
    x = _data(20000, seed=1)
    y = BF16().decode(BF16().encode(x))
    np.testing.assert_array_equal(y, _bf16_ref(x))
    nz = np.abs(x) >= np.float32(2.0 ** -126)
    rel = np.abs(y[nz] - x[nz]) / np.abs(x[nz])
    assert rel.max() <= 2.0 ** -8
    # ties go to even
    one = np.float32(1.0)
    t = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20],
                 np.float32)
    y = BF16().decode(BF16().encode(t))
    np.testing.assert_array_equal(y, [one, 1 + 2 ** -6, -one, 1 + 2 ** -7])


def test_bf16_specials():
    f = np.finfo(np.float32)
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, f.max, -f.max, 3.3e38, 0.0, -0.0,
                  1e-40, -1e-45, f.tiny, 1.0], np.float32)
    y = BF16().decode(BF16().encode(x))
    assert np.isnan(y[:2]).all()
    assert y[2] == np.inf and y[3] == -np.inf
    assert y[4] == np.inf and y[5] == -np.inf         # rounds past the largest bf16
    assert y[6] == _bf16_ref(x[6:7])[0] and np.isfinite(y[6])
    assert y[7] == 0 and not np.signbit(y[7]) and y[8] == 0 and np.signbit(y[8])
    np.testing.assert_array_equal(y[9:], _bf16_ref(x[9:]))
    enc = BF16().encode(x)
    assert set(enc[48 + 4:48 + 4 + 4].view("<u2")) <= {0x7FC0, 0xFFC0}  # quiet NaNs


def test_bf16_float64_bound():
    x = _data(5000, seed=2, dtype=np.float64)
    y = BF16().decode(BF16().encode(x))
    assert y.dtype == np.float64
    nz = np.abs(x) > 1e-37
    rel = np.abs(y[nz] - x[nz]) / np.abs(x[nz])
    assert rel.max() <= 2.0 ** -8 * (1 + 2.0 ** -15)


@pytest.mark.parametrize("cls,div", [(Int8, 254), (Int4, 14)])
@pytest.mark.parametrize("group", [None, 32])
def test_quant_bound(cls, div, group):
    c = cls(group=group)
    rng = np.random.default_rng(3)
    n = 20000 + 5
    # groups with very different magnitudes
    x = (rng.standard_normal(n) * np.repeat(np.exp(rng.uniform(-20, 20, n // 16 + 1)), 16)[:n]
         ).astype(np.float32)
    y = c.decode(c.encode(x))
    bound = _groups_absmax(x, c.group) / div
    err = np.abs(y - x)
    assert (err <= bound * (1 + 1e-6)).all()
    assert np.abs(err).max() > 0


@pytest.mark.parametrize("cls,div", [(Int8, 254), (Int4, 14)])
def test_quant_near_float32_max(cls, div):
    """qmax * (absmax / qmax) may round past the float32 maximum: decoded
    values are clamped to it instead of becoming Inf."""
    f = np.finfo(np.float32)
    x = np.array([f.max, -f.max, f.max * np.float32(0.999), 1.0] * 8, np.float32)
    c = cls(group=32)
    ef = ErrorFeedback()
    y = c.decode(c.encode(x, feedback=ef))
    assert np.isfinite(y).all() and np.isfinite(ef.residual).all()
    assert (np.abs(y.astype(np.float64) - x) <= float(f.max) / div * (1 + 1e-6)).all()


@pytest.mark.parametrize("cls,div", [(Int8, 254), (Int4, 14)])
def test_quant_tiny_and_zero_groups(cls, div):
    c = cls(group=32)
    x = np.zeros(32 * 4, np.float32)
    x[32:64] = np.linspace(-1e-35, 1e-35, 32)    # qmax/absmax overflows float32
    x[64:96] = np.linspace(-3e-30, 5e-30, 32)    # absmax < 2**-100
    x[96:] = np.linspace(-1, 1, 32)
    y = c.decode(c.encode(x))
    assert np.isfinite(y).all()
    assert (y[:32] == 0).all()
    for s in (slice(32, 64), slice(64, 96), slice(96, 128)):
        amax = np.abs(x[s]).max()
        # scale = absmax/qmax may be subnormal for absmax < ~1.5e-36: one more
        # float32 subnormal quantum per unit of code
        assert (np.abs(y[s] - x[s]) <= amax / div * (1 + 1e-6) + 127 * 2.0 ** -149).all()


@pytest.mark.parametrize("cls", [Int8, Int4])
def test_quant_nonfinite_groups(cls):
    c = cls(group=32)
    x = np.linspace(-1, 1, 32 * 4).astype(np.float32)
    x[40] = np.nan
    x[100] = -np.inf
    enc = c.encode(x)
    y = c.decode(enc)
    assert np.isnan(y[32:64]).all() and np.isnan(y[96:128]).all()
    assert np.isfinite(y[:32]).all() and np.isfinite(y[64:96]).all()
    ef = ErrorFeedback()
    c.encode(x, feedback=ef)
    assert (ef.residual[32:64] == 0).all() and np.isfinite(ef.residual).all()
    with pytest.raises(ValueError, match="NaN or Inf"):
        cls(group=32, nonfinite="raise").encode(x)
    cls(group=32, nonfinite="raise").encode(np.nan_to_num(x))


def test_bf16_nonfinite_raise_and_residual():
    x = np.array([1.0, np.nan, np.inf, 2.0], np.float32)
    with pytest.raises(ValueError, match="NaN or Inf"):
        BF16(nonfinite="raise").encode(x)
    ef = ErrorFeedback()
    BF16().encode(x, feedback=ef)
    assert np.isfinite(ef.residual).all()


# -- gradients: the codecs' targets -----------------------------------------

def test_gradients_ratio_and_rms():
    g = make("gradients", 1 << 20)
    rms = {}
    for c in (BF16(), Int8(), Int4()):
        enc = c.encode(g)
        y = c.decode(enc)
        rms[c.name] = np.linalg.norm(g - y) / np.linalg.norm(g)
        if c.name == "int8":
            assert g.nbytes / len(enc) >= 3.5
    assert rms["bf16"] <= 2.0 ** -8
    assert rms["int8"] <= 0.02
    assert rms["int8"] < rms["int4"] < 0.25


# -- error feedback and accumulation --------------------------------------------

@pytest.mark.parametrize("cls", ALL)
def test_error_feedback_residual_is_exact(cls):
    c = cls(group=64) if cls is not BF16 else cls()
    ef = ErrorFeedback()
    rng = np.random.default_rng(4)
    total = np.zeros(1000, np.float64)
    sent = np.zeros(1000, np.float64)
    for step in range(6):
        x = rng.standard_normal(1000).astype(np.float32)
        prev = ef.get(1000).copy()
        y = c.decode(c.encode(x, feedback=ef))
        np.testing.assert_array_equal(ef.residual, (x + prev) - y)
        total += x
        sent += y
    # telescoping: what was sent plus what is still owed equals what came in
    np.testing.assert_allclose(sent + ef.residual, total, atol=1e-4)


def test_feedback_resizes_and_is_float32():
    ef = ErrorFeedback()
    Int8().encode(np.ones(10, np.float32), feedback=ef)
    assert ef.residual.dtype == np.float32 and ef.residual.size == 10
    Int8().encode(np.ones(20, np.float64), feedback=ef)
    assert ef.residual.size == 20


@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("acc_dtype", [np.float32, np.float64])
def test_decode_accumulate(cls, acc_dtype):
    c = cls()
    x = _data(3000, seed=5)
    enc = c.encode(x)
    acc = np.linspace(-3, 3, 3000).astype(acc_dtype)
    want = acc + c.decode(enc).astype(acc_dtype)
    assert c.decode_accumulate(enc, acc) is acc
    np.testing.assert_array_equal(acc, want)
    with pytest.raises(CodecError):
        c.decode_accumulate(enc, np.zeros(2999, np.float32))
    with pytest.raises(TypeError):
        c.decode_accumulate(enc, np.zeros(3000, np.int32))


# -- validation --------------------------------------------------------------------

@pytest.mark.parametrize("cls", ALL)
def test_corrupt_and_mismatched_input(cls):
    c = cls()
    x = _data(5000, seed=6)
    enc = c.encode(x).copy()
    bad = enc.copy()
    bad[-3] ^= 0x40
    with pytest.raises(CodecError, match="checksum"):
        c.decode(bad)
    with pytest.raises(CodecError):
        c.decode(enc[:-1])
    with pytest.raises(CodecError):
        c.decode(enc[:30])
    bad = enc.copy()
    bad[32] ^= 1                                   # codec parameter
    with pytest.raises(CodecError):
        c.decode(bad)
    other = Int4() if cls is not Int4 else Int8()
    with pytest.raises(CodecError):
        other.decode(enc)
    with pytest.raises(CodecError):
        c.decode(enc, np.empty(5000, np.float64))
    with pytest.raises(CodecError):
        c.decode(enc, np.empty(4999, np.float32))
    with pytest.raises(TypeError):
        c.encode(np.arange(10))
    with pytest.raises(ValueError, match="too small"):
        c.encode(x, np.empty(100, np.uint8))


def test_random_garbage_never_crashes():
    rng = np.random.default_rng(7)
    enc = Int8(group=32, block=64).encode(_data(300))
    for _ in range(200):
        b = enc.copy()
        i = rng.integers(0, b.size, rng.integers(1, 4))
        b[i] = rng.integers(0, 256, i.size)
        try:
            kernels.decode(b)
        except CodecError:
            pass


def test_bad_parameters():
    with pytest.raises(ValueError):
        Int8(group=100)
    with pytest.raises(ValueError):
        Int8(group=512, block=256)
    with pytest.raises(ValueError):
        BF16(block=3)
    with pytest.raises(ValueError):
        Int8(nonfinite="ignore")


# -- CUDA (simulator in CI): same wire format both ways ----------------------------

def _cuda():
    numba_cuda = pytest.importorskip("numba.cuda")
    return numba_cuda


def _gpu_cases():
    f = np.finfo(np.float32)
    x = _data(200, seed=8)
    x[[3, 4, 5, 6, 7, 8]] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, 1e-40, f.max, -0.0, 3e-37]
    return x


# the simulator computes in numpy scalars, which warn where the clamp to the
# float32 maximum applies
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("cls", ALL)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cuda_same_bytes_and_cross_decode(cls, dtype):
    cuda = _cuda()
    c = cls(block=64) if cls is BF16 else cls(group=32, block=64)
    x = _gpu_cases().astype(dtype)
    x[150] = np.nan                         # one non-finite group
    e_cpu = c.encode(x)
    e_gpu = c.encode_cuda(cuda.to_device(x)).copy_to_host()
    np.testing.assert_array_equal(e_gpu, e_cpu)
    y_cpu = c.decode(e_cpu)
    y_gpu = c.decode_cuda(cuda.to_device(e_cpu)).copy_to_host()  # device input
    assert y_gpu.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y_gpu, y_cpu)
    y_host_in = c.decode_cuda(e_cpu).copy_to_host()               # host input
    np.testing.assert_array_equal(y_host_in, y_cpu)
    acc = np.linspace(0, 1, x.size).astype(np.float32)
    dacc = cuda.to_device(acc)
    c.decode_accumulate_cuda(e_gpu, dacc)
    np.testing.assert_array_equal(dacc.copy_to_host(), acc + y_cpu.astype(np.float32))


@pytest.mark.parametrize("cls", ALL)
def test_cuda_error_feedback_matches_cpu(cls):
    cuda = _cuda()
    c = cls(block=64) if cls is BF16 else cls(group=32, block=64)
    ef_cpu, ef_gpu = ErrorFeedback(), ErrorFeedback()
    rng = np.random.default_rng(9)
    for _ in range(2):
        x = rng.standard_normal(100).astype(np.float32)
        a = c.encode(x, feedback=ef_cpu)
        b = c.encode_cuda(cuda.to_device(x), feedback=ef_gpu).copy_to_host()
        np.testing.assert_array_equal(a, b)
        # the simulator has no FMA: residuals are bit-identical here
        np.testing.assert_array_equal(ef_gpu.residual.copy_to_host(), ef_cpu.residual)


def test_cuda_rejects_corrupt():
    cuda = _cuda()
    c = Int8(group=32, block=64)
    enc = c.encode(_data(100)).copy()
    enc[-1] ^= 0xFF
    with pytest.raises(CodecError, match="checksum"):
        c.decode_cuda(cuda.to_device(enc))
    with pytest.raises(CodecError):
        c.decode_cuda(cuda.to_device(enc[:40]))


# -- error feedback keeps data-parallel training on track ---------------------------

def _logreg_problem(seed, n=2048, d=256, workers=4):
    rng = np.random.default_rng(seed)
    # features on scales 0.02..1: small gradient components sit far below the
    # group absmax, which is where int4 without feedback loses them
    scales = np.exp(rng.uniform(np.log(0.02), 0, d)).astype(np.float32)
    w_true = rng.standard_normal(d).astype(np.float32) / scales
    X = (rng.standard_normal((n, d)) * scales).astype(np.float32)
    p = 1 / (1 + np.exp(-(X @ w_true) / np.sqrt(d)))
    y = (rng.random(n) < p).astype(np.float32)
    return np.array_split(X, workers), np.array_split(y, workers), X, y


def _train(codec, feedback, seed, steps=200, lr=np.float32(2.0)):
    """4 workers, full-batch gradient descent on their own shard, gradients
    averaged each step through ``codec`` (each worker encodes, the average
    is taken by decode_accumulate in float32, as an allreduce owner would)."""
    Xs, ys, X, y = _logreg_problem(seed)
    w = np.zeros(X.shape[1], np.float32)
    efs = [ErrorFeedback() for _ in Xs]
    for _ in range(steps):
        grads = []
        for Xk, yk in zip(Xs, ys):
            pk = 1 / (1 + np.exp(-(Xk @ w)))
            grads.append((Xk.T @ (pk - yk) / len(yk)).astype(np.float32))
        if codec is None:
            g = np.mean(grads, axis=0)
        else:
            g = np.zeros_like(w)
            for gk, ef in zip(grads, efs):
                codec.decode_accumulate(codec.encode(gk, feedback=ef if feedback else None), g)
            g /= np.float32(len(grads))
        w -= lr * g
    z = X @ w
    return float(np.mean(np.logaddexp(0, z) - y * z))


@pytest.mark.parametrize("seed", [0, 1])
def test_error_feedback_training_converges_like_exact(seed):
    exact = _train(None, False, seed)
    assert exact < 0.65                       # it learned something (log 2 = 0.693)
    int8_ef = _train(Int8(), True, seed)
    int4_ef = _train(Int4(), True, seed)
    int4_raw = _train(Int4(), False, seed)
    # measured (seeds 0-3): |int8+EF - exact| <= 1e-6, |int4+EF - exact| <= 3e-5,
    # int4 without feedback 6e-3..1.2e-2 above exact
    assert abs(int8_ef - exact) < 1e-4
    assert abs(int4_ef - exact) < 5e-4
    assert int4_raw - exact > 2e-3
    assert int4_raw - exact > 10 * abs(int4_ef - exact)
