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

__all__ = ["alltoallv_pairwise", "alltoallv_direct"]


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
