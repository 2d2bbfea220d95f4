"""Barrier algorithms."""

from __future__ import annotations

import numpy as np

from erdmampi.collectives.base import Transport

__all__ = ["barrier_dissemination"]


def barrier_dissemination(t: Transport) -> None:
    """Dissemination barrier (Hensgen, Finkel, Manber): ceil(log2 n) rounds;
    in round k rank r sends a token to r + 2**k and waits for one from
    r - 2**k.  Works for any size."""
    n, r = t.size, t.rank
    if n <= 1:
        return
    pair = getattr(t, "pair_barrier", None)     # two ranks of one host: flags once agreed
    if n == 2 and pair is not None and pair():
        return
    token = np.zeros(1, dtype=np.uint8)
    sink = np.empty(1, dtype=np.uint8)
    dist, step = 1, 0
    while dist < n:
        rq = t.irecv(sink, (r - dist) % n, step)
        sq = t.isend(token, (r + dist) % n, step)
        t.waitall([rq, sq])
        dist <<= 1
        step += 1
