"""Broadcast algorithms: binomial tree, van de Geijn (scatter + ring
allgather) and a pipelined chain.

All take ``buf`` (a 1-D C-contiguous array, the same number of bytes on every
rank): the data at ``root`` is copied into ``buf`` on every other rank.
"""

from __future__ import annotations

import numpy as np

from erdmampi.collectives.base import Transport, as_bytes, check_root

__all__ = ["bcast_binomial", "bcast_scatter_allgather", "bcast_pipeline",
           "PIPELINE_SEGMENT"]

#: Segment size (bytes) of :func:`bcast_pipeline`.
PIPELINE_SEGMENT = 128 * 1024


def _binomial_parent(vr: int) -> tuple[int, int]:
    """(parent vrank, mask) of ``vr`` in a binomial tree rooted at vrank 0;
    for vr == 0 the parent is -1 and mask is the first power of two >= n."""
    if vr == 0:
        return -1, 0
    mask = vr & -vr
    return vr - mask, mask


def _binomial_down(t: Transport, vr: int, root: int, part) -> None:
    """One pass down a binomial tree in virtual-rank space: receive this
    vrank's part from its parent, then send each child the part of its
    subtree.  ``part(lo, hi)`` is the array for vranks [lo, hi); empty parts
    are not sent."""
    n = t.size
    parent, mask = _binomial_parent(vr)
    if parent >= 0:
        mine = part(vr, min(vr + mask, n))
        if mine.size:
            t.waitall([t.irecv(mine, (parent + root) % n, 0)])
    else:
        mask = 1
        while mask < n:
            mask <<= 1
    reqs = []
    mask >>= 1
    while mask > 0:
        child = vr + mask
        if child < n:
            sub = part(child, min(child + mask, n))
            if sub.size:
                reqs.append(t.isend(sub, (child + root) % n, 0))
        mask >>= 1
    t.waitall(reqs)


def bcast_binomial(t: Transport, buf: np.ndarray, root: int) -> None:
    """Binomial tree: ceil(log2 n) rounds, each rank sends the whole buffer to
    at most log2 n children.  Best for small messages."""
    n, r = t.size, t.rank
    root = check_root("bcast", root, n)
    if n <= 1 or buf.nbytes == 0:
        return
    _binomial_down(t, (r - root) % n, root, lambda lo, hi: buf)


def bcast_scatter_allgather(t: Transport, buf: np.ndarray, root: int) -> None:
    """van de Geijn: the root's buffer is cut into n chunks (by bytes) and
    scattered down a binomial tree, then a ring allgather reassembles it on
    every rank.  About 2x the bandwidth optimum, for large messages."""
    n, r = t.size, t.rank
    root = check_root("bcast", root, n)
    if n <= 1 or buf.nbytes == 0:
        return
    data = as_bytes(buf)
    nbytes = data.size
    chunk = -(-nbytes // n)

    def span(lo: int, hi: int) -> np.ndarray:
        """Bytes of chunks [lo, hi) (chunk index = virtual rank)."""
        return data[min(lo * chunk, nbytes):min(hi * chunk, nbytes)]

    vr = (r - root) % n
    # -- scatter: vrank v ends up with chunks [v, v + subtree size)
    _binomial_down(t, vr, root, span)
    # -- ring allgather of the n chunks, in virtual-rank space
    right = (vr + 1) % n
    left = (vr - 1) % n
    for step in range(n - 1):
        sidx = (vr - step) % n
        ridx = (vr - step - 1) % n
        reqs = []
        # the root has every chunk: it receives nothing (so its buffer may be
        # read-only) and its left neighbour sends it nothing
        rpart = span(ridx, ridx + 1)
        if rpart.size and vr != 0:
            reqs.append(t.irecv(rpart, (left + root) % n, 1 + step % 1000))
        spart = span(sidx, sidx + 1)
        if spart.size and right != 0:
            reqs.append(t.isend(spart, (right + root) % n, 1 + step % 1000))
        t.waitall(reqs)


def bcast_pipeline(t: Transport, buf: np.ndarray, root: int,
                   segment: int = PIPELINE_SEGMENT) -> None:
    """Pipelined chain root -> root+1 -> ... : the buffer travels in segments
    of ``segment`` bytes, so every link is busy at once.  Near the bandwidth
    optimum for very large messages; latency grows with n."""
    n, r = t.size, t.rank
    root = check_root("bcast", root, n)
    if n <= 1 or buf.nbytes == 0:
        return
    data = as_bytes(buf)
    segment = max(1, int(segment))
    segs = [data[o:o + segment] for o in range(0, data.size, segment)]
    vr = (r - root) % n
    prev = (r - 1) % n
    nxt = (r + 1) % n
    has_next = vr + 1 < n
    sends = []
    if vr == 0:
        for seg in segs:
            sends.append(t.isend(seg, nxt, 0))
    else:
        recvs = [t.irecv(seg, prev, 0) for seg in segs]
        for seg, rq in zip(segs, recvs):
            t.waitall([rq])
            if has_next:
                sends.append(t.isend(seg, nxt, 0))
    t.waitall(sends)
