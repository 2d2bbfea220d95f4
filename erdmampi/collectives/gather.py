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
           "allgatherv_direct"]


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
