"""Reduction algorithms: reduce, allreduce, reduce_scatter, scan, exscan.

``reduce_fn(inarr, inoutarr)`` computes ``inoutarr[:] = inarr OP inoutarr``.
Where an algorithm is only valid for commutative operations and is called with
``commutative=False`` it falls back to a rank-ordered algorithm (documented on
each function), so every function is correct for every operation: for a
non-commutative OP the result is ``x0 OP x1 OP ... OP x_{n-1}`` in rank order.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from erdmampi.collectives.base import (ReduceFn, Transport, block, check_counts,
                                       check_root, even_blocks)
from erdmampi.collectives.bcast import bcast_binomial, bcast_scatter_allgather
from erdmampi.collectives.gather import scatterv_linear

__all__ = [
    "reduce_binomial",
    "allreduce_recursive_doubling", "allreduce_ring", "allreduce_rabenseifner",
    "allreduce_reduce_bcast",
    "reduce_scatter_ring", "reduce_scatter_reduce_scatterv",
    "scan_recursive_doubling", "exscan_recursive_doubling",
]

#: bcast switches to scatter+allgather above this many bytes inside the
#: composite algorithms (allreduce_reduce_bcast).
_BCAST_LARGE = 512 * 1024


def _input(sendbuf: Optional[np.ndarray], recvbuf: Optional[np.ndarray]) -> np.ndarray:
    """The input vector: ``sendbuf``, or ``recvbuf`` when in place."""
    if sendbuf is not None:
        return sendbuf
    if recvbuf is None:
        raise ValueError("in-place reduction needs a receive buffer")
    return recvbuf


def _pof2(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


# -- reduce ------------------------------------------------------------------

def reduce_binomial(t: Transport, sendbuf: Optional[np.ndarray],
                    recvbuf: Optional[np.ndarray], root: int,
                    reduce_fn: ReduceFn, commutative: bool = True) -> None:
    """Binomial tree, ceil(log2 n) rounds.  Commutative ops use a tree rooted
    at ``root``; non-commutative ops use a tree rooted at rank 0 in which
    every rank combines contiguous, rank-ordered ranges, and rank 0 then
    forwards the result to ``root``.  ``sendbuf=None`` at the root: in place
    (input in ``recvbuf``).  ``recvbuf`` matters at the root only."""
    n, r = t.size, t.rank
    root = check_root("reduce", root, n)
    data = _input(sendbuf, recvbuf if r == root else None)
    if n == 1:
        if sendbuf is not None and recvbuf is not None:
            recvbuf[...] = sendbuf
        return
    if data.size == 0:
        return
    acc = data.copy()
    tmp = np.empty_like(acc)
    vroot = root if commutative else 0
    vr = (r - vroot) % n
    mask = 1
    while mask < n:
        if vr & mask:
            t.waitall([t.isend(acc, (vr - mask + vroot) % n, 0)])
            break
        child = vr | mask
        if child < n:
            t.waitall([t.irecv(tmp, (child + vroot) % n, 0)])
            if commutative:
                reduce_fn(tmp, acc)            # acc = child OP acc
            else:
                reduce_fn(acc, tmp)            # tmp = acc OP child (rank order)
                acc, tmp = tmp, acc
        mask <<= 1
    if vroot != root:
        if r == vroot:
            t.waitall([t.isend(acc, root, 1)])
        elif r == root:
            t.waitall([t.irecv(recvbuf, vroot, 1)])
            return
    if r == root:
        recvbuf[...] = acc


# -- allreduce ---------------------------------------------------------------

def _fold_in(t: Transport, acc: np.ndarray, tmp: np.ndarray, rem: int,
             reduce_fn: ReduceFn) -> int:
    """Non-power-of-two prologue: among ranks < 2*rem, each even rank hands its
    data to the odd rank above (which combines even OP odd).  Returns the
    rank's index among the pof2 survivors, or -1 for ranks that dropped out."""
    r = t.rank
    if r < 2 * rem:
        if r % 2 == 0:
            t.waitall([t.isend(acc, r + 1, 0)])
            return -1
        t.waitall([t.irecv(tmp, r - 1, 0)])
        reduce_fn(tmp, acc)
        return r // 2
    return r - rem


def _fold_out(t: Transport, acc: np.ndarray, rem: int) -> None:
    """Epilogue of :func:`_fold_in`: odd ranks return the result."""
    r = t.rank
    if r < 2 * rem:
        if r % 2 == 0:
            t.waitall([t.irecv(acc, r + 1, 1000)])
        else:
            t.waitall([t.isend(acc, r - 1, 1000)])


def _real(newrank: int, rem: int) -> int:
    return newrank * 2 + 1 if newrank < rem else newrank + rem


def _start(sendbuf, recvbuf) -> np.ndarray:
    if sendbuf is not None:
        recvbuf[...] = sendbuf
    return recvbuf


def allreduce_recursive_doubling(t: Transport, sendbuf: Optional[np.ndarray],
                                 recvbuf: np.ndarray, reduce_fn: ReduceFn,
                                 commutative: bool = True) -> None:
    """Recursive doubling: log2 n rounds of full-vector exchanges with rank
    XOR 2**k.  Non-power-of-two sizes fold the first 2*rem ranks pairwise
    first.  Rank order is kept, so it is also valid for non-commutative ops.
    Latency-optimal; for small messages.  ``sendbuf=None``: in place."""
    n = t.size
    acc = _start(sendbuf, recvbuf)
    if n == 1 or acc.size == 0:
        return
    tmp = np.empty_like(acc)
    pof2 = _pof2(n)
    rem = n - pof2
    newrank = _fold_in(t, acc, tmp, rem, reduce_fn)
    if newrank >= 0:
        mask, step = 1, 1
        while mask < pof2:
            newdst = newrank ^ mask
            dst = _real(newdst, rem)
            t.waitall([t.irecv(tmp, dst, step), t.isend(acc, dst, step)])
            if newdst < newrank:
                reduce_fn(tmp, acc)            # acc = lower OP acc
            else:
                reduce_fn(acc, tmp)            # tmp = acc OP upper
                acc, tmp = tmp, acc
            mask <<= 1
            step += 1
        if acc is not recvbuf:
            recvbuf[...] = acc
    _fold_out(t, recvbuf, rem)


def _ring_reduce_scatter(t, acc, tmp, cnts, disps, reduce_fn, shift):
    """n-1 ring steps: send block (r - step - shift) to the right, reduce the
    block arriving from the left into ``acc``.  Afterwards rank r holds the
    fully reduced block (r + 1 - shift) % n."""
    r, n = t.rank, t.size
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        s, q = (r - step - shift) % n, (r - step - shift - 1) % n
        reqs = []
        if cnts[q]:
            reqs.append(t.irecv(tmp[:cnts[q]], left, step))
        if cnts[s]:
            reqs.append(t.isend(block(acc, disps[s], cnts[s]), right, step))
        t.waitall(reqs)
        if cnts[q]:
            reduce_fn(tmp[:cnts[q]], block(acc, disps[q], cnts[q]))


def allreduce_ring(t: Transport, sendbuf: Optional[np.ndarray],
                   recvbuf: np.ndarray, reduce_fn: ReduceFn,
                   commutative: bool = True) -> None:
    """Ring reduce-scatter followed by ring allgather (n-1 steps each, every
    rank sends 2(n-1)/n of the vector): bandwidth-optimal for large vectors.
    Commutative ops only; a non-commutative op falls back to
    :func:`allreduce_reduce_bcast`.  ``sendbuf=None``: in place."""
    if not commutative:
        return allreduce_reduce_bcast(t, sendbuf, recvbuf, reduce_fn, False)
    n, r = t.size, t.rank
    acc = _start(sendbuf, recvbuf)
    if n == 1 or acc.size == 0:
        return
    cnts, disps = even_blocks(acc.size, n)
    tmp = np.empty(cnts[0], dtype=acc.dtype)
    _ring_reduce_scatter(t, acc, tmp, cnts, disps, reduce_fn, 0)
    right, left = (r + 1) % n, (r - 1) % n
    # rank r now owns the reduced block r+1
    for step in range(n - 1):
        s, q = (r + 1 - step) % n, (r - step) % n
        reqs = []
        if cnts[q]:
            reqs.append(t.irecv(block(acc, disps[q], cnts[q]), left, 512 + step))
        if cnts[s]:
            reqs.append(t.isend(block(acc, disps[s], cnts[s]), right, 512 + step))
        t.waitall(reqs)


def allreduce_rabenseifner(t: Transport, sendbuf: Optional[np.ndarray],
                           recvbuf: np.ndarray, reduce_fn: ReduceFn,
                           commutative: bool = True) -> None:
    """Rabenseifner: recursive-halving reduce-scatter then recursive-doubling
    allgather among the largest power of two of ranks (others fold in first).
    log2 n rounds and ~2x the vector per rank: good for large vectors on many
    ranks.  Commutative ops only; a non-commutative op falls back to
    :func:`allreduce_reduce_bcast`.  ``sendbuf=None``: in place."""
    if not commutative:
        return allreduce_reduce_bcast(t, sendbuf, recvbuf, reduce_fn, False)
    n = t.size
    acc = _start(sendbuf, recvbuf)
    if n == 1 or acc.size == 0:
        return
    pof2 = _pof2(n)
    rem = n - pof2
    cnts, disps = even_blocks(acc.size, pof2)
    bound = disps + [acc.size]                 # block i = [bound[i], bound[i+1])
    tmp = np.empty_like(acc)
    newrank = _fold_in(t, acc, tmp, rem, reduce_fn)
    if newrank >= 0:
        lo, hi = 0, pof2
        mask, step = pof2 // 2, 1
        while mask >= 1:                        # recursive halving
            dst = _real(newrank ^ mask, rem)
            mid = lo + (hi - lo) // 2
            if newrank & mask:
                keep, give = (mid, hi), (lo, mid)
            else:
                keep, give = (lo, mid), (mid, hi)
            kpart = acc[bound[keep[0]]:bound[keep[1]]]
            gpart = acc[bound[give[0]]:bound[give[1]]]
            reqs = []
            if kpart.size:
                reqs.append(t.irecv(tmp[:kpart.size], dst, step))
            if gpart.size:
                reqs.append(t.isend(gpart, dst, step))
            t.waitall(reqs)
            if kpart.size:
                reduce_fn(tmp[:kpart.size], kpart)
            lo, hi = keep
            mask >>= 1
            step += 1
        mask = 1
        while mask < pof2:                      # recursive doubling allgather
            dst = _real(newrank ^ mask, rem)
            if newrank & mask:
                other = (lo - mask, lo)
            else:
                other = (hi, hi + mask)
            mine = acc[bound[lo]:bound[hi]]
            theirs = acc[bound[other[0]]:bound[other[1]]]
            reqs = []
            if theirs.size:
                reqs.append(t.irecv(theirs, dst, step))
            if mine.size:
                reqs.append(t.isend(mine, dst, step))
            t.waitall(reqs)
            lo, hi = min(lo, other[0]), max(hi, other[1])
            mask <<= 1
            step += 1
    _fold_out(t, acc, rem)


def allreduce_reduce_bcast(t: Transport, sendbuf: Optional[np.ndarray],
                           recvbuf: np.ndarray, reduce_fn: ReduceFn,
                           commutative: bool = True) -> None:
    """Reduce to rank 0 (binomial, rank-ordered when non-commutative) then
    broadcast.  Valid for every op.  ``sendbuf=None``: in place."""
    n = t.size
    acc = _start(sendbuf, recvbuf)
    if n == 1 or acc.size == 0:
        return
    reduce_binomial(t, None if t.rank == 0 else acc, acc, 0,
                    reduce_fn, commutative)
    if acc.nbytes > _BCAST_LARGE:
        bcast_scatter_allgather(t, acc, 0)
    else:
        bcast_binomial(t, acc, 0)


# -- reduce_scatter ----------------------------------------------------------

def reduce_scatter_ring(t: Transport, sendbuf: Optional[np.ndarray],
                        recvbuf: np.ndarray, recvcounts: Sequence[int],
                        reduce_fn: ReduceFn, commutative: bool = True) -> None:
    """Ring: n-1 steps, each rank forwards one partially reduced block to its
    right neighbour; rank r ends with block r.  Bandwidth-optimal.
    Commutative ops only (a non-commutative op falls back to
    :func:`reduce_scatter_reduce_scatterv`).  ``sendbuf=None``: the whole
    input is in ``recvbuf``; the result goes to its first recvcounts[r]."""
    if not commutative:
        return reduce_scatter_reduce_scatterv(t, sendbuf, recvbuf, recvcounts,
                                              reduce_fn, False)
    n, r = t.size, t.rank
    data = _input(sendbuf, recvbuf)
    cnts, disps = check_counts("reduce_scatter", n, recvcounts, None, data.size)
    if sum(cnts) != data.size and sendbuf is not None:
        raise ValueError(f"reduce_scatter: send buffer has {data.size} elements, "
                         f"recvcounts sum to {sum(cnts)}")
    if n == 1:
        if sendbuf is not None and cnts[0]:
            recvbuf[:cnts[0]] = sendbuf[:cnts[0]]
        return
    acc = data[:sum(cnts)].copy()
    tmp = np.empty(max(cnts), dtype=acc.dtype)
    _ring_reduce_scatter(t, acc, tmp, cnts, disps, reduce_fn, 1)
    if cnts[r]:
        recvbuf[:cnts[r]] = block(acc, disps[r], cnts[r])


def reduce_scatter_reduce_scatterv(t: Transport, sendbuf: Optional[np.ndarray],
                                   recvbuf: np.ndarray, recvcounts: Sequence[int],
                                   reduce_fn: ReduceFn, commutative: bool = True) -> None:
    """Reduce the whole vector to rank 0, then scatterv the blocks.  Valid for
    every op (rank order kept).  ``sendbuf=None``: as in
    :func:`reduce_scatter_ring`."""
    n, r = t.size, t.rank
    data = _input(sendbuf, recvbuf)
    cnts, disps = check_counts("reduce_scatter", n, recvcounts, None, data.size)
    total = sum(cnts)
    full = np.empty(total, dtype=data.dtype) if r == 0 else None
    if total:
        reduce_binomial(t, data[:total], full, 0, reduce_fn, commutative)
    scatterv_linear(t, full, cnts, disps, recvbuf[:cnts[r]], 0)


# -- scan / exscan -----------------------------------------------------------

def scan_recursive_doubling(t: Transport, sendbuf: Optional[np.ndarray],
                            recvbuf: np.ndarray, reduce_fn: ReduceFn) -> None:
    """Inclusive prefix reduction by recursive doubling (log2 n rounds);
    rank order is kept, so any associative op works.  ``sendbuf=None``:
    in place."""
    n, r = t.size, t.rank
    result = _start(sendbuf, recvbuf)
    if n == 1 or result.size == 0:
        return
    partial = result.copy()
    tmp = np.empty_like(partial)
    mask, step = 1, 0
    while mask < n:
        dst = r ^ mask
        if dst < n:
            t.waitall([t.irecv(tmp, dst, step), t.isend(partial, dst, step)])
            if r > dst:
                reduce_fn(tmp, partial)
                reduce_fn(tmp, result)
            else:
                reduce_fn(partial, tmp)
                partial, tmp = tmp, partial
        mask <<= 1
        step += 1


def exscan_recursive_doubling(t: Transport, sendbuf: Optional[np.ndarray],
                              recvbuf: np.ndarray, reduce_fn: ReduceFn) -> None:
    """Exclusive prefix reduction by recursive doubling; rank r gets
    x0 OP ... OP x_{r-1}; ``recvbuf`` on rank 0 is left untouched (undefined
    in MPI).  ``sendbuf=None``: in place (input in ``recvbuf``)."""
    n, r = t.size, t.rank
    data = _input(sendbuf, recvbuf)
    if n == 1 or data.size == 0:
        return
    partial = data.copy()
    tmp = np.empty_like(partial)
    have = False
    mask, step = 1, 0
    while mask < n:
        dst = r ^ mask
        if dst < n:
            t.waitall([t.irecv(tmp, dst, step), t.isend(partial, dst, step)])
            if r > dst:
                if have:
                    reduce_fn(tmp, recvbuf)
                else:
                    recvbuf[...] = tmp
                    have = True
                reduce_fn(tmp, partial)
            else:
                reduce_fn(partial, tmp)
                partial, tmp = tmp, partial
        mask <<= 1
        step += 1
