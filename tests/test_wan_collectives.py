"""Large-message algorithms for two ranks on two hosts (erdmampi.collectives.wan):
selection, piece layout (eager pieces for small collectives), and results on
real engine ranks over QUIC (ERDMA_SHM=0)."""
import pytest

from harness import run_mpi
from erdmampi.collectives import wan


class _T:
    def __init__(self, size, hosts):
        self.size, self.rank, self.hosts = size, 0, hosts


@pytest.mark.parametrize("size,hosts,nbytes,comm,want", [
    (2, ["a", "b"], 16 << 20, True, True),
    (2, None, 16 << 20, True, True),           # leaders' transport of hier: no labels
    (2, ["a", "a"], 16 << 20, True, False),    # one host: the ring stays
    (2, ["a", "b"], 1024, True, False),        # small: latency algorithms
    (2, ["a", "b"], 16 << 20, False, False),   # non-commutative
    (3, ["a", "b", "c"], 16 << 20, True, False),
])
def test_prefer_exchange(size, hosts, nbytes, comm, want):
    assert wan.prefer_exchange(_T(size, hosts), nbytes, comm) is want


@pytest.mark.parametrize("size,hosts,nbytes,comm,want", [
    (4, ["a", "b", "c", "d"], 16 << 20, True, True),
    (3, None, 16 << 20, True, True),
    (8, list("abcdefgh"), 16 << 20, True, True),
    (9, list("abcdefghi"), 16 << 20, True, False),   # many ranks: the ring
    (4, ["a", "a", "b", "c"], 16 << 20, True, False),  # shared host: hierarchical/ring
    (4, ["a", "b", "c", "d"], 1024, True, False),
    (4, ["a", "b", "c", "d"], 16 << 20, False, False),
    (2, ["a", "b"], 16 << 20, True, False),          # two ranks: the exchange
])
def test_prefer_direct(size, hosts, nbytes, comm, want):
    assert wan.prefer_direct(_T(size, hosts), nbytes, comm) is want


def test_exchange_pieces():
    assert wan.exchange_pieces(1) == 1
    assert wan.exchange_pieces(1 << 20) == 1
    assert wan.exchange_pieces((1 << 20) + 1) == 2
    assert wan.exchange_pieces(16 << 20) == 16
    assert wan.exchange_pieces(1 << 30) == wan.MAX_PIECES


@pytest.mark.parametrize("count,itemsize", [
    (1, 4), (3, 8), (65536, 4), ((1 << 18) - 5, 4), (1 << 18, 4), ((1 << 18) + 3, 4),
    ((1 << 17) + 1, 8), (4 << 20, 4), (1 << 20, 1), ((1 << 20) + 1, 1), (16 << 20, 1),
    ((16 << 20) + 1, 1)])
def test_wan_pieces_cover_and_split(count, itemsize):
    ranges = wan.wan_pieces(count, itemsize)
    assert ranges[0][0] == 0 and ranges[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(hi > lo for lo, hi in ranges)
    if count * itemsize <= wan.EAGER_HEAD:     # small: every piece under the eager limit
        assert len(ranges) <= wan.MAX_EAGER_PIECES
        assert all((hi - lo) * itemsize <= 65536 for lo, hi in ranges)
    else:                                      # large: ~1 MiB rendezvous pieces
        assert len(ranges) == wan.exchange_pieces(count * itemsize) <= wan.MAX_PIECES


@pytest.mark.parametrize("nbytes", [0, 5, 1 << 18, 1 << 20, (1 << 20) + 1, (3 << 20) + 7,
                                    16 << 20, (16 << 20) + 1, 40 << 20])
def test_bcast_pieces(nbytes, monkeypatch):
    rndv, eager = wan.bcast_pieces(nbytes)
    ranges = sorted(eager + rndv)
    assert ranges[0][0] == 0 and ranges[-1][1] == nbytes
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(hi - lo <= 65536 for lo, hi in eager)
    assert len(eager) <= wan.MAX_EAGER_PIECES and len(rndv) <= wan.MAX_PIECES
    if nbytes > wan.EAGER_HEAD:        # the head eagerly, the rest by rendezvous
        assert eager[-1][1] == wan.EAGER_HEAD and rndv[0][0] == wan.EAGER_HEAD
    monkeypatch.setenv("ERDMA_WAN_EAGER_HEAD", "0")
    rndv, eager = wan.bcast_pieces(nbytes)
    assert not eager and rndv == wan._rndv_pieces(nbytes, 1)


def test_wan_pieces_env(monkeypatch):
    monkeypatch.setenv("ERDMA_WAN_EAGER_HEAD", "0")
    assert wan.wan_pieces(1 << 18, 4) == [(0, 1 << 18)]
    monkeypatch.setenv("ERDMA_WAN_EAGER_HEAD", str(1 << 20))
    monkeypatch.setenv("ERDMA_EAGER_LIMIT", "16384")
    assert len(wan.wan_pieces(1 << 16, 4)) == 16       # 256 KiB in 16 KiB pieces
    assert len(wan.wan_pieces(1 << 18, 4)) == 64       # 1 MiB in 16 KiB pieces
    monkeypatch.setenv("ERDMA_WAN_EAGER_HEAD", str(16 << 20))
    assert len(wan.wan_pieces(1 << 22, 4)) == 16       # would need 1024: rendezvous
    monkeypatch.setenv("ERDMA_EAGER_LIMIT", "1000")    # too small to bother
    assert wan.wan_pieces(1 << 16, 4) == [(0, 1 << 16)]
    assert wan.wan_pieces(0, 4) == [(0, 0)]


SCRIPT = r'''
import time
import numpy as np
from erdmampi import MPI
from erdmampi import collectives as C
from erdmampi.collectives import wan

world = MPI.COMM_WORLD
r = world.Get_rank()
fails = []


class Hosts:
    """The world transport with a host label per rank (two hosts)."""
    def __init__(self, t, hosts):
        self._t, self.hosts, self.rank, self.size = t, hosts, t.rank, t.size

    def __getattr__(self, name):
        return getattr(self._t, name)


used = []
orig_ar, orig_bc = wan.allreduce_sched_exchange, wan.bcast_sched_pieces
C.ALGORITHMS["allreduce"]["sched_exchange"] = lambda *a: (used.append("ar"), orig_ar(*a))[1]
C.ALGORITHMS["bcast"]["sched_pieces"] = lambda *a: (used.append("bc"), orig_bc(*a))[1]


def fsum(a, b):
    np.add(a, b, out=b)
fsum.sched = ("SUM", np.dtype(np.float32))


def imax(a, b):
    np.maximum(a, b, out=b)
imax.sched = ("MAX", np.dtype(np.int64))

t = Hosts(world._transport(), ["h0", "h1"])
for count in (0, 1, 65536, (1 << 18) - 5, (1 << 18) + 3, (3 << 20) + 11):
    base = (np.arange(count) % 1009).astype(np.float32)
    x = base + r
    out = np.full_like(x, -1)
    del used[:]
    C.allreduce(t, x, out, fsum, True)
    if not np.array_equal(out, 2 * base + 1):
        fails.append(("allreduce", count))
    if count * 4 >= C.SCHED_MIN and used != ["ar"]:
        fails.append(("not chosen", count, used))
    inplace = base + r
    C.allreduce(t, None, inplace, fsum, True)
    if not np.array_equal(inplace, 2 * base + 1):
        fails.append(("allreduce in place", count))
    xi = np.arange(count, dtype=np.int64) * (1 - 2 * r)
    oi = np.empty_like(xi)
    C.allreduce(t, xi, oi, imax, True)
    if not np.array_equal(oi, np.abs(np.arange(count, dtype=np.int64))):
        fails.append(("allreduce max", count))
    for root in (0, 1):
        buf = base + 7 if r == root else np.zeros_like(base)
        del used[:]
        if r != root and count in ((1 << 18) - 5, (3 << 20) + 11):
            time.sleep(0.2)     # eager pieces arrive before the receives are posted
        C.bcast(t, buf, root)
        if not np.array_equal(buf, base + 7):
            fails.append(("bcast", count, root))
        if count * 4 >= C.SCHED_MIN and used != ["bc"]:
            fails.append(("bcast not chosen", count, used))
# one host: the exchange is not chosen
del used[:]
y = np.ones(1 << 20, np.float32)
C.allreduce(Hosts(world._transport(), ["h", "h"]), y.copy(), y, fsum, True)
if used or not np.all(y == 2):
    fails.append(("one host", used))
print("FAILS" if fails else "OK", r, fails, flush=True)
'''


def test_exchange_and_pieces_on_engine_ranks():
    p = run_mpi(2, SCRIPT, timeout=60, env={"ERDMA_SHM": "0"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("OK") == 2, p.stdout + p.stderr


def _direct_prelude(coll):
    """Rank-script head: each rank on a host of its own (``Hosts``), and
    ``used`` records every call of ``coll``'s sched_direct algorithm."""
    return r"""
import numpy as np
from erdmampi import MPI
from erdmampi import collectives as C

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
fails = []


class Hosts:
    def __init__(self, t, hosts):
        self._t, self.hosts, self.rank, self.size = t, hosts, t.rank, t.size

    def __getattr__(self, name):
        return getattr(self._t, name)


used = []
orig = C.ALGORITHMS["COLL"]["sched_direct"]
C.ALGORITHMS["COLL"]["sched_direct"] = lambda *a: (used.append(1), orig(*a))[1]
""".replace("COLL", coll)


DIRECT = _direct_prelude("allreduce") + r"""


def fsum(a, b):
    np.add(a, b, out=b)
fsum.sched = ("SUM", np.dtype(np.float64))

t = Hosts(world._transport(), ["h%d" % i for i in range(n)])
for count in (0, 1, 5, 65536, (1 << 18) + 3, (3 << 20) + 11):
    base = (np.arange(count) % 1009).astype(np.float64)
    want = n * base + n * (n - 1) // 2
    x = base + r
    out = np.full_like(x, -1)
    del used[:]
    C.allreduce(t, x, out, fsum, True)
    if not np.array_equal(out, want):
        fails.append(("allreduce", count))
    if count * 8 >= C.SCHED_MIN and not used:
        fails.append(("not chosen", count))
    inplace = base + r
    C.allreduce(t, None, inplace, fsum, True)
    if not np.array_equal(inplace, want):
        fails.append(("in place", count))
print("FAILS" if fails else "OK", r, fails, flush=True)
"""


@pytest.mark.parametrize("nprocs", [3, 4])
def test_direct_on_engine_ranks(nprocs):
    p = run_mpi(nprocs, DIRECT, timeout=90, env={"ERDMA_SHM": "0"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("OK") == nprocs, p.stdout + p.stderr


@pytest.mark.parametrize("hosts,nbytes,want", [
    (["a", "b"], 1 << 20, True),
    (list("abcdefgh"), 1 << 20, True),
    (list("abcdefghi"), 1 << 20, False),      # many ranks: the ring
    (["a", "a"], 1 << 20, False),             # one host: the bulk (CMA) allgather
    (["a", "b", "b"], 1 << 20, False),
    (None, 1 << 20, False),                   # no labels: as on one host
    (["a", "b"], 1024, False),                # small: latency algorithms
])
def test_prefer_allgather_direct(hosts, nbytes, want):
    size = len(hosts) if hosts else 2
    assert wan.prefer_allgather_direct(hosts, size, nbytes) is want


ALLGATHER = _direct_prelude("allgatherv") + r"""
t = Hosts(world._transport(), ["h%d" % i for i in range(n)])
for per in (0, 1, 5, 65536, (1 << 18) + 3, (1 << 20) + 1, (3 << 20) + 11):
    counts = [per + k for k in range(n)]         # unequal blocks (allgatherv)
    displs = [sum(counts[:k]) for k in range(n)]
    want = np.concatenate([(np.arange(c) * (k + 3)) % 251 for k, c in enumerate(counts)]
                          ).astype(np.uint8)
    mine = ((np.arange(counts[r]) * (r + 3)) % 251).astype(np.uint8)
    out = np.zeros(sum(counts), np.uint8)
    del used[:]
    C.allgatherv(t, mine, out, counts, displs)
    if not np.array_equal(out, want):
        fails.append(("allgatherv", per))
    if sum(counts) >= C.SCHED_MIN and not used:
        fails.append(("not chosen", per))
    inplace = np.zeros(sum(counts), np.uint8)
    inplace[displs[r]:displs[r] + counts[r]] = mine
    C.allgatherv(t, None, inplace, counts, displs)
    if not np.array_equal(inplace, want):
        fails.append(("in place", per))
print("FAILS" if fails else "OK", r, fails, flush=True)
"""


@pytest.mark.parametrize("nprocs", [2, 3])
def test_allgather_direct_on_engine_ranks(nprocs):
    p = run_mpi(nprocs, ALLGATHER, timeout=90, env={"ERDMA_SHM": "0"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("OK") == nprocs, p.stdout + p.stderr
