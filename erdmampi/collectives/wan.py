"""Large-message algorithms for ranks on different hosts (wide-area peers).

On a long path a collective pays one round trip per dependent step, plus the
rendezvous round trip of every message.  The ring allreduce of two ranks is
two dependent phases (reduce-scatter, then allgather of the reduced halves):
its allgather data can only be requested after the matching reduce-scatter
data has arrived, so the second half of the traffic waits for round trips
that the first half does not.  Between two ranks a plain exchange moves the
same bytes in each direction (the whole vector, as the ring's two halves do)
in a single phase:

* :func:`allreduce_sched_exchange`: both ranks send their whole vector, cut
  into pieces that are all posted at once (every rendezvous round trip
  overlaps the others and the data behind them), and each rank reduces the
  pieces it receives as they arrive.  Both ranks compute ``mine OP theirs``
  with a commutative op, so their results are bit-identical.

* :func:`allreduce_sched_direct` (3..8 ranks, each on its own host): the
  ring's 2(n-1) dependent steps become two phases, a reduce-scatter in which
  every rank sends each other rank that rank's block directly, and an
  allgather in which it sends its reduced block to every other rank, all
  pieces posted at once.  Each rank's uplink carries the same 2(n-1)/n of
  the vector as in the ring.
* :func:`allgatherv_sched_direct` (2..8 ranks, each on its own host): every
  rank sends its block to every other rank in :func:`wan_pieces` pieces,
  all posted at once, and receives theirs in place: one phase, as the
  exchange (the bulk allgather of one host trades a header round, a
  "could not read" round and then one rendezvous message per block; the
  ring forwards blocks in n-1 dependent steps).
* :func:`bcast_sched_pieces`: the broadcast of two ranks as the same pieces,
  all posted at once (the chained schedule keeps a window of 8 chunks per
  step, each with its own rendezvous round trip, in flight).

The dispatchers (:func:`erdmampi.collectives.allreduce`, ``bcast``) pick them by
:func:`prefer_exchange`: two ranks on two different hosts, a message of at
least :data:`SCHED_MIN <erdmampi.collectives.SCHED_MIN>` bytes, a commutative
op, no ``ERDMA_COLL_ALLREDUCE`` override.  Two ranks of one host keep the ring
(it reduces half the bytes per rank, and memory bandwidth is what counts
there).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import numpy as np

from erdmampi.collectives.base import ReduceFn, Transport, even_blocks
from erdmampi.collectives.sched import _can_schedule, _Out, _reduction_operands

__all__ = ["allreduce_sched_exchange", "allreduce_sched_direct", "bcast_sched_pieces",
           "allgatherv_sched_direct", "prefer_exchange", "prefer_direct",
           "prefer_allgather_direct", "exchange_pieces", "wan_pieces",
           "bcast_pieces"]

#: most ranks for which :func:`allreduce_sched_direct` is chosen
DIRECT_MAX = 8

#: size of one piece of an exchange (each is one rendezvous message)
PIECE = 1 << 20
#: at most this many rendezvous pieces (tags) per exchange
MAX_PIECES = 16
#: at most this many eager pieces (tags) per exchange: ERDMA_WAN_EAGER_HEAD
#: in pieces of the engine's eager limit (64 KiB) fits
MAX_EAGER_PIECES = 256
#: default of ``ERDMA_WAN_EAGER_HEAD``: bytes at the start of an exchange or
#: two-host broadcast sent as eager messages (no rendezvous round trip)
EAGER_HEAD = 16 << 20


def exchange_pieces(nbytes: int) -> int:
    """Pieces an exchange of ``nbytes`` is cut into: ~1 MiB each, 1..16."""
    return max(1, min(MAX_PIECES, -(-int(nbytes) // PIECE)))


def _env_bytes(name: str, default: int) -> int:
    from erdmampi import config
    return max(0, config.get(name, default=default))


def _eager_pieces(count: int, itemsize: int) -> Optional[List[Tuple[int, int]]]:
    """``count`` items as at most :data:`MAX_EAGER_PIECES` pieces of at most
    the eager limit (``ERDMA_EAGER_LIMIT``, 64 KiB), or None when that is not
    possible (too many, or a limit under 4 KiB)."""
    per = _env_bytes("ERDMA_EAGER_LIMIT", 65536) // itemsize
    if count <= 0 or per * itemsize < 4096 or count > per * MAX_EAGER_PIECES:
        return None
    return [(lo, min(lo + per, count)) for lo in range(0, count, per)]


def _rndv_pieces(count: int, itemsize: int) -> List[Tuple[int, int]]:
    cnts, disps = even_blocks(count, exchange_pieces(count * itemsize))
    return [(d, d + c) for c, d in zip(cnts, disps)]


def wan_pieces(count: int, itemsize: int) -> List[Tuple[int, int]]:
    """Element ranges ``(lo, hi)`` a two-host exchange of ``count`` items
    sends as separate messages (piece i on tag i).

    Every rendezvous message costs a round trip before its data leaves
    (RTS, then CTS); the pieces are posted at once, so later pieces hide
    theirs behind earlier data, but the first data of the collective waits
    one round trip, and the pieces go on data streams whose lanes start
    cold.  So a collective of at most ``ERDMA_WAN_EAGER_HEAD`` bytes (16 MiB;
    0: never) goes as pieces of at most ``ERDMA_EAGER_LIMIT`` bytes (the
    engine's eager limit, 64 KiB; at most :data:`MAX_EAGER_PIECES` of them),
    which leave at once on the control stream; a larger one as
    :func:`exchange_pieces` pieces of ~1 MiB.  At 1 % loss on a 100 Mbit/s,
    50 ms path a two-host Allgather of 1.07 MB took 0.19 s this way and
    0.26-0.30 s by rendezvous, a 16 MiB Allreduce 85 Mbit/s against 80.
    Only all or nothing in an exchange: eager data travels on the control
    stream, where the CTS that a rank owes its peer's rendezvous pieces
    would queue behind it (and behind its lost packets); that measured
    slower at 16 MiB than no eager part at all.  Were the engine's limit
    lower than the environment says, the small pieces would simply go by
    rendezvous.  Both variables must be the same on every rank (as every
    ``ERDMA_*`` setting that picks an algorithm): the layout is computed on
    each side."""
    count, itemsize = int(count), max(1, int(itemsize))
    if count * itemsize <= _env_bytes("ERDMA_WAN_EAGER_HEAD", EAGER_HEAD):
        eager = _eager_pieces(count, itemsize)
        if eager:
            return eager
    return _rndv_pieces(count, itemsize)


def bcast_pieces(nbytes: int) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """Byte ranges of a two-host broadcast as ``(rendezvous, eager)``; piece
    i of ``rendezvous + eager`` goes on tag i.  Up to ``ERDMA_WAN_EAGER_HEAD``
    bytes: :func:`wan_pieces`.  Larger: the first ``ERDMA_WAN_EAGER_HEAD``
    bytes as eager pieces too, which the root posts after the RTS of the
    rendezvous pieces; the receiver's CTS travel on its own control stream,
    which carries no eager data in a broadcast, so nothing queues behind
    the eager part (unlike an exchange, see :func:`wan_pieces`)."""
    nbytes = int(nbytes)
    head = _env_bytes("ERDMA_WAN_EAGER_HEAD", EAGER_HEAD)
    eager = _eager_pieces(min(nbytes, head), 1) if head else None
    if nbytes <= head or not eager:
        whole = wan_pieces(nbytes, 1)
        return ([], whole) if eager and nbytes <= head else (whole, [])
    rest = [(lo + head, hi + head) for lo, hi in _rndv_pieces(nbytes - head, 1)]
    return rest, eager


def prefer_exchange(t: Transport, nbytes: int, commutative: bool) -> bool:
    """True when an allreduce of ``nbytes`` on ``t`` should run
    :func:`allreduce_sched_exchange`: two ranks whose host labels differ
    (a transport without labels counts as remote: the leaders' transport of
    a hierarchical algorithm has none), large, commutative op.  Every rank
    computes the same answer."""
    from erdmampi.collectives import SCHED_MIN
    if t.size != 2 or not commutative or nbytes < SCHED_MIN:
        return False
    hosts = getattr(t, "hosts", None)
    return hosts is None or len(hosts) != 2 or hosts[0] != hosts[1]


def bcast_sched_pieces(t: Transport, buf: np.ndarray, root: int) -> Optional[bool]:
    """Two ranks: the root sends ``buf`` in :func:`bcast_pieces` pieces
    posted at once, the other rank receives them in place.  Other sizes and
    transports without schedules return ``False``."""
    from erdmampi.collectives.base import check_root
    root = check_root("bcast", root, t.size)
    if t.size != 2:
        return False
    rndv, eager = bcast_pieces(buf.nbytes)
    ranges = rndv + eager           # rendezvous first: their RTS leave first
    if not _can_schedule(t, len(ranges)):
        return False
    if buf.nbytes == 0:
        return True
    out = _Out(buf)
    data = out.work.reshape(-1).view(np.uint8)
    b = t.schedule(chunked=False)
    for i, (lo, hi) in enumerate(ranges):
        if hi > lo:
            piece = data[lo:hi]
            if t.rank == root:
                b.send(piece, 1 - root, i)
            else:
                b.recv(piece, root, i)
    b.run()
    out.done()
    return True


def allreduce_sched_exchange(t: Transport, sendbuf: Optional[np.ndarray],
                             recvbuf: np.ndarray, reduce_fn: ReduceFn,
                             commutative: bool = True) -> Optional[bool]:
    """Two ranks: each sends its whole vector to the other in
    :func:`wan_pieces` pieces posted at once, receives the other's
    pieces into ``recvbuf`` (or scratch, in place) and reduces each piece
    as it arrives, in C.  Other sizes, non-commutative or user-defined ops,
    and transports without schedules return ``False`` (the dispatcher then
    runs its default).  ``sendbuf=None``: in place (the input is copied
    once, so the send never reads a block being reduced)."""
    if t.size != 2:
        return False
    if not _can_schedule(t, MAX_EAGER_PIECES):
        return False
    ops = _reduction_operands(reduce_fn, commutative, sendbuf, recvbuf)
    if ops is None:
        return False
    opname, dtype, out, acc, src = ops
    if src is None:
        src = acc.copy()
    if acc.size == 0:
        out.done()
        return True
    other = 1 - t.rank
    ranges = wan_pieces(acc.size, dtype.itemsize)
    b = t.schedule(chunked=False)
    for i, (lo, hi) in enumerate(ranges):
        if hi <= lo:
            continue
        b.send(src[lo:hi], other, i)
        ri = b.recv(acc[lo:hi], other, i)
        b.after(b.reduce(src[lo:hi], acc[lo:hi], opname), ri, False)
    b.run()
    out.done()
    return True


def prefer_direct(t: Transport, nbytes: int, commutative: bool) -> bool:
    """True when an allreduce of ``nbytes`` on ``t`` should run
    :func:`allreduce_sched_direct`: 3..:data:`DIRECT_MAX` ranks, each on a
    host of its own (a transport without labels counts as such), large,
    commutative op.  Every rank computes the same answer."""
    from erdmampi.collectives import SCHED_MIN
    if not 3 <= t.size <= DIRECT_MAX or not commutative or nbytes < SCHED_MIN:
        return False
    hosts = getattr(t, "hosts", None)
    return hosts is None or len(hosts) != t.size or len(set(hosts)) == t.size


def allreduce_sched_direct(t: Transport, sendbuf: Optional[np.ndarray],
                           recvbuf: np.ndarray, reduce_fn: ReduceFn,
                           commutative: bool = True) -> Optional[bool]:
    """Reduce-scatter then allgather, each as one phase of direct messages
    (rank r owns block r of n), cut into :func:`exchange_pieces` pieces per
    block, all posted at once; piece p of the own block is reduced in peer
    order as the peers' pieces land (deterministic), and sent on to every
    peer as soon as it is complete.  Scratch: n-1 blocks.  Non-commutative
    or user-defined ops and transports without schedules return ``False``.
    ``sendbuf=None``: in place."""
    n, r = t.size, t.rank
    if n < 2:
        return False
    ops = _reduction_operands(reduce_fn, commutative, sendbuf, recvbuf)
    if ops is None:
        return False
    opname, dtype, out, acc, src = ops
    cnts, disps = even_blocks(acc.size, n)
    k = exchange_pieces(cnts[0] * dtype.itemsize)
    if not _can_schedule(t, 2 * k):
        return False
    if acc.size == 0:
        out.done()
        return True
    data = acc if src is None else src
    peers = [(r + i) % n for i in range(1, n)]
    tmp = np.empty((n - 1) * cnts[r], dtype)

    def pieces(blk):
        pc, pd = even_blocks(cnts[blk], k)
        return [(disps[blk] + d, disps[blk] + d + c) for c, d in zip(pc, pd)]

    mine = pieces(r)
    b = t.schedule(chunked=False)
    rs_send = {}
    for j in peers:                                     # reduce-scatter: block j to j
        for p, (lo, hi) in enumerate(pieces(j)):
            if hi > lo:
                rs_send[j, p] = b.send(data[lo:hi], j, p)
    last = {}
    for p, (lo, hi) in enumerate(mine):
        if hi <= lo:
            continue
        prev = b.copy(src[lo:hi], acc[lo:hi]) if src is not None else None
        for i, j in enumerate(peers):                   # fixed order: same sums always
            off = i * cnts[r] + (lo - disps[r])
            scratch = tmp[off:off + (hi - lo)]
            ri = b.recv(scratch, j, p)
            ei = b.reduce(scratch, acc[lo:hi], opname)
            b.after(ei, ri, False)
            if prev is not None:
                b.after(ei, prev, False)
            prev = ei
        last[p] = prev
    for j in peers:                                     # allgather
        for p, (lo, hi) in enumerate(mine):
            if hi > lo:
                b.after(b.send(acc[lo:hi], j, k + p), last[p], False)
        for p, (lo, hi) in enumerate(pieces(j)):
            if hi > lo:
                ri = b.recv(acc[lo:hi], j, k + p)
                if src is None:                         # in place: sent in the first phase
                    b.after(ri, rs_send[j, p], False)
    b.run()
    out.done()
    return True


def prefer_allgather_direct(hosts, size: int, nbytes: int) -> bool:
    """True when an allgather(v) of ``nbytes`` (the whole gathered vector)
    over ``size`` ranks with host labels ``hosts`` should run
    :func:`allgatherv_sched_direct`: 2..:data:`DIRECT_MAX` ranks, each on a
    host of its own (known from the labels: without them, the one-host bulk
    allgather stays), at least :data:`SCHED_MIN
    <erdmampi.collectives.SCHED_MIN>` bytes.  Every rank computes the same
    answer (the fast one-call Allgather of ``comm_coll`` asks it too, so
    both paths send the same messages)."""
    from erdmampi.collectives import SCHED_MIN
    if not 2 <= size <= DIRECT_MAX or nbytes < SCHED_MIN:
        return False
    return hosts is not None and len(hosts) == size and len(set(hosts)) == size


def allgatherv_sched_direct(t: Transport, sendbuf: Optional[np.ndarray],
                            recvbuf: np.ndarray, counts, displs) -> Optional[bool]:
    """Every rank sends its block straight to every other rank in
    :func:`wan_pieces` pieces (piece p on tag p), all posted at once, and
    receives each peer's block in place.  ``sendbuf=None``: own block already
    in place.  Transports without schedules, or more ranks than
    :data:`DIRECT_MAX`, return ``False``."""
    from erdmampi.collectives.base import check_counts
    n, r = t.size, t.rank
    if n > DIRECT_MAX or not _can_schedule(t, MAX_EAGER_PIECES):
        return False
    out = _Out(recvbuf)
    rv = out.work.reshape(-1)
    cnts, disps = check_counts("allgatherv", n, counts, displs, rv.size)
    mine = rv[disps[r]:disps[r] + cnts[r]]
    if sendbuf is not None:
        src = np.ascontiguousarray(sendbuf).reshape(-1)[:cnts[r]]
        if src.size != cnts[r]:
            raise ValueError(f"allgatherv: send buffer has {src.size} elements, "
                             f"counts[{r}] is {cnts[r]}")
        if cnts[r]:
            mine[...] = src
    if n == 1:
        out.done()
        return True
    isz = rv.itemsize
    b = t.schedule(chunked=False)
    posted = False
    for j in range(1, n):
        peer = (r + j) % n              # peers in a rotating order: no hot spot
        for p, (lo, hi) in enumerate(wan_pieces(cnts[r], isz)):
            if hi > lo:
                b.send(mine[lo:hi], peer, p)
                posted = True
        blk = rv[disps[peer]:disps[peer] + cnts[peer]]
        for p, (lo, hi) in enumerate(wan_pieces(cnts[peer], isz)):
            if hi > lo:
                b.recv(blk[lo:hi], peer, p)
                posted = True
    if posted:
        b.run()
    out.done()
    return True
