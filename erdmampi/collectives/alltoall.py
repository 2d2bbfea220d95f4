"""All-to-all with per-pair counts (``alltoallv``; alltoall is the special
case of equal counts).  Counts and displacements are in elements.

A rank only knows its own counts, so ranks may pick different algorithms
here; both algorithms therefore send the message from r to r+k with tag k and
interoperate message for message.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from erdmampi.collectives.base import Transport, block, check_counts

__all__ = ["alltoallv_pairwise", "alltoallv_direct", "alltoall_bruck"]


def _prepare(t, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls):
    n = t.size
    rcounts, rdispls = check_counts("alltoallv", n, rcounts, rdispls, recvbuf.size)
    if sendbuf is None:
        # in place: the data to send sits in recvbuf with the receive layout
        sendbuf = recvbuf.copy()
        scounts, sdispls = rcounts, rdispls
    else:
        scounts, sdispls = check_counts("alltoallv", n, scounts, sdispls, sendbuf.size)
    r = t.rank
    if scounts[r] != rcounts[r]:
        raise ValueError(f"alltoallv: rank {r} sends {scounts[r]} elements to "
                         f"itself but expects {rcounts[r]}")
    if rcounts[r]:
        block(recvbuf, rdispls[r], rcounts[r])[...] = block(sendbuf, sdispls[r], scounts[r])
    return sendbuf, scounts, sdispls, rcounts, rdispls


def alltoallv_pairwise(t: Transport, sendbuf: Optional[np.ndarray],
                       scounts: Optional[Sequence[int]], sdispls: Optional[Sequence[int]],
                       recvbuf: np.ndarray, rcounts: Sequence[int],
                       rdispls: Optional[Sequence[int]]) -> None:
    """Pairwise exchange: n-1 steps; in step k rank r sends to r+k and
    receives from r-k, so each step has one message per rank in flight.
    ``sendbuf=None``: in place (data in ``recvbuf``, layout rcounts/rdispls)."""
    n, r = t.size, t.rank
    sendbuf, scounts, sdispls, rcounts, rdispls = _prepare(
        t, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls)
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        reqs = []
        if rcounts[src]:
            reqs.append(t.irecv(block(recvbuf, rdispls[src], rcounts[src]), src, k % 1024))
        if scounts[dst]:
            reqs.append(t.isend(block(sendbuf, sdispls[dst], scounts[dst]), dst, k % 1024))
        t.waitall(reqs)


def alltoallv_direct(t: Transport, sendbuf: Optional[np.ndarray],
                     scounts: Optional[Sequence[int]], sdispls: Optional[Sequence[int]],
                     recvbuf: np.ndarray, rcounts: Sequence[int],
                     rdispls: Optional[Sequence[int]]) -> None:
    """All 2(n-1) messages posted at once, then one waitall: lowest latency
    for small messages."""
    n, r = t.size, t.rank
    sendbuf, scounts, sdispls, rcounts, rdispls = _prepare(
        t, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls)
    reqs = []
    for k in range(1, n):
        src = (r - k) % n
        if rcounts[src]:
            reqs.append(t.irecv(block(recvbuf, rdispls[src], rcounts[src]), src, k % 1024))
    for k in range(1, n):
        dst = (r + k) % n
        if scounts[dst]:
            reqs.append(t.isend(block(sendbuf, sdispls[dst], scounts[dst]), dst, k % 1024))
    t.waitall(reqs)


def alltoall_bruck(t: Transport, sendbuf: Optional[np.ndarray],
                   recvbuf: np.ndarray) -> None:
    """Bruck all-to-all of equal blocks (``recvbuf.size // n`` elements per
    rank pair): ceil(log2 n) steps instead of n-1.  The blocks are rotated
    so that position i holds the block for rank r+i; in step k every block
    whose position has bit k set goes to rank r + 2**k (packed into one
    message) and is replaced by the one from r - 2**k; finally position i
    holds the block from rank r-i.  Each block travels up to log2 n times,
    so this is for small blocks.  ``sendbuf=None``: in place.  Every rank
    must use it alike (it does not interoperate with the alltoallv ones)."""
    n, r = t.size, t.rank
    blk = recvbuf.size // n
    src = recvbuf if sendbuf is None else sendbuf
    if sendbuf is not None and sendbuf.size != blk * n:
        raise ValueError(f"alltoall: send buffer has {sendbuf.size} elements, "
                         f"expected {blk * n}")
    if blk == 0:
        return
    if n == 1:
        if sendbuf is not None:
            recvbuf[:blk] = sendbuf[:blk]
        return
    work = np.empty((n, blk), dtype=recvbuf.dtype)
    s2 = src[:n * blk].reshape(n, blk)
    work[:n - r] = s2[r:]                        # position i: block for r+i
    work[n - r:] = s2[:r]
    pack = np.empty(((n + 1) // 2, blk), dtype=recvbuf.dtype)
    unpack = np.empty_like(pack)
    dist, step = 1, 0
    while dist < n:
        idx = [i for i in range(n) if i & dist]
        m = len(idx)
        np.take(work, idx, axis=0, out=pack[:m])
        rq = t.irecv(unpack[:m].reshape(-1), (r - dist) % n, step)
        sq = t.isend(pack[:m].reshape(-1), (r + dist) % n, step)
        t.waitall([rq, sq])
        work[idx] = unpack[:m]
        dist <<= 1
        step += 1
    # position i holds the block from rank r - i
    r2 = recvbuf[:n * blk].reshape(n, blk)
    order = [(r - i) % n for i in range(n)]
    r2[order] = work
