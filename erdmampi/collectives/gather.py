"""Gather, scatter and allgather with per-rank counts (the ``v`` forms; the
regular forms are the special case of equal counts).

Counts and displacements are in elements of the 1-D buffers.  Zero-sized
blocks are not sent at all (both ends know the count, so they agree).
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from erdmampi.collectives.base import Transport, block, check_counts, check_root

__all__ = ["gatherv_linear", "scatterv_linear", "allgatherv_ring",
           "allgatherv_direct", "allgatherv_bruck", "allgatherv_recursive_doubling",
           "gather_binomial", "gather_linear", "scatter_binomial", "scatter_linear"]


def gatherv_linear(t: Transport, sendbuf: Optional[np.ndarray],
                   recvbuf: Optional[np.ndarray], counts: Optional[Sequence[int]],
                   displs: Optional[Sequence[int]], root: int) -> None:
    """Every rank sends its ``sendbuf`` to ``root``, which posts all receives
    at once into ``recvbuf[displs[i]:displs[i]+counts[i]]``.  ``recvbuf``,
    ``counts`` and ``displs`` matter at the root only; ``sendbuf=None`` at the
    root means its block is already in place."""
    n, r = t.size, t.rank
    root = check_root("gatherv", root, n)
    if r != root:
        if sendbuf is not None and sendbuf.size:
            t.waitall([t.isend(sendbuf, root, 0)])
        return
    counts, displs = check_counts("gatherv", n, counts, displs, recvbuf.size)
    reqs = []
    for i in range(n):
        if i != root and counts[i]:
            reqs.append(t.irecv(block(recvbuf, displs[i], counts[i]), i, 0))
    if sendbuf is not None and counts[root]:
        block(recvbuf, displs[root], counts[root])[...] = sendbuf[:counts[root]]
    t.waitall(reqs)


def scatterv_linear(t: Transport, sendbuf: Optional[np.ndarray],
                    counts: Optional[Sequence[int]], displs: Optional[Sequence[int]],
                    recvbuf: Optional[np.ndarray], root: int) -> None:
    """The root sends ``sendbuf[displs[i]:displs[i]+counts[i]]`` to rank i,
    all at once.  ``sendbuf``, ``counts``, ``displs`` matter at the root only;
    ``recvbuf=None`` at the root means in place (its block stays in sendbuf)."""
    n, r = t.size, t.rank
    root = check_root("scatterv", root, n)
    if r != root:
        if recvbuf is not None and recvbuf.size:
            t.waitall([t.irecv(recvbuf, root, 0)])
        return
    counts, displs = check_counts("scatterv", n, counts, displs, sendbuf.size)
    reqs = []
    for i in range(n):
        if i != root and counts[i]:
            reqs.append(t.isend(block(sendbuf, displs[i], counts[i]), i, 0))
    if recvbuf is not None and counts[root]:
        recvbuf[:counts[root]] = block(sendbuf, displs[root], counts[root])
    t.waitall(reqs)


def _own_block(t: Transport, sendbuf, recvbuf, counts, displs) -> None:
    """Copy this rank's contribution into its block of recvbuf (unless in place)."""
    r = t.rank
    if sendbuf is not None and counts[r]:
        block(recvbuf, displs[r], counts[r])[...] = sendbuf[:counts[r]]


def allgatherv_ring(t: Transport, sendbuf: Optional[np.ndarray],
                    recvbuf: np.ndarray, counts: Sequence[int],
                    displs: Optional[Sequence[int]]) -> None:
    """Ring: n-1 steps; in step k rank r forwards block r-k to r+1 and receives
    block r-k-1 from r-1, straight into ``recvbuf``.  Bandwidth-optimal.
    ``sendbuf=None``: the own block is already in ``recvbuf``."""
    n, r = t.size, t.rank
    counts, displs = check_counts("allgatherv", n, counts, displs, recvbuf.size)
    _own_block(t, sendbuf, recvbuf, counts, displs)
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        s = (r - step) % n
        q = (r - step - 1) % n
        reqs = []
        if counts[q]:
            reqs.append(t.irecv(block(recvbuf, displs[q], counts[q]), left, step % 1024))
        if counts[s]:
            reqs.append(t.isend(block(recvbuf, displs[s], counts[s]), right, step % 1024))
        t.waitall(reqs)


def allgatherv_direct(t: Transport, sendbuf: Optional[np.ndarray],
                      recvbuf: np.ndarray, counts: Sequence[int],
                      displs: Optional[Sequence[int]]) -> None:
    """Every rank sends its block to every other rank, all messages in flight
    at once: one latency, n-1 messages per rank.  For small messages and few
    ranks."""
    n, r = t.size, t.rank
    counts, displs = check_counts("allgatherv", n, counts, displs, recvbuf.size)
    _own_block(t, sendbuf, recvbuf, counts, displs)
    reqs = []
    for i in range(n):
        if i != r and counts[i]:
            reqs.append(t.irecv(block(recvbuf, displs[i], counts[i]), i, 0))
    if counts[r]:
        mine = block(recvbuf, displs[r], counts[r])
        for k in range(1, n):
            reqs.append(t.isend(mine, (r + k) % n, 0))
    t.waitall(reqs)


def _packed(counts: Sequence[int]) -> list[int]:
    """Exclusive prefix sums of ``counts`` plus the total (n + 1 entries)."""
    off = [0]
    for c in counts:
        off.append(off[-1] + c)
    return off


def allgatherv_bruck(t: Transport, sendbuf: Optional[np.ndarray],
                     recvbuf: np.ndarray, counts: Sequence[int],
                     displs: Optional[Sequence[int]]) -> None:
    """Bruck: ceil(log2 n) steps for any n.  Rank r keeps the blocks in the
    rotated order r, r+1, ... in a packed scratch vector; in step k (distance
    d = 2**k) it sends its first min(d, n-d) blocks to r-d and appends the
    same number of blocks received from r+d.  A final local copy puts the
    blocks in place.  Latency-optimal for small vectors on many ranks."""
    n, r = t.size, t.rank
    counts, displs = check_counts("allgatherv", n, counts, displs, recvbuf.size)
    if n == 1:
        _own_block(t, sendbuf, recvbuf, counts, displs)
        return
    rot = [counts[(r + i) % n] for i in range(n)]
    off = _packed(rot)
    work = np.empty(off[-1], dtype=recvbuf.dtype)
    if counts[r]:
        own = sendbuf[:counts[r]] if sendbuf is not None else block(recvbuf, displs[r], counts[r])
        work[:counts[r]] = own
    dist, step = 1, 0
    while dist < n:
        cnt = min(dist, n - dist)
        reqs = []
        rpart = work[off[dist]:off[dist + cnt]]
        if rpart.size:
            reqs.append(t.irecv(rpart, (r + dist) % n, step))
        spart = work[:off[cnt]]
        if spart.size:
            reqs.append(t.isend(spart, (r - dist) % n, step))
        t.waitall(reqs)
        dist <<= 1
        step += 1
    for i in range(n):
        q = (r + i) % n
        if counts[q] and (i or sendbuf is not None):
            block(recvbuf, displs[q], counts[q])[...] = work[off[i]:off[i + 1]]


def allgatherv_recursive_doubling(t: Transport, sendbuf: Optional[np.ndarray],
                                  recvbuf: np.ndarray, counts: Sequence[int],
                                  displs: Optional[Sequence[int]]) -> None:
    """Recursive doubling: log2 n steps; in step k rank r swaps the 2**k
    blocks it holds with rank r XOR 2**k, so the held range doubles.  Works
    in ``recvbuf`` directly when the blocks are packed in rank order (else in
    a scratch vector).  Power-of-two sizes only: other sizes run
    :func:`allgatherv_bruck`."""
    n, r = t.size, t.rank
    if n & (n - 1):
        return allgatherv_bruck(t, sendbuf, recvbuf, counts, displs)
    counts, displs = check_counts("allgatherv", n, counts, displs, recvbuf.size)
    off = _packed(counts)
    inplace = displs == off[:-1]
    work = recvbuf if inplace else np.empty(off[-1], dtype=recvbuf.dtype)
    if counts[r]:
        own = sendbuf[:counts[r]] if sendbuf is not None else block(recvbuf, displs[r], counts[r])
        if not (inplace and sendbuf is None):
            work[off[r]:off[r + 1]] = own
    mask, step = 1, 0
    while mask < n:
        mine = r & ~(mask - 1)
        peer = r ^ mask
        theirs = peer & ~(mask - 1)
        reqs = []
        rpart = work[off[theirs]:off[theirs + mask]]
        if rpart.size:
            reqs.append(t.irecv(rpart, peer, step))
        spart = work[off[mine]:off[mine + mask]]
        if spart.size:
            reqs.append(t.isend(spart, peer, step))
        t.waitall(reqs)
        mask <<= 1
        step += 1
    if not inplace:
        for q in range(n):
            if counts[q] and (q != r or sendbuf is not None):
                block(recvbuf, displs[q], counts[q])[...] = work[off[q]:off[q + 1]]


# -- regular gather / scatter (every block has the same size, known to all) --

def _subtree(vr: int, n: int) -> int:
    """One past the last vrank of the binomial subtree rooted at ``vr``."""
    if vr == 0:
        return n
    return min(vr + (vr & -vr), n)


def gather_binomial(t: Transport, sendbuf: Optional[np.ndarray],
                    recvbuf: Optional[np.ndarray], root: int) -> None:
    """Binomial tree gather of equal blocks: ceil(log2 n) rounds; every rank
    collects the blocks of its subtree (consecutive virtual ranks) and sends
    them to its parent in one message.  The block size is ``sendbuf.size``
    (at the root: ``recvbuf.size // n``; ``sendbuf=None`` there means its
    block is already in place).  For small blocks."""
    n, r = t.size, t.rank
    root = check_root("gather", root, n)
    if r == root:
        if recvbuf is None:
            raise ValueError("gather: the root needs a receive buffer")
        blk = recvbuf.size // n
        dtype = recvbuf.dtype
    else:
        blk = 0 if sendbuf is None else sendbuf.size
        dtype = None if sendbuf is None else sendbuf.dtype
    if blk == 0:
        return
    vr = (r - root) % n
    hi = _subtree(vr, n)
    if r == root and root == 0:
        work = recvbuf[:n * blk]               # virtual order == rank order
    else:
        work = np.empty((hi - vr) * blk, dtype=dtype)
    if sendbuf is not None:
        work[:blk] = sendbuf[:blk]
    elif r == root:
        work[:blk] = recvbuf[root * blk:(root + 1) * blk]
    reqs = []
    mask = 1
    while vr + mask < hi:
        child = vr + mask
        chi = _subtree(child, n)
        reqs.append(t.irecv(work[(child - vr) * blk:(chi - vr) * blk],
                            (child + root) % n, 0))
        mask <<= 1
    t.waitall(reqs)
    if vr:
        t.waitall([t.isend(work, (vr - (vr & -vr) + root) % n, 0)])
    elif root:
        # vrank v is rank (v + root) % n: undo the rotation
        tail = n - root
        recvbuf[root * blk:n * blk] = work[:tail * blk]
        recvbuf[:root * blk] = work[tail * blk:]


def scatter_binomial(t: Transport, sendbuf: Optional[np.ndarray],
                     recvbuf: Optional[np.ndarray], root: int) -> None:
    """Binomial tree scatter of equal blocks: the root sends each child the
    blocks of its whole subtree in one message, which forwards them on.  The
    block size is ``recvbuf.size`` (at the root: ``sendbuf.size // n``;
    ``recvbuf=None`` there means in place).  For small blocks."""
    n, r = t.size, t.rank
    root = check_root("scatter", root, n)
    if r == root:
        if sendbuf is None:
            raise ValueError("scatter: the root needs a send buffer")
        blk = sendbuf.size // n
        dtype = sendbuf.dtype
    else:
        blk = 0 if recvbuf is None else recvbuf.size
        dtype = None if recvbuf is None else recvbuf.dtype
    if blk == 0:
        return
    vr = (r - root) % n
    hi = _subtree(vr, n)
    leaf = False
    if vr == 0:
        if root == 0:
            work = sendbuf[:n * blk]
        else:
            work = np.empty(n * blk, dtype=dtype)
            tail = n - root
            work[:tail * blk] = sendbuf[root * blk:n * blk]
            work[tail * blk:] = sendbuf[:root * blk]
    elif hi - vr == 1:
        work = recvbuf[:blk]                   # a leaf receives in place
        leaf = True
    else:
        work = np.empty((hi - vr) * blk, dtype=dtype)
    if vr:
        t.waitall([t.irecv(work, (vr - (vr & -vr) + root) % n, 0)])
    reqs = []
    mask = 1
    while mask < hi - vr:
        mask <<= 1
    mask >>= 1
    while mask >= 1:
        child = vr + mask
        if child < hi:
            chi = _subtree(child, n)
            reqs.append(t.isend(work[(child - vr) * blk:(chi - vr) * blk],
                                (child + root) % n, 0))
        mask >>= 1
    if recvbuf is not None and not leaf:
        recvbuf[:blk] = work[:blk]
    t.waitall(reqs)


def gather_linear(t: Transport, sendbuf: Optional[np.ndarray],
                  recvbuf: Optional[np.ndarray], root: int) -> None:
    """:func:`gatherv_linear` with equal packed blocks."""
    n = t.size
    counts = displs = None
    if t.rank == check_root("gather", root, n):
        blk = recvbuf.size // n
        counts, displs = [blk] * n, [blk * i for i in range(n)]
    gatherv_linear(t, sendbuf, recvbuf, counts, displs, root)


def scatter_linear(t: Transport, sendbuf: Optional[np.ndarray],
                   recvbuf: Optional[np.ndarray], root: int) -> None:
    """:func:`scatterv_linear` with equal packed blocks."""
    n = t.size
    counts = displs = None
    if t.rank == check_root("scatter", root, n):
        blk = sendbuf.size // n
        counts, displs = [blk] * n, [blk * i for i in range(n)]
    scatterv_linear(t, sendbuf, counts, displs, recvbuf, root)
