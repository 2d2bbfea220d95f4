"""Schedules run by the C engine: the reduction kernels against NumPy, and the
schedule-based collectives (erdmampi.collectives.sched) on 2-4 ranks."""
import numpy as np
import pytest

from _ranks import SCRIPTS, assert_ok
from harness import run_mpi
from erdmampi import _engine
from erdmampi import op as mpiop
from erdmampi.datatype import PREDEFINED

OPS = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR"]
MPI_TYPE = {"int8": "INT8_T", "int16": "INT16_T", "int32": "INT32_T", "int64": "INT64_T",
            "uint8": "UINT8_T", "uint16": "UINT16_T", "uint32": "UINT32_T",
            "uint64": "UINT64_T", "float32": "FLOAT", "float64": "DOUBLE",
            "complex64": "C_FLOAT_COMPLEX", "complex128": "C_DOUBLE_COMPLEX"}


def _valid(op, dt):
    kind = np.dtype(dt).kind
    if kind == "c":
        return op in ("SUM", "PROD")
    if kind == "f":
        return op not in ("BAND", "BOR", "BXOR")
    return True


CASES = [(op, dt) for dt in MPI_TYPE for op in OPS if _valid(op, dt)]


def _inputs(dt, n=1027, seed=0):
    rng = np.random.default_rng(seed)
    d = np.dtype(dt)
    if d.kind in "iu":
        info = np.iinfo(d)                       # full range: overflow wraps
        a = rng.integers(info.min, info.max, n, dtype=d, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=d, endpoint=True)
        a[:4] = [0, 0, 1, info.max]
        b[:4] = [0, 5, 0, info.max]
        return a, b
    special = [np.nan, 1.0, np.nan, -0.0, 0.0, np.inf, -np.inf, 0.0]
    other = [1.0, np.nan, np.nan, 0.0, -0.0, 1.0, np.inf, np.nan]
    a = rng.normal(size=n) * 1e3
    b = rng.normal(size=n) * 1e3
    a[:8], b[:8] = special, other
    if d.kind == "c":
        with np.errstate(all="ignore"):
            a = a + 1j * rng.normal(size=n)
            b = b + 1j * np.roll(b, 3)
    return a.astype(d), b.astype(d)


def _c_reduce(a, b, op, dt):
    out = b.copy()
    _engine.reduce_local(a.ctypes.data, out.ctypes.data, a.size,
                         _engine.SCHED_OPS[op], _engine.SCHED_DTYPES[dt])
    return out


@pytest.mark.parametrize("op,dt", CASES)
def test_kernel_matches_numpy_op(op, dt):
    """C kernel == erdmampi.op (the NumPy reference), bit for bit: NaN order
    (MAX/MIN keep the left operand's NaN), -0.0, wraparound, logical 0/1."""
    a, b = _inputs(dt)
    ref = b.copy()
    with np.errstate(all="ignore"):
        getattr(mpiop, op)._apply(a, ref, PREDEFINED[MPI_TYPE[dt]])
    got = _c_reduce(a, b, op, dt)
    assert got.tobytes() == ref.tobytes() or (
        np.dtype(dt).kind == "c" and np.allclose(got, ref, equal_nan=True, rtol=1e-6))


def test_kernel_semantics_spelled_out():
    a = np.array([np.nan, 1.0, -0.0, 0.0, 3.0])
    b = np.array([1.0, np.nan, 0.0, -0.0, 2.0])
    mx = _c_reduce(a, b, "MAX", "float64")
    assert np.isnan(mx[0]) and mx[1] == 1.0          # io = (io > a) ? io : a
    assert np.signbit(mx[2]) and not np.signbit(mx[3])  # ties take `in`
    assert mx[4] == 3.0
    i8 = _c_reduce(np.array([127, -128, 100], np.int8), np.array([1, -1, 100], np.int8),
                   "SUM", "int8")
    assert i8.tolist() == [-128, 127, -56]
    p = _c_reduce(np.array([2**62], np.int64), np.array([4], np.int64), "PROD", "int64")
    assert p.tolist() == [0]
    u = _c_reduce(np.array([65535], np.uint16), np.array([65535], np.uint16), "PROD", "uint16")
    assert u.tolist() == [1]
    land = _c_reduce(np.array([np.nan, 0.0, 2.0]), np.array([1.0, 1.0, -0.0]), "LAND", "float64")
    assert land.tolist() == [1.0, 0.0, 0.0]
    lx = _c_reduce(np.array([5, 0, 3], np.int32), np.array([0, 0, 7], np.int32), "LXOR", "int32")
    assert lx.tolist() == [1, 0, 0]


def test_kernel_bad_pairs_and_sizes():
    a = np.zeros(4, np.complex64)
    with pytest.raises(_engine.EngineError):
        _c_reduce(a, a, "MAX", "complex64")
    f = np.zeros(4)
    with pytest.raises(_engine.EngineError):
        _c_reduce(f, f, "BAND", "float64")
    with pytest.raises(_engine.EngineError):
        _engine.reduce_local(f.ctypes.data, f.ctypes.data, 4, 99, _engine.SCHED_DTYPES["int8"])
    _engine.reduce_local(0, 0, 0, _engine.SCHED_OPS["SUM"], _engine.SCHED_DTYPES["int8"])


def test_kernel_large_vector():
    a = np.arange(3 << 20, dtype=np.float32)
    b = np.ones(3 << 20, dtype=np.float32)
    assert np.array_equal(_c_reduce(a, b, "SUM", "float32"), a + b)


def test_schedule_local_steps():
    """A schedule of local steps only (no peers): copy then chunkwise reduce."""
    eng = _engine.Engine.create(0, 1)
    try:
        src = np.arange(100000, dtype=np.int32)
        mid = np.zeros_like(src)
        acc = np.ones_like(src)
        s = _engine.Schedule(eng, 4096)
        c = s.copy(src.ctypes.data, mid.ctypes.data, src.nbytes)
        r = s.reduce(mid.ctypes.data, acc.ctypes.data, src.size, _engine.SCHED_OPS["SUM"],
                     _engine.SCHED_DTYPES["int32"])
        s.after(r, c, True)
        s.barrier()
        s.copy(acc.ctypes.data, mid.ctypes.data, src.nbytes)
        s.run()
        assert np.array_equal(acc, src + 1) and np.array_equal(mid, src + 1)
        bad = _engine.Schedule(eng)
        with pytest.raises(_engine.EngineError):
            bad.after(0, 0)
        with pytest.raises(_engine.EngineError):
            bad.reduce(0, 0, 1, _engine.SCHED_OPS["BAND"], _engine.SCHED_DTYPES["float32"])
    finally:
        eng.shutdown(1.0)


@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_sched_collectives_all_ops(nprocs):
    """Every op/dtype, sizes 0/1/odd, many chunks (4 KiB), sub-communicators."""
    env = {"ERDMA_SCHED_MIN": "0", "ERDMA_SCHED_CHUNK": "4096"}
    assert_ok(_run("small", nprocs, env), "sched.py", nprocs)


@pytest.mark.parametrize("nprocs", [2, 3])
def test_sched_collectives_large(nprocs):
    """16 MiB+ vectors with the default chunking and thresholds."""
    assert_ok(_run("large", nprocs, {}), "sched.py", nprocs)


def test_sched_collectives_large_quic():
    assert_ok(_run("large", 2, {"ERDMA_SHM": "0"}), "sched.py", 2)


def test_nonblocking_allreduce_overlaps_python():
    """Iallreduce of 64 MiB progresses in the C worker while both ranks run
    pure-Python code: the Wait afterwards is a fraction of the collective."""
    assert_ok(_run("overlap", 2, {}), "sched.py", 2)


def _run(mode, nprocs, env):
    return run_mpi(nprocs, str(SCRIPTS / "sched.py"), args=[mode], timeout=150, env=env)


#: rank script: the schedule algorithms on the real engine.  The
#: hierarchical ones get fake host labels through a wrapping transport, and
#: their phases run on sub-transports whose schedules (sched_ring,
#: sched_chain) are renumbered to the parent's ranks.
_ALGOS_SCRIPT = r"""
import sys
import numpy as np
from erdmampi import MPI
from erdmampi import collectives as C

world = MPI.COMM_WORLD
n, r = world.Get_size(), world.Get_rank()
fails = []


class Hosts:
    def __init__(self, t, hosts):
        self._t, self.hosts, self.rank, self.size = t, hosts, t.rank, t.size

    def __getattr__(self, name):
        return getattr(self._t, name)


def check(cond, what):
    if not cond:
        fails.append(what)
        print("FAIL", r, what, flush=True)


def fsum(a, b):
    np.add(a, b, out=b)
fsum.sched = ("SUM", np.dtype(np.float64))

hosts = ["h%d" % (i % 2) for i in range(n)]
for count in (0, 1, 1001, 1 << 20):
    x = np.arange(count, dtype=np.float64) * (r + 1)
    out = np.empty_like(x)
    t = Hosts(world._transport(), hosts)
    C.allreduce(t, x, out, fsum, True)
    check(np.array_equal(out, np.arange(count) * (n * (n + 1) // 2)), ("allreduce", count))
    for root in range(n):
        buf = np.arange(count, dtype=np.float64) + root if r == root else np.zeros(count)
        C.bcast(Hosts(world._transport(), hosts), buf, root)
        check(np.array_equal(buf, np.arange(count) + root), ("bcast", count, root))

for algo in ("bruck", "recursive_doubling"):
    for cnt in (0, 3, 70000):
        counts = [cnt + i for i in range(n)]
        recv = np.zeros(sum(counts), np.int32)
        C.allgatherv(world._transport(), np.full(counts[r], r, np.int32), recv, counts,
                     None, algorithm=algo)
        check(np.array_equal(recv, np.repeat(np.arange(n, dtype=np.int32), counts)),
              ("allgatherv", algo, cnt))

for algo in sorted(C.ALGORITHMS["alltoall"]):
    for blk in (0, 1, 5, 50000):
        send = np.repeat(np.arange(n, dtype=np.int64) + 10 * r, blk)
        recv = np.empty_like(send)
        C.alltoall(world._transport(), send, recv, algorithm=algo)
        check(np.array_equal(recv, np.repeat(np.arange(n) * 10 + r, blk)),
              ("alltoall", algo, blk))

for algo in ("binomial", "linear"):
    for blk in (0, 2, 30000):
        src = np.arange(n * blk, dtype=np.int16)
        mine = np.empty(blk, np.int16)
        root = n - 1
        C.scatter(world._transport(), src if r == root else None, mine, root, algorithm=algo)
        check(np.array_equal(mine, src[r * blk:(r + 1) * blk]), ("scatter", algo, blk))
        back = np.zeros(n * blk, np.int16) if r == 1 else None
        C.gather(world._transport(), mine, back, 1, algorithm=algo)
        if r == 1:
            check(np.array_equal(back, src), ("gather", algo, blk))

bad = world.allreduce(len(fails))
if r == 0:
    print("algos: " + ("OK" if bad == 0 else "%d FAILURES" % bad), "size=%d" % n, flush=True)
sys.exit(1 if fails else 0)
"""


@pytest.mark.parametrize("nprocs", [3, 4])
def test_new_algorithms_on_engine(nprocs):
    """Bruck / recursive doubling allgather, Bruck alltoall, binomial
    gather/scatter and the hierarchical allreduce/bcast (fake hosts, with
    C schedules inside their phases) on real ranks."""
    assert_ok(run_mpi(nprocs, _ALGOS_SCRIPT, timeout=120), "algos.py", nprocs)
