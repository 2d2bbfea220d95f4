"""Every collective algorithm of erdmampi.collectives, forced one by one, on
1..8 thread ranks (tests/threadranks.py), against numpy-computed results."""

from __future__ import annotations

import os

import numpy as np
import pytest

import erdmampi.collectives as C
from erdmampi.collectives import base
from threadranks import Deadlock, spawn

SIZES = [1, 2, 3, 4, 5, 7, 8]
COUNTS = [0, 1, 13]
LARGE = 1 << 20
DTYPES = [np.int32, np.float64, np.complex128, np.uint8]


# -- operations --------------------------------------------------------------

def op_sum(a, b):
    np.add(a, b, out=b)


def op_max(a, b):
    np.maximum(a, b, out=b)


#: 2x2 integer matrices mod P: associative, not commutative
MAT = np.dtype([("m", np.int64, (2, 2))])
P = 1000003


def op_matmul(a, b):
    b["m"] = np.matmul(a["m"], b["m"]) % P


def mat_data(rank, count, salt=0):
    rng = np.random.default_rng(1000 * rank + salt)
    out = np.empty(count, dtype=MAT)
    out["m"] = rng.integers(0, 7, size=(count, 2, 2))
    return out


def mat_fold(items):
    acc = items[0]["m"].copy()
    for x in items[1:]:
        acc = np.matmul(acc, x["m"]) % P
    out = np.empty(len(acc), dtype=MAT)
    out["m"] = acc
    return out


#: intervals [lo, hi]: (lo1,hi1) op (lo2,hi2) = (lo1,hi2) iff hi1+1 == lo2,
#: else (-1,-1).  Associative, non-commutative, cheap: checks rank order.
IV = np.dtype([("lo", np.int32), ("hi", np.int32)])


def op_interval(a, b):
    ok = (a["hi"] + 1 == b["lo"]) & (a["lo"] >= 0) & (b["lo"] >= 0)
    b["lo"] = np.where(ok, a["lo"], -1)
    b["hi"] = np.where(ok, b["hi"], -1)


def iv_data(rank, count):
    out = np.empty(count, dtype=IV)
    out["lo"] = rank
    out["hi"] = rank
    return out


def iv_expect(lo, hi, count):
    out = np.empty(count, dtype=IV)
    out["lo"], out["hi"] = lo, hi
    return out


def data(dtype, rank, count, salt=0):
    rng = np.random.default_rng(7919 * rank + salt)
    x = rng.integers(0, 100, size=count)
    if np.dtype(dtype).kind == "c":
        return (x + 1j * rng.integers(0, 100, size=count)).astype(dtype)
    return x.astype(dtype)


def algos(name):
    return sorted(C.ALGORITHMS[name])


def run(n, fn, eager=False):
    return spawn(n, fn, eager=eager, timeout=20)


# -- barrier / bcast ---------------------------------------------------------

@pytest.mark.parametrize("n", SIZES)
def test_barrier(n):
    order = []

    def fn(t):
        order.append(("in", t.rank))
        C.barrier(t, algorithm="dissemination")
        order.append(("out", t.rank))

    run(n, fn)
    # nobody leaves before everybody entered
    first_out = min(i for i, (k, _) in enumerate(order) if k == "out")
    assert sum(1 for k, _ in order[:first_out] if k == "in") == n


@pytest.mark.parametrize("algo", algos("bcast"))
@pytest.mark.parametrize("n", SIZES)
def test_bcast(n, algo):
    for count in COUNTS:
        for dtype in DTYPES:
            for root in {0, n - 1, n // 2}:
                def fn(t):
                    buf = (data(dtype, root, count) if t.rank == root
                           else np.full(count, 3, dtype=dtype))
                    if algo == "pipeline":   # small segments to exercise many of them
                        C.ALGORITHMS["bcast"]["pipeline"](t, buf, root, segment=8)
                    else:
                        C.bcast(t, buf, root, algorithm=algo)
                    return buf
                for got in run(n, fn):
                    np.testing.assert_array_equal(got, data(dtype, root, count))


@pytest.mark.parametrize("algo", algos("bcast"))
@pytest.mark.parametrize("n", [3, 8])
def test_bcast_large(n, algo):
    ref = data(np.float64, 1, LARGE + 3)

    def fn(t):
        buf = ref.copy() if t.rank == 1 else np.zeros_like(ref)
        C.bcast(t, buf, 1, algorithm=algo)
        return buf

    for got in run(n, fn):
        np.testing.assert_array_equal(got, ref)


# -- reduce ------------------------------------------------------------------

@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_reduce(n, inplace):
    for count in COUNTS:
        for dtype, op, fold in [(np.int32, op_sum, np.sum), (np.float64, op_max, np.max),
                                (np.complex128, op_sum, np.sum), (np.uint8, op_sum, None)]:
            for root in {0, n - 1, n // 2}:
                def fn(t):
                    x = data(dtype, t.rank, count)
                    recv = np.full(count, 9, dtype=dtype) if t.rank == root else None
                    if inplace and t.rank == root:
                        recv[...] = x
                        x = None
                    C.reduce(t, x, recv, root, op, True, algorithm="binomial")
                    return recv
                res = run(n, fn)
                stack = np.array([data(dtype, i, count) for i in range(n)])
                if fold is None:
                    exp = stack.sum(axis=0, dtype=dtype)
                else:
                    exp = fold(stack, axis=0) if count else np.zeros(0, dtype)
                np.testing.assert_array_equal(res[root], exp.astype(dtype))
                assert all(res[i] is None for i in range(n) if i != root)


@pytest.mark.parametrize("n", SIZES)
def test_reduce_noncommutative(n):
    for count in COUNTS:
        for root in {0, n - 1, n // 2}:
            def fn(t):
                recv = np.zeros(count, dtype=MAT) if t.rank == root else None
                C.reduce(t, mat_data(t.rank, count), recv, root, op_matmul, False)
                return recv
            res = run(n, fn)
            if count:
                exp = mat_fold([mat_data(i, count) for i in range(n)])
                np.testing.assert_array_equal(res[root]["m"], exp["m"])

            def fn2(t):
                recv = np.zeros(count, dtype=IV) if t.rank == root else None
                C.reduce(t, iv_data(t.rank, count), recv, root, op_interval, False)
                return recv
            np.testing.assert_array_equal(run(n, fn2)[root], iv_expect(0, n - 1, count))


# -- allreduce ---------------------------------------------------------------

@pytest.mark.parametrize("algo", algos("allreduce"))
@pytest.mark.parametrize("n", SIZES)
def test_allreduce(n, algo):
    for count in COUNTS + [2 * n + 1]:
        for dtype in DTYPES:
            for inplace in (False, True):
                def fn(t):
                    x = data(dtype, t.rank, count)
                    recv = np.full(count, 5, dtype=dtype)
                    if inplace:
                        recv[...] = x
                        x = None
                    C.allreduce(t, x, recv, op_sum, True, algorithm=algo)
                    return recv
                exp = np.array([data(dtype, i, count) for i in range(n)]).sum(
                    axis=0, dtype=dtype)
                for got in run(n, fn):
                    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("algo", algos("allreduce"))
@pytest.mark.parametrize("n", SIZES)
def test_allreduce_noncommutative(n, algo):
    for count in COUNTS:
        def fn(t):
            recv = np.zeros(count, dtype=MAT)
            C.allreduce(t, mat_data(t.rank, count), recv, op_matmul, False, algorithm=algo)
            return recv
        res = run(n, fn)
        if count:
            exp = mat_fold([mat_data(i, count) for i in range(n)])
            for got in res:
                np.testing.assert_array_equal(got["m"], exp["m"])


@pytest.mark.parametrize("algo", algos("allreduce"))
@pytest.mark.parametrize("n", [4, 7])
def test_allreduce_large(n, algo):
    def fn(t):
        x = np.arange(LARGE + 1, dtype=np.int64) * (t.rank + 1)
        recv = np.empty_like(x)
        C.allreduce(t, x, recv, op_sum, True, algorithm=algo)
        return recv

    exp = np.arange(LARGE + 1, dtype=np.int64) * (n * (n + 1) // 2)
    for got in run(n, fn):
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("n", [5, 8])
def test_allreduce_large_noncommutative_default(n):
    count = LARGE // 2

    def fn(t):
        recv = np.empty(count, dtype=IV)
        C.allreduce(t, iv_data(t.rank, count), recv, op_interval, False)
        return recv

    for got in run(n, fn):
        np.testing.assert_array_equal(got, iv_expect(0, n - 1, count))


# -- gather / scatter / allgather / alltoall ---------------------------------

def vlayout(n, count, seed):
    """Per-rank counts (some zero when count allows) and non-packed displs."""
    rng = np.random.default_rng(seed)
    counts = [int(c) for c in rng.integers(0, count + 1, size=n)] if count else [0] * n
    displs, off = [0] * n, 2
    for i in reversed(range(n)):            # reversed order, with gaps
        displs[i] = off
        off += counts[i] + 1
    return counts, displs, off


@pytest.mark.parametrize("n", SIZES)
def test_gatherv(n):
    for count in COUNTS:
        for dtype in DTYPES:
            counts, displs, total = vlayout(n, count, n * 31 + count)
            for root in {0, n - 1}:
                for inplace in (False, True):
                    def fn(t):
                        mine = data(dtype, t.rank, counts[t.rank])
                        if t.rank != root:
                            C.gatherv(t, mine, None, None, None, root, algorithm="linear")
                            return None
                        recv = np.zeros(total, dtype=dtype)
                        if inplace:
                            recv[displs[root]:displs[root] + counts[root]] = mine
                            mine = None
                        C.gatherv(t, mine, recv, counts, displs, root)
                        return recv
                    got = run(n, fn)[root]
                    exp = np.zeros(total, dtype=dtype)
                    for i in range(n):
                        exp[displs[i]:displs[i] + counts[i]] = data(dtype, i, counts[i])
                    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("n", SIZES)
def test_scatterv(n):
    for count in COUNTS:
        for dtype in DTYPES:
            counts, displs, total = vlayout(n, count, n * 17 + count)
            src = data(dtype, 99, total)
            for root in {0, n - 1}:
                for inplace in (False, True):
                    def fn(t):
                        recv = np.zeros(counts[t.rank], dtype=dtype)
                        if t.rank == root:
                            C.scatterv(t, src, counts, displs, None if inplace else recv, root,
                                       algorithm="linear")
                        else:
                            C.scatterv(t, None, None, None, recv, root)
                        return recv
                    for i, got in enumerate(run(n, fn)):
                        if inplace and i == root:
                            assert not got.any()
                        else:
                            np.testing.assert_array_equal(got, src[displs[i]:displs[i] + counts[i]])


@pytest.mark.parametrize("algo", algos("allgatherv"))
@pytest.mark.parametrize("n", SIZES)
def test_allgatherv(n, algo):
    for count in COUNTS:
        for dtype in DTYPES:
            counts, displs, total = vlayout(n, count, n * 7 + count)
            exp = np.zeros(total, dtype=dtype)
            for i in range(n):
                exp[displs[i]:displs[i] + counts[i]] = data(dtype, i, counts[i])
            for inplace in (False, True):
                def fn(t):
                    mine = data(dtype, t.rank, counts[t.rank])
                    recv = np.zeros(total, dtype=dtype)
                    if inplace:
                        recv[displs[t.rank]:displs[t.rank] + counts[t.rank]] = mine
                        mine = None
                    C.allgatherv(t, mine, recv, counts, displs, algorithm=algo)
                    return recv
                for got in run(n, fn):
                    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("algo", algos("allgatherv"))
def test_allgather_large(algo):
    n, count = 4, LARGE // 4

    def fn(t):
        recv = np.empty(n * count, dtype=np.float32)
        C.allgatherv(t, np.full(count, t.rank, np.float32), recv, [count] * n, None,
                     algorithm=algo)
        return recv

    exp = np.repeat(np.arange(n, dtype=np.float32), count)
    for got in run(n, fn):
        np.testing.assert_array_equal(got, exp)


def a2a_counts(n, count, seed):
    """counts[i][j]: elements rank i sends to rank j."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, count + 1, size=(n, n)) if count else np.zeros((n, n), int)


def a2a_block(dtype, i, j, c):
    return (data(dtype, i * 50 + j, c) + i).astype(dtype)


@pytest.mark.parametrize("algo", algos("alltoallv") + ["mixed"])
@pytest.mark.parametrize("n", SIZES)
def test_alltoallv(n, algo):
    for count in COUNTS:
        for dtype in DTYPES:
            cm = a2a_counts(n, count, n * 13 + count)
            for inplace in (False, True):
                def fn(t):
                    r = t.rank
                    a = algo if algo != "mixed" else ("direct", "pairwise")[r % 2]
                    rcounts = [int(cm[j][r]) for j in range(n)]
                    rdispls = list(np.cumsum([0] + rcounts[:-1]) + 1)
                    recv = np.zeros(sum(rcounts) + 1, dtype=dtype)
                    if inplace:
                        for j in range(n):
                            recv[rdispls[j]:rdispls[j] + rcounts[j]] = a2a_block(dtype, r, j, rcounts[j])
                        C.alltoallv(t, None, None, None, recv, rcounts, rdispls, algorithm=a)
                        return recv, rcounts, rdispls
                    scounts = [int(cm[r][j]) for j in range(n)]
                    # pack the send blocks in reverse order
                    sdispls, off = [0] * n, 0
                    for j in reversed(range(n)):
                        sdispls[j] = off
                        off += scounts[j]
                    send = np.empty(off, dtype=dtype)
                    for j in range(n):
                        send[sdispls[j]:sdispls[j] + scounts[j]] = a2a_block(dtype, r, j, scounts[j])
                    C.alltoallv(t, send, scounts, sdispls, recv, rcounts, rdispls, algorithm=a)
                    return recv, rcounts, rdispls
                if inplace:                  # in place needs symmetric counts
                    cm = np.minimum(cm, cm.T)
                for r, res in enumerate(run(n, fn)):
                    recv, rcounts, rdispls = res
                    assert recv[0] == 0
                    for j in range(n):
                        np.testing.assert_array_equal(
                            recv[rdispls[j]:rdispls[j] + rcounts[j]], a2a_block(dtype, j, r, rcounts[j]))


@pytest.mark.parametrize("algo", algos("alltoallv"))
def test_alltoall_large(algo):
    n, c = 4, LARGE // 16

    def fn(t):
        send = np.repeat(np.arange(n, dtype=np.int64) + 10 * t.rank, c)
        recv = np.empty_like(send)
        C.alltoallv(t, send, [c] * n, None, recv, [c] * n, None, algorithm=algo)
        return recv

    for r, got in enumerate(run(n, fn)):
        np.testing.assert_array_equal(got, np.repeat(np.arange(n) * 10 + r, c))


@pytest.mark.parametrize("algo", algos("allgatherv"))
@pytest.mark.parametrize("n", SIZES)
def test_allgatherv_packed(n, algo):
    """Packed rank-order blocks (displs=None; recursive doubling then works
    in recvbuf itself), equal and unequal counts, in place or not."""
    for counts in ([3] * n, [(i * 5) % 4 for i in range(n)], [0] * n):
        exp = np.concatenate([data(np.int32, i, counts[i]) for i in range(n)])
        for inplace in (False, True):
            def fn(t):
                off = sum(counts[:t.rank])
                mine = data(np.int32, t.rank, counts[t.rank])
                recv = np.full(sum(counts), -7, dtype=np.int32)
                if inplace:
                    recv[off:off + counts[t.rank]] = mine
                    mine = None
                C.allgatherv(t, mine, recv, counts, None, algorithm=algo)
                return recv
            for got in run(n, fn):
                np.testing.assert_array_equal(got, exp)


# -- regular gather / scatter / alltoall (equal blocks) -----------------------

@pytest.mark.parametrize("algo", algos("gather"))
@pytest.mark.parametrize("n", SIZES)
def test_gather(n, algo):
    for blk in COUNTS + [2 * n + 1]:
        for dtype in (np.int32, np.complex128):
            exp = np.concatenate([data(dtype, i, blk) for i in range(n)])
            for root in {0, n - 1, n // 2}:
                for inplace in (False, True):
                    def fn(t):
                        mine = data(dtype, t.rank, blk)
                        if t.rank != root:
                            C.gather(t, mine, None, root, algorithm=algo)
                            return None
                        recv = np.zeros(n * blk, dtype=dtype)
                        if inplace:
                            recv[root * blk:(root + 1) * blk] = mine
                            mine = None
                        C.gather(t, mine, recv, root, algorithm=algo)
                        return recv
                    np.testing.assert_array_equal(run(n, fn)[root], exp)


@pytest.mark.parametrize("algo", algos("scatter"))
@pytest.mark.parametrize("n", SIZES)
def test_scatter(n, algo):
    for blk in COUNTS + [2 * n + 1]:
        for dtype in (np.int32, np.complex128):
            src = data(dtype, 99, n * blk)
            for root in {0, n - 1, n // 2}:
                for inplace in (False, True):
                    def fn(t):
                        recv = np.zeros(blk, dtype=dtype)
                        if t.rank == root:
                            C.scatter(t, src, None if inplace else recv, root, algorithm=algo)
                        else:
                            C.scatter(t, None, recv, root, algorithm=algo)
                        return recv
                    for i, got in enumerate(run(n, fn)):
                        if inplace and i == root:
                            assert not got.any()
                        else:
                            np.testing.assert_array_equal(got, src[i * blk:(i + 1) * blk])


@pytest.mark.parametrize("algo", algos("gather"))
def test_gather_scatter_large(algo):
    n, blk = 7, LARGE // 8 + 1
    src = data(np.float64, 5, n * blk)

    def fn(t):
        mine = np.empty(blk)
        C.scatter(t, src if t.rank == 2 else None, mine, 2, algorithm=algo)
        back = np.empty(n * blk) if t.rank == 5 else None
        C.gather(t, mine, back, 5, algorithm=algo)
        return mine, back

    res = run(n, fn)
    for i, (mine, _) in enumerate(res):
        np.testing.assert_array_equal(mine, src[i * blk:(i + 1) * blk])
    np.testing.assert_array_equal(res[5][1], src)


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("algo", algos("alltoall"))
@pytest.mark.parametrize("n", SIZES)
def test_alltoall(n, algo, eager):
    for blk in COUNTS + [n + 2]:
        for dtype in (np.uint8, np.float64):
            for inplace in (False, True):
                def fn(t):
                    r = t.rank
                    send = np.concatenate([a2a_block(dtype, r, j, blk) for j in range(n)])
                    recv = np.zeros(n * blk, dtype=dtype)
                    if inplace:
                        recv[...] = send
                        send = None
                    C.alltoall(t, send, recv, algorithm=algo)
                    return recv
                for r, got in enumerate(spawn(n, fn, eager=eager, timeout=20)):
                    exp = np.concatenate([a2a_block(dtype, j, r, blk) for j in range(n)])
                    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("algo", algos("alltoall"))
def test_alltoall_uniform_large(algo):
    n, c = 5, LARGE // 16 + 3

    def fn(t):
        send = np.repeat(np.arange(n, dtype=np.int64) + 10 * t.rank, c)
        recv = np.empty_like(send)
        C.alltoall(t, send, recv, algorithm=algo)
        return recv

    for r, got in enumerate(run(n, fn)):
        np.testing.assert_array_equal(got, np.repeat(np.arange(n) * 10 + r, c))


# -- hierarchical (ranks on several hosts; fake host labels) -----------------

HOST_LAYOUTS = {
    "alternating": lambda n: ["h%d" % (i % 2) for i in range(n)],
    "blocks_of_3": lambda n: ["h%d" % (i // 3) for i in range(n)],
    "uneven": lambda n: ["big" if i not in (1, n - 1) else "small" for i in range(n)],
    "one_host": lambda n: ["h"] * n,
    "every_rank": lambda n: ["h%d" % i for i in range(n)],
    "none": lambda n: None,
}


class CountingTransport:
    """A ThreadTransport with host labels that records every send as
    (source, dest)."""

    def __init__(self, t, hosts, log):
        self._t, self.hosts, self._log = t, hosts, log
        self.rank, self.size = t.rank, t.size

    def isend(self, buf, dest, tag):
        self._log.append((self.rank, dest))
        return self._t.isend(buf, dest, tag)

    def irecv(self, buf, source, tag):
        return self._t.irecv(buf, source, tag)

    def send_obj(self, obj, dest, tag):
        self._log.append((self.rank, dest))
        self._t.send_obj(obj, dest, tag)

    def recv_obj(self, source, tag):
        return self._t.recv_obj(source, tag)

    def waitall(self, reqs):
        self._t.waitall(reqs)


def _leaders(hosts, root=None):
    from erdmampi.collectives.hier import host_groups
    return {root if root is not None and root in g else g[0] for g in host_groups(hosts)}


@pytest.mark.parametrize("layout", sorted(HOST_LAYOUTS))
@pytest.mark.parametrize("n", SIZES)
def test_allreduce_hierarchical(n, layout):
    hosts = HOST_LAYOUTS[layout](n)
    for count in COUNTS + [LARGE // 8 + 1]:
        for inplace in (False, True):
            log = []

            def fn(t):
                t = CountingTransport(t, hosts, log)
                x = data(np.int64, t.rank, count)
                recv = np.full(count, 5, dtype=np.int64)
                if inplace:
                    recv[...] = x
                    x = None
                C.allreduce(t, x, recv, op_sum, True)      # default selection
                return recv
            exp = np.array([data(np.int64, i, count) for i in range(n)]).sum(axis=0)
            for got in run(n, fn):
                np.testing.assert_array_equal(got, exp)
            if hosts is not None and 1 < len(set(hosts)) < n and count:
                # only one rank per host talks to other hosts
                lead = _leaders(hosts)
                cross = [(s, d) for s, d in log if hosts[s] != hosts[d]]
                assert cross and all(s in lead and d in lead for s, d in cross)


@pytest.mark.parametrize("layout", sorted(HOST_LAYOUTS))
@pytest.mark.parametrize("n", SIZES)
def test_bcast_hierarchical(n, layout):
    hosts = HOST_LAYOUTS[layout](n)
    for count in COUNTS + [LARGE + 5]:
        for root in {0, n - 1, n // 2, 1 % n}:
            log = []

            def fn(t):
                t = CountingTransport(t, hosts, log)
                buf = (data(np.uint8, root, count) if t.rank == root
                       else np.zeros(count, np.uint8))
                C.bcast(t, buf, root)                       # default selection
                return buf
            for got in run(n, fn):
                np.testing.assert_array_equal(got, data(np.uint8, root, count))
            if hosts is not None and 1 < len(set(hosts)) < n and count:
                lead = _leaders(hosts, root)
                cross = [(s, d) for s, d in log if hosts[s] != hosts[d]]
                assert cross and all(s in lead and d in lead for s, d in cross)
                if count < 1000:       # binomial among the leaders
                    assert len(cross) == len(set(hosts)) - 1


@pytest.mark.parametrize("n", [3, 5, 8])
def test_hierarchical_noncommutative_keeps_rank_order(n):
    hosts = HOST_LAYOUTS["alternating"](n)
    for count in (1, 13):
        def fn(t):
            t.hosts = hosts
            recv = np.empty(count, dtype=IV)
            C.allreduce(t, iv_data(t.rank, count), recv, op_interval, False,
                        algorithm="hierarchical")
            return recv
        for got in run(n, fn):
            np.testing.assert_array_equal(got, iv_expect(0, n - 1, count))


def test_hierarchical_selection():
    from erdmampi.collectives.hier import is_multi_host

    class T:
        size = 4
        rank = 0
        hosts = None
    t = T()
    assert not is_multi_host(t)
    t.hosts = ["a", "a", "a", "a"]
    assert not is_multi_host(t)
    t.hosts = ["a", "b", "c", "d"]
    assert not is_multi_host(t)
    t.hosts = ["a", "b", "a", "b"]
    assert is_multi_host(t)
    t.hosts = ["a", "b"]
    with pytest.raises(ValueError, match="host labels"):
        is_multi_host(t)
    assert C.select("allreduce", 100, 4, 10, hier=True).__name__ == "allreduce_hierarchical"
    assert C.select("allreduce", 100, 4, 10, commutative=False,
                    hier=True).__name__ == "allreduce_recursive_doubling"
    assert C.select("bcast", 8 << 20, 4, hier=True).__name__ == "bcast_hierarchical"
    assert C.select("bcast", 8 << 20, 4).__name__ == "bcast_sched_chain"
    assert C.select("reduce", 100, 4, 10, hier=True).__name__ == "reduce_binomial"


# -- reduce_scatter / scan / exscan ------------------------------------------

@pytest.mark.parametrize("algo", algos("reduce_scatter"))
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter(n, algo):
    for count in COUNTS:
        counts, _, _ = vlayout(n, count, n * 3 + count)
        total = sum(counts)
        offs = np.cumsum([0] + counts)
        for dtype in DTYPES:
            exp = np.array([data(dtype, i, total) for i in range(n)]).sum(axis=0, dtype=dtype)
            for inplace in (False, True):
                def fn(t):
                    x = data(dtype, t.rank, total)
                    if inplace:
                        recv = x.copy()
                        C.reduce_scatter(t, None, recv, counts, op_sum, True, algorithm=algo)
                        return recv[:counts[t.rank]]
                    recv = np.zeros(counts[t.rank], dtype=dtype)
                    C.reduce_scatter(t, x, recv, counts, op_sum, True, algorithm=algo)
                    return recv
                for r, got in enumerate(run(n, fn)):
                    np.testing.assert_array_equal(got, exp[offs[r]:offs[r + 1]])
        # non-commutative: rank order
        def fn2(t):
            recv = np.zeros(counts[t.rank], dtype=IV)
            C.reduce_scatter(t, iv_data(t.rank, total), recv, counts, op_interval, False,
                             algorithm=algo)
            return recv
        for r, got in enumerate(run(n, fn2)):
            np.testing.assert_array_equal(got, iv_expect(0, n - 1, counts[r]))


def test_reduce_scatter_large():
    n, c = 5, LARGE // 5

    def fn(t):
        recv = np.empty(c, np.float64)
        C.reduce_scatter(t, np.full(n * c, t.rank + 1.0), recv, [c] * n, op_sum, True)
        return recv

    for got in run(n, fn):
        np.testing.assert_array_equal(got, np.full(c, n * (n + 1) / 2))


@pytest.mark.parametrize("kind", ["scan", "exscan"])
@pytest.mark.parametrize("n", SIZES)
def test_scan(n, kind):
    fun = getattr(C, kind)
    for count in COUNTS:
        for dtype in DTYPES:
            for inplace in (False, True):
                def fn(t):
                    x = data(dtype, t.rank, count)
                    recv = np.full(count, 77, dtype=dtype)
                    if inplace:
                        recv[...] = x
                        x = None
                    fun(t, x, recv, op_sum, algorithm="recursive_doubling")
                    return recv
                res = run(n, fn)
                stack = [data(dtype, i, count) for i in range(n)]
                for r, got in enumerate(res):
                    if kind == "exscan" and r == 0:
                        # untouched
                        exp = stack[0] if inplace else np.full(count, 77, dtype=dtype)
                    else:
                        hi = r + 1 if kind == "scan" else r
                        exp = np.array(stack[:hi]).sum(axis=0, dtype=dtype)
                    np.testing.assert_array_equal(got, exp)
        # non-commutative
        def fn2(t):
            recv = np.zeros(count, dtype=MAT)
            fun(t, mat_data(t.rank, count), recv, op_matmul)
            return recv
        res = run(n, fn2)
        if count:
            for r, got in enumerate(res):
                if kind == "scan":
                    exp = mat_fold([mat_data(i, count) for i in range(r + 1)])
                elif r == 0:
                    continue
                else:
                    exp = mat_fold([mat_data(i, count) for i in range(r)])
                np.testing.assert_array_equal(got["m"], exp["m"])


def test_scan_large():
    n, count = 5, LARGE // 4

    def fn(t):
        recv = np.empty(count, IV)
        C.scan(t, iv_data(t.rank, count), recv, op_interval)
        return recv

    for r, got in enumerate(run(n, fn)):
        np.testing.assert_array_equal(got, iv_expect(0, r, count))


# -- object collectives ------------------------------------------------------

def cat(x, y):
    return x + y


def objs_for(rank):
    return f"<{rank}>"


@pytest.mark.parametrize("eager", [False, True])
@pytest.mark.parametrize("n", SIZES)
def test_objects(n, eager):
    payload = {"a": [1, 2.5, "x"], "arr": np.arange(5)}

    def fn(t):
        r = t.rank
        out = {}
        root = n - 1
        original = payload if r == root else None
        out["bcast"] = C.bcast_obj(t, original, root)
        out["bcast_is_copy"] = out["bcast"] is not payload
        out["gather"] = C.gather_obj(t, objs_for(r), root)
        out["scatter"] = C.scatter_obj(t, [objs_for(i) * 2 for i in range(n)]
                                       if r == 0 else None, 0)
        out["scatter_none"] = C.scatter_obj(t, None, 0)
        out["allgather"] = C.allgather_obj(t, (r, objs_for(r)))
        out["alltoall"] = C.alltoall_obj(t, [f"{r}->{j}" for j in range(n)])
        out["reduce"] = C.reduce_obj(t, objs_for(r), cat, n // 2)
        out["allreduce"] = C.allreduce_obj(t, objs_for(r), cat)
        out["scan"] = C.scan_obj(t, objs_for(r), cat)
        out["exscan"] = C.exscan_obj(t, objs_for(r), cat)
        out["sum"] = C.allreduce_obj(t, r + 1, lambda a, b: a + b)
        return out

    res = run(n, fn, eager=eager)
    full = "".join(objs_for(i) for i in range(n))
    for r, out in enumerate(res):
        assert out["bcast"]["a"] == payload["a"]
        np.testing.assert_array_equal(out["bcast"]["arr"], payload["arr"])
        assert out["bcast_is_copy"]
        assert out["gather"] == ([objs_for(i) for i in range(n)] if r == n - 1 else None)
        assert out["scatter"] == objs_for(r) * 2
        assert out["scatter_none"] is None
        assert out["allgather"] == [(i, objs_for(i)) for i in range(n)]
        assert out["alltoall"] == [f"{j}->{r}" for j in range(n)]
        assert out["reduce"] == (full if r == n // 2 else None)
        assert out["allreduce"] == full
        assert out["scan"] == "".join(objs_for(i) for i in range(r + 1))
        assert out["exscan"] == (None if r == 0 else "".join(objs_for(i) for i in range(r)))
        assert out["sum"] == n * (n + 1) // 2


def test_objects_large():
    n = 3
    big = np.arange(LARGE // 4, dtype=np.float64)   # 2 MiB pickles

    def fn(t):
        got = C.bcast_obj(t, big if t.rank == 0 else None, 0)
        allg = C.allgather_obj(t, big * t.rank)
        a2a = C.alltoall_obj(t, [big[: (j + 1) * 1000] + t.rank for j in range(n)])
        return got, allg, a2a

    for r, (got, allg, a2a) in enumerate(run(n, fn)):
        np.testing.assert_array_equal(got, big)
        for i in range(n):
            np.testing.assert_array_equal(allg[i], big * i)
            np.testing.assert_array_equal(a2a[i], big[: (r + 1) * 1000] + i)


def test_reduce_obj_does_not_mutate_input():
    def fn(t):
        mine = [t.rank]
        res = C.allreduce_obj(t, mine, lambda a, b: (a.extend(b), a)[1])
        return mine, res

    for r, (mine, res) in enumerate(run(4, fn)):
        assert mine == [r]
        assert res == [0, 1, 2, 3]


# -- selection, overrides and errors -----------------------------------------

def test_select_defaults():
    KiB = 1024
    assert C.select("bcast", 100, 8) is C.ALGORITHMS["bcast"]["binomial"]
    assert C.select("bcast", 400 * KiB, 1).__name__ == "bcast_binomial"
    assert C.select("allreduce", 100, 8, 10).__name__ == "allreduce_recursive_doubling"
    # large messages: schedules run by the C engine (erdmampi.collectives.sched)
    assert C.select("bcast", 4096 * KiB, 8).__name__ == "bcast_sched_chain"
    # (3+ ranks: slices reduced out of each other's buffers on one host, the
    # ring where CMA cannot be used)
    assert C.select("allreduce", 8 << 20, 8, 1 << 20).__name__ == "allreduce_sched_slices"
    assert C.select("allreduce", 8 << 20, 3, 1 << 20).__name__ == "allreduce_sched_slices"
    assert C.select("reduce_scatter", 8 << 20, 6).__name__ == "reduce_scatter_sched_slices"
    assert C.select("allgatherv", 8 << 20, 6).__name__ == "allgatherv_sched_ring"
    assert C.select("alltoallv", 8 << 20, 6).__name__ == "alltoallv_sched"
    # ... and without them (a transport without schedules, a user-defined op)
    assert C._default("bcast", 4096 * KiB, 8, 0, True, sched=False) == "scatter_allgather"
    assert C._default("allreduce", 8 << 20, 8, 1 << 20, True, sched=False) == "rabenseifner"
    assert C._default("allreduce", 8 << 20, 6, 1 << 20, True, sched=False) == "ring"
    assert C.select("allreduce", 8 << 20, 6, 1 << 20,
                    commutative=False).__name__ == "allreduce_reduce_bcast"
    assert C.select("reduce_scatter", 8 << 20, 6, commutative=False).__name__ \
        == "reduce_scatter_reduce_scatterv"
    # allgather of small vectors: log-round algorithms beyond 3 ranks
    assert C.select("allgatherv", 1000, 2).__name__ == "allgatherv_direct"
    assert C.select("allgatherv", 1000, 3).__name__ == "allgatherv_direct"
    assert C.select("allgatherv", 1000, 4).__name__ == "allgatherv_recursive_doubling"
    assert C.select("allgatherv", 1000, 6).__name__ == "allgatherv_bruck"
    assert C.select("allgatherv", 100 * KiB, 6).__name__ == "allgatherv_ring"
    # gather / scatter of equal blocks
    assert C.select("gather", 1000, 8).__name__ == "gather_binomial"
    assert C.select("scatter", 1000, 3).__name__ == "scatter_linear"
    assert C.select("gather", 1 << 20, 8).__name__ == "gather_linear"
    # alltoall of equal blocks: Bruck for small blocks on 5+ ranks
    assert C.select("alltoall", 2 * 8 * 64, 8, 8 * 64).__name__ == "alltoall_bruck"
    assert C.select("alltoall", 2 * 4 * 64, 4, 4 * 64).__name__ == "alltoall_direct"
    assert C.select("alltoall", 2 * 8 * 4096, 8, 8 * 4096).__name__ == "alltoall_direct"
    assert C.select("alltoall", 16 << 20, 8, 8 << 20).__name__ == "alltoall_sched"
    assert C._default("alltoall", 16 << 20, 8, 8 << 20, True, sched=False) == "pairwise"


def test_env_override(monkeypatch):
    monkeypatch.setenv("ERDMA_COLL_ALLREDUCE", "ring")
    assert C.select("allreduce", 10, 4, 1) is C.ALGORITHMS["allreduce"]["ring"]
    # explicit argument beats the environment
    assert C.select("allreduce", 10, 4, 1, algorithm="reduce_bcast").__name__ \
        == "allreduce_reduce_bcast"
    monkeypatch.setenv("ERDMA_COLL_BCAST", "nosuch")
    with pytest.raises(ValueError, match="unknown bcast algorithm"):
        C.select("bcast", 10, 4)
    with pytest.raises(ValueError):
        C.select("allreduce", algorithm="bogus")


def test_env_override_runs(monkeypatch):
    monkeypatch.setenv("ERDMA_COLL_ALLREDUCE", "rabenseifner")
    calls = []
    real = C.ALGORITHMS["allreduce"]["rabenseifner"]
    monkeypatch.setitem(C.ALGORITHMS["allreduce"], "rabenseifner",
                        lambda *a: (calls.append(1), real(*a)))

    def fn(t):
        recv = np.empty(3, np.int64)
        C.allreduce(t, np.full(3, t.rank, np.int64), recv, op_sum, True)
        return recv

    for got in run(3, fn):
        np.testing.assert_array_equal(got, [3, 3, 3])
    assert len(calls) == 3


def test_bad_arguments():
    with pytest.raises(ValueError, match="root"):
        run(2, lambda t: C.bcast(t, np.zeros(1), 2))
    with pytest.raises(ValueError, match="expected 3 counts"):
        run(3, lambda t: C.allgatherv(t, np.zeros(1), np.zeros(3), [1, 1], None))
    with pytest.raises(ValueError, match="does not fit"):
        run(2, lambda t: C.allgatherv(t, np.zeros(1), np.zeros(1), [1, 1], None))
    with pytest.raises(ValueError, match="expecting 2 items, got 3"):
        run(2, lambda t: C.scatter_obj(t, [1, 2, 3], 0) if t.rank == 0 else None)
    with pytest.raises(ValueError, match="expecting 2 items"):
        run(2, lambda t: C.alltoall_obj(t, [1]))


def test_harness_detects_deadlock():
    # two ranks both waiting to receive: the harness must report, not hang
    def fn(t):
        buf = np.zeros(1)
        t.waitall([t.irecv(buf, 1 - t.rank, 0)])

    with pytest.raises(Deadlock):
        spawn(2, fn, timeout=0.5)


def test_harness_rendezvous_catches_early_reuse():
    # an isend whose buffer is modified before the receive matches delivers
    # the modified data in rendezvous mode (so such algorithm bugs show up)
    def fn(t):
        buf = np.array([1.0])
        if t.rank == 0:
            req = t.isend(buf, 1, 0)
            buf[0] = 2.0
            base.Transport  # noqa: B018 - protocol is importable
            t.send_obj("go", 1, 1)
            t.waitall([req])
            return None
        t.recv_obj(0, 1)
        t.waitall([t.irecv(buf, 0, 0)])
        return buf[0]

    assert run(2, fn)[1] == 2.0
    assert spawn(2, fn, eager=True)[1] == 1.0


def test_transport_protocol():
    def fn(t):
        return isinstance(t, base.Transport)
    assert all(run(2, fn))
