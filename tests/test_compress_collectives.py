"""Compressed collectives (erdmampi.compression, collectives/compressed.py).

* in-process: the algorithms over tests/threadranks.py (2-4 ranks as threads,
  rendezvous sends, receives of unknown length via ``irecv_upto``);
* multi-process (slow): erdmarun jobs with ERDMA_SHM=0 so the ranks talk
  QUIC on this host, driven by tests/scripts/compress_*.py;
* the device path under Numba's CUDA simulator.
"""

import numpy as np
import pytest

from harness import REPO, run_mpi
from threadranks import spawn

from erdmampi import compression as cz
from erdmampi.collectives import compressed as C
from erdmampi.kernels import get as get_codec

SCRIPTS = REPO / "tests" / "scripts"


def _have(name):
    try:
        get_codec(name)
        return True
    except (ImportError, ValueError, AttributeError):
        return False


EXACT = [c for c in ("raw", "lossless") if _have(c)]


class _Comm:
    """Stands in for a communicator in compression.plan/_state."""


def _coder(codec, dtype, coll, lossy=False, chunk=100, key=None, auto=False,
           hosts=None, rank=0):
    cd = cz.Coder(codec, np.dtype(dtype), coll, lossy=lossy, auto=auto,
                  state=cz._CommState(), key=key, hosts=hosts, rank=rank)
    cd.chunk_elems = chunk
    return cd


def _sum(a, io):
    np.add(a, io, out=io)


def _data(rank, n, dtype, seed=0):
    rng = np.random.default_rng(seed + rank)
    if np.dtype(dtype).kind == "f":
        # integer-valued floats: every summation order gives the same bits
        return rng.integers(-1000, 1000, n).astype(dtype)
    return rng.integers(-10**6, 10**6, n).astype(dtype)


@pytest.mark.parametrize("codec", EXACT)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.int32])
@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("inplace", [False, True])
def test_allreduce_exact_threads(codec, dtype, size, inplace, monkeypatch):
    n = 1037                       # several chunks of 100 per segment
    monkeypatch.setattr(C, "WINDOW", 2)   # receives posted while consuming
    want = sum(_data(r, n, dtype) for r in range(size)).astype(dtype)

    def fn(t):
        x = _data(t.rank, n, dtype)
        out = x.copy() if inplace else np.zeros_like(x)
        C.allreduce(t, None if inplace else x, out, _sum, _coder(codec, dtype, "allreduce"))
        return out
    for out in spawn(size, fn):
        assert out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("codec", EXACT)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_allreduce_noncommutative_rank_order(codec, size):
    # x OP y = 2*x + y is not associative; x OP y = x ("first") is associative
    # and not commutative: the result must be rank 0's vector
    n = 500

    def first(a, io):
        io[...] = a

    def fn(t):
        out = np.zeros(n, np.int64)
        cd = _coder(codec, np.int64, "allreduce", chunk=40)
        C.allreduce(t, _data(t.rank, n, np.int64), out, first, cd)
        return out
    for out in spawn(size, fn):
        np.testing.assert_array_equal(out, _data(0, n, np.int64))


class _Hosts:
    """A thread-rank transport with host labels (``hosts``), counting the
    messages sent and the largest one."""

    def __init__(self, t, hosts):
        self.t, self.hosts, self.rank, self.size = t, hosts, t.rank, t.size
        self.sent = []

    def isend(self, buf, dest, tag):
        self.sent.append(buf.nbytes)
        return self.t.isend(buf, dest, tag)

    def __getattr__(self, name):
        return getattr(self.t, name)


@pytest.mark.parametrize("codec", EXACT)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
@pytest.mark.parametrize("inplace", [False, True])
def test_two_host_exchange_eager_chunks(codec, dtype, inplace, monkeypatch):
    # two hosts: one phase of eager-sized chunks, each at most the eager
    # limit, several windows of receives; exact, in place or not
    monkeypatch.setenv("ERDMA_EAGER_LIMIT", "8192")
    monkeypatch.setattr(C, "EXCHANGE_WINDOW", 3)
    n = 20011
    want = (_data(0, n, dtype) + _data(1, n, dtype)).astype(dtype)

    def fn(t):
        tt = _Hosts(t, ["a", "b"])
        x = _data(t.rank, n, dtype)
        out = x.copy() if inplace else np.zeros_like(x)
        cd = _coder(codec, dtype, "allreduce", chunk=1 << 30)
        C.allreduce(tt, None if inplace else x, out, _sum, cd)
        return out, tt.sent
    for out, sent in spawn(2, fn):
        np.testing.assert_array_equal(out, want)
        assert max(sent) <= 8192, max(sent)
        per = C._eager_elems(_coder(codec, dtype, "allreduce"))
        assert len(sent) == -(-n // per) and per * np.dtype(dtype).itemsize > 4096


@pytest.mark.parametrize("hosts,exchange", [(["a", "b"], True), (["a", "a"], False)])
def test_two_host_exchange_rank_order_and_choice(hosts, exchange, monkeypatch):
    # x OP y = 2x - y is not commutative: both ranks must compute x0 OP x1;
    # two ranks of one host keep the reduce-scatter + all-gather
    monkeypatch.setenv("ERDMA_EAGER_LIMIT", "8192")
    n = 3000

    def op(a, io):
        io[...] = 2 * a - io

    def fn(t):
        tt = _Hosts(t, hosts)
        out = np.zeros(n, np.int64)
        cd = _coder("raw", np.int64, "allreduce", chunk=100)
        C.allreduce(tt, _data(t.rank, n, np.int64), out, op, cd)
        return out, tt.sent
    want = 2 * _data(0, n, np.int64) - _data(1, n, np.int64)
    for out, sent in spawn(2, fn):
        np.testing.assert_array_equal(out, want)
        # exchange: the whole vector in 3 eager chunks; else 15 chunks of 100 of
        # the peer's half, then 15 of the result
        assert len(sent) == (3 if exchange else 30), sent


@pytest.mark.parametrize("codec", EXACT)
@pytest.mark.parametrize("size", [2, 3, 4])
def test_block_collectives_exact_threads(codec, size, monkeypatch):
    blk, dt = 333, np.float64
    monkeypatch.setattr(C, "WINDOW", 2)

    def fn(t):
        me, n = t.rank, t.size
        res = {}
        for root in range(n):
            buf = _data(root, blk, dt) if me == root else np.zeros(blk, dt)
            C.bcast(t, buf, root, _coder(codec, dt, "bcast"))
            res[("bcast", root)] = buf
        root = n - 1
        send = np.concatenate([_data(p, blk, dt, 7) for p in range(n)]) if me == root else None
        recv = np.zeros(blk, dt)
        C.scatter(t, send, recv, root, _coder(codec, dt, "scatter"))
        res["scatter"] = recv
        g = np.zeros(blk * n, dt) if me == 0 else None
        C.gather(t, _data(me, blk, dt, 9), g, 0, _coder(codec, dt, "gather"))
        res["gather"] = g
        ag = np.zeros(blk * n, dt)
        C.allgather(t, _data(me, blk, dt, 11), ag, _coder(codec, dt, "allgather"))
        res["allgather"] = ag
        ag2 = np.zeros(blk * n, dt)
        ag2[me * blk:(me + 1) * blk] = _data(me, blk, dt, 11)
        C.allgather(t, None, ag2, _coder(codec, dt, "allgather"))
        res["allgather_inplace"] = ag2
        a2a = np.concatenate([_data(me * 10 + p, blk, dt, 13) for p in range(n)])
        out = np.zeros_like(a2a)
        C.alltoall(t, a2a, out, _coder(codec, dt, "alltoall"))
        res["alltoall"] = out
        C.alltoall(t, None, a2a, _coder(codec, dt, "alltoall"))
        res["alltoall_inplace"] = a2a
        return res

    results = spawn(size, fn)
    for me, res in enumerate(results):
        for root in range(size):
            np.testing.assert_array_equal(res[("bcast", root)], _data(root, blk, dt))
        np.testing.assert_array_equal(res["scatter"], _data(me, blk, dt, 7))
        if me == 0:
            np.testing.assert_array_equal(
                res["gather"], np.concatenate([_data(p, blk, dt, 9) for p in range(size)]))
        full = np.concatenate([_data(p, blk, dt, 11) for p in range(size)])
        np.testing.assert_array_equal(res["allgather"], full)
        np.testing.assert_array_equal(res["allgather_inplace"], full)
        want = np.concatenate([_data(p * 10 + me, blk, dt, 13) for p in range(size)])
        np.testing.assert_array_equal(res["alltoall"], want)
        np.testing.assert_array_equal(res["alltoall_inplace"], want)


@pytest.mark.parametrize("codec", ["int8", "int4", "bf16"])
@pytest.mark.parametrize("size", [2, 4])
def test_lossy_allreduce_identical_and_bounded(codec, size):
    from bench.codec_data import gradients
    n = 4000
    g = gradients(n * 4 * size, seed=3)[:n * size].reshape(size, n)
    exact = g.astype(np.float64).sum(0)

    def fn(t):
        out = np.zeros(n, np.float32)
        cd = _coder(codec, np.float32, "allreduce", lossy=True, chunk=1024, key="k")
        C.allreduce(t, g[t.rank].copy(), out, None, cd)
        return out, cd.bytes_in, cd.bytes_out
    res = spawn(size, fn)
    for out, _, _ in res[1:]:
        np.testing.assert_array_equal(out, res[0][0])   # bit-identical on all ranks
    rms = np.sqrt(np.mean((res[0][0] - exact) ** 2)) / np.sqrt(np.mean(exact ** 2))
    assert rms <= {"int8": 0.02, "int4": 0.2, "bf16": 0.01}[codec]
    if codec == "int8":
        bin_, bout = sum(r[1] for r in res), sum(r[2] for r in res)
        assert bin_ / bout >= 3.5


def test_irecv_upto_threadranks():
    def fn(t):
        if t.rank == 0:
            t.waitall([t.isend(np.arange(5, dtype=np.uint8), 1, 3)])
            return None
        buf = np.zeros(16, np.uint8)
        r = t.irecv_upto(buf, 0, 3)
        t.waitall([r])
        return buf, r.nbytes
    buf, nb = spawn(2, fn)[1]
    assert nb == 5 and list(buf[:6]) == [0, 1, 2, 3, 4, 0]


# -- configuration and policy (no ranks) ------------------------------------

def test_parse_mode():
    assert cz.parse_mode("INT8") == "int8"
    assert cz.parse_mode(None) is None
    assert cz.parse_mode("none") == "off"
    with pytest.raises(ValueError, match="unknown compression"):
        cz.parse_mode("zstd")


def test_link_bw_override(monkeypatch):
    monkeypatch.setenv("ERDMA_LINK_BW", "10G")
    assert cz.link_bandwidth() == pytest.approx(1.25e9)
    monkeypatch.setenv("ERDMA_LINK_BW", "fast")
    with pytest.raises(ValueError):
        cz.link_bandwidth()


def test_plan_rules(monkeypatch):
    from erdmampi import exceptions as E
    from erdmampi.op import MAX, SUM
    comm = _Comm()
    comm._chints = {}
    two_hosts, one_host = ["a", "b"], ["a", "a"]
    big = 1 << 20
    # auto: one host -> plain; two hosts and big enough -> compressed
    assert cz.plan(comm, "allreduce", "auto", np.float32, big, op=SUM, hosts=one_host) is None
    assert cz.plan(comm, "allreduce", "auto", np.float32, 100, op=SUM, hosts=two_hosts) is None
    cd = cz.plan(comm, "allreduce", "auto", np.float32, big, op=SUM, hosts=two_hosts)
    assert cd is not None and cd.auto and not cd.lossy
    assert cz.plan(comm, "bcast", "off", np.float32, big, hosts=two_hosts) is None
    cd = cz.plan(comm, "bcast", "lossless", np.int32, 8, hosts=one_host)
    assert cd is not None and not cd.auto
    # explicit lossy on ints or with MAX: MPI errors
    with pytest.raises(E.Exception) as ei:
        cz.plan(comm, "allreduce", "int8", np.int32, big, op=SUM, hosts=one_host)
    assert ei.value.Get_error_class() == E.ERR_TYPE
    with pytest.raises(E.Exception) as ei:
        cz.plan(comm, "allreduce", "int8", np.float32, big, op=MAX, hosts=one_host)
    assert ei.value.Get_error_class() == E.ERR_OP
    # a lossy *default* falls back to auto (exact)
    monkeypatch.setattr(cz._config, "mode", "int8")
    assert cz.plan(comm, "allreduce", None, np.int32, big, op=SUM, hosts=one_host) is None
    cd = cz.plan(comm, "allreduce", None, np.int32, big, op=SUM, hosts=two_hosts)
    assert cd is not None and not cd.lossy
    cd = cz.plan(comm, "allreduce", None, np.float32, big, op=SUM, hosts=one_host)
    assert cd is not None and cd.lossy and cd.name == "int8"
    assert cz.plan(comm, "bcast", None, np.float32, big, hosts=one_host) is None
    # the Info hint is explicit
    comm._chints = {cz.INFO_KEY: "bf16"}
    cd = cz.plan(comm, "bcast", None, np.float64, big, hosts=one_host)
    assert cd.lossy and cd.name == "bf16"


def test_auto_sends_raw_to_same_host_peers():
    # rank 0 and 1 share host "a", rank 2 is on "b"
    cd = _coder("lossless" if _have("lossless") else "raw", np.float32, "bcast",
                auto=True, hosts=["a", "a", "b"], rank=0)
    x = np.zeros(1000, np.float32)
    from erdmampi.kernels import header
    assert header(cd.encode(x, [1])).codec_id == 0           # raw container
    assert header(cd.encode(x, [2])).codec_id == cd.codec.codec_id


def test_feedback_reset():
    comm = _Comm()
    st = cz._state(comm)
    cz._feedback(st, ("a", 1)).get(4)[:] = 1
    cz._feedback(st, ("b", 1)).get(4)
    cz.reset_feedback(comm, "a")
    assert list(st.feedback) == [("b", 1)]
    cz.reset_feedback(comm)
    assert not st.feedback


# -- multi-process jobs (QUIC between ranks on this host) ----------------------

def _run(nprocs, script, env, timeout=240):
    base = {"ERDMA_SHM": "0", "PYTHONWARNINGS": "ignore"}
    base.update(env)
    p = run_mpi(nprocs, SCRIPTS / script, timeout=timeout, env=base)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


@pytest.mark.slow
@pytest.mark.parametrize("nprocs", [2, 4])
def test_collectives_lossless_over_quic(nprocs):
    out = _run(nprocs, "compress_cco.py", {"ERDMA_COMPRESS": "lossless",
                                           "ERDMA_COMPRESS_CHUNK": "4096"})
    assert f"compress_cco: OK size={nprocs}" in out


@pytest.mark.slow
def test_two_host_exchange_over_quic():
    # two ranks as two hosts: the compressed exchange, with eager chunks
    out = _run(2, "compress_cco.py", {"ERDMA_COMPRESS": "lossless", "ERDMA_FAKE_HOSTS": "1",
                                      "ERDMA_EAGER_LIMIT": "8192"})
    assert "compress_cco: OK size=2" in out


@pytest.mark.slow
def test_auto_one_host_does_not_compress():
    out = _run(2, "compress_auto.py", {"ERDMA_COMPRESS": ""})
    assert "compress_auto: OK" in out


@pytest.mark.slow
def test_auto_compresses_across_hosts():
    out = _run(3, "compress_auto.py", {"ERDMA_COMPRESS": "", "ERDMA_FAKE_HOSTS": "1"})
    assert "compress_auto: OK" in out


@pytest.mark.slow
def test_training_int8_error_feedback_converges():
    out = _run(4, "compress_train.py", {"ERDMA_COMPRESS": ""})
    assert "compress_train: OK size=4" in out


@pytest.mark.slow
def test_device_arrays_cudasim():
    out = _run(2, "compress_gpu.py", {"NUMBA_ENABLE_CUDASIM": "1"}, timeout=400)
    assert "compress_gpu: OK" in out


_RC = """
import os, sys
import erdmampi
erdmampi.rc.compress = {rc!r}
try:
    from erdmampi import MPI
except ValueError as e:
    print("ValueError", e); sys.exit(0)
from erdmampi import compression as cz
print("mode", cz.default_mode(), cz._config.source)
"""


@pytest.mark.slow
@pytest.mark.parametrize("rc,env,want", [
    ("int8", None, "mode int8 rc"),
    ("int8", "lossless", "mode lossless env"),      # the environment wins
    (None, None, "mode auto default"),
    ("bogus", None, "ValueError unknown rc.compress value 'bogus'"),
    # erdmarun checks the variable before starting the rank
    (None, "bogus", "ERDMA_COMPRESS='bogus' is not valid: expected off, auto, lossless"),
])
def test_rc_and_env(rc, env, want):
    e = {"ERDMA_COMPRESS": env or ""}
    p = run_mpi(1, _RC.format(rc=rc), timeout=60, env=e)
    assert want in p.stdout + p.stderr, p.stdout + p.stderr


@pytest.mark.parametrize("codec", EXACT)
def test_allreduce_fewer_elements_than_ranks(codec):
    def fn(t):
        out = np.zeros(3, np.int64)
        C.allreduce(t, np.arange(3, dtype=np.int64) + t.rank, out, _sum,
                    _coder(codec, np.int64, "allreduce"))
        return out
    for out in spawn(4, fn):
        np.testing.assert_array_equal(out, 4 * np.arange(3) + 6)


def test_error_feedback_averages_out():
    # the same int4 Allreduce repeated: with error feedback the errors of
    # successive calls cancel, so the mean of the results approaches the
    # exact sum far closer than one quantized call does
    n, size, calls = 2000, 2, 12
    rng = np.random.default_rng(5)
    xs = rng.standard_normal((size, n)).astype(np.float32)
    exact = xs.astype(np.float64).sum(0)

    def run(ncalls):
        def fn(t):
            st = cz._CommState()
            outs = []
            for _ in range(ncalls):
                cd = cz.Coder("int4", np.dtype(np.float32), "allreduce", lossy=True,
                              auto=False, state=st, key="k")
                out = np.zeros(n, np.float32)
                C.allreduce(t, xs[t.rank].copy(), out, None, cd)
                outs.append(out)
            return np.mean(outs, axis=0), len(st.feedback)
        return spawn(size, fn)[0]

    mean_ef, nres = run(calls)
    one, _ = run(1)
    assert nres > 0                                        # residuals were kept
    err_ef = np.abs(mean_ef - exact).mean()
    err_one = np.abs(one - exact).mean()
    assert err_ef < 0.35 * err_one, (err_ef, err_one)


def test_reset_feedback_by_user_key():
    comm = _Comm()
    st = cz._state(comm)

    def fn(t):
        cd = cz.Coder("int8", np.dtype(np.float32), "allreduce", lossy=True, auto=False,
                      state=st if t.rank == 0 else cz._CommState(), key="layer1")
        C.allreduce(t, np.linspace(-1, 1, 3000, dtype=np.float32), np.zeros(3000, np.float32),
                    None, cd)
    spawn(2, fn)
    assert st.feedback and all(k[0] == "layer1" for k in st.feedback)
    cz.reset_feedback(comm, "other")
    assert st.feedback
    cz.reset_feedback(comm, "layer1")
    assert not st.feedback
