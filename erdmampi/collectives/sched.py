"""Collective algorithms as schedules run by the C engine.

For large messages the per-chunk loop must not run in the interpreter: the
functions here describe a collective once, as a graph of block-sized steps
(send, recv, reduce, copy) with dependencies, and the engine's executor
(``ext/src/erdma_sched.c``) splits every step into chunks, posts each chunk
as soon as the chunks it depends on are done (so the reduction of chunk k
overlaps the transfer of chunk k+1) and reduces with vectorised C kernels.
Python never sees a chunk.

A transport that can run schedules has a method ``schedule(chunked=True)``
returning a builder with:

* ``send(arr, dest, tag)``, ``recv(arr, source, tag)`` -> step index
  (``arr``: a C-contiguous array; ranks are communicator ranks, tags 0..MAX_TAG,
  each (peer, tag) used by one send and one recv step at most)
* ``reduce(inarr, inoutarr, op)`` -> step index: ``inout = in OP inout``,
  ``op`` an ``erdma`` op name (``"SUM"`` ...), element type from ``inoutarr``
* ``copy(src, dst)`` -> step index
* ``after(step, on, chunkwise=True)``: ``step`` waits for ``on``; chunkwise
  (chunk c waits for chunk c) only between steps that cover their arrays
  from the same relative offset
* ``barrier()``: later steps wait for all earlier ones
* ``run()``: run it to completion (a C worker; the GIL is released)

Every function returns ``False`` without communicating when it cannot run
(no schedule support, an op or element type the C reducer lacks, a
non-commutative op, too many ranks for the tag space); the dispatcher in
:mod:`erdmampi.collectives` then runs the Python algorithm.  These
conditions are the same on every rank.  Chunked algorithms must be chosen
by every rank alike; :func:`alltoallv_sched` sends whole blocks with the tags
of :func:`~erdmampi.collectives.alltoall.alltoallv_pairwise`, so it
interoperates with the Python all-to-all algorithms.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from erdmampi.collectives.base import (MAX_TAG, ReduceFn, Transport, check_counts,
                                       check_root, even_blocks)

__all__ = [
    "SCHED_OPS", "SCHED_DTYPES", "sched_reduction",
    "allreduce_sched_ring", "reduce_scatter_sched_ring", "allgatherv_sched_ring",
    "bcast_sched_chain", "alltoallv_sched", "bcast_sched_pair", "bcast_sched_pull", "alltoall_sched",
    "allreduce_sched_pair", "allreduce_sched_slices", "reduce_scatter_sched_slices",
]

#: predefined reduction ops the C reducer implements
SCHED_OPS = frozenset(("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR",
                       "BAND", "BOR", "BXOR"))
#: element types (NumPy names) the C reducer implements
SCHED_DTYPES = frozenset(("int8", "int16", "int32", "int64", "uint8", "uint16",
                          "uint32", "uint64", "float32", "float64",
                          "complex64", "complex128"))
_LOGICAL = frozenset(("LAND", "LOR", "LXOR"))


def sched_reduction(reduce_fn: ReduceFn) -> Optional[tuple[str, np.dtype]]:
    """(op name, element dtype) if the C reducer can apply ``reduce_fn``.

    The comm layer tags the reduction callbacks of predefined ops with an
    attribute ``sched = (op_name, numpy dtype)``; user-defined ops carry none.
    Booleans reduce as uint8 under the logical ops (same bytes: 0/1)."""
    info = getattr(reduce_fn, "sched", None)
    if info is None:
        return None
    name, dtype = info
    dtype = np.dtype(dtype)
    if dtype == np.bool_ and name in _LOGICAL:
        dtype = np.dtype(np.uint8)
    if name not in SCHED_OPS or dtype.name not in SCHED_DTYPES or dtype.byteorder == ">":
        return None
    return name, dtype


def _can_schedule(t: Transport, nsteps_tags: int = 0) -> bool:
    return callable(getattr(t, "schedule", None)) and nsteps_tags <= MAX_TAG + 1


def _typed(arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """1-D view of a contiguous array as ``dtype`` (no copy)."""
    return arr.reshape(-1).view(np.uint8).view(dtype)


def _contig(arr: Optional[np.ndarray]) -> Optional[np.ndarray]:
    return None if arr is None else np.ascontiguousarray(arr)


class _Out:
    """A writable contiguous stand-in for ``arr``, copied back by ``done``."""

    def __init__(self, arr: np.ndarray):
        self.arr = arr
        self.work = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)

    def done(self) -> None:
        if self.work is not self.arr:
            self.arr[...] = self.work


def _reduction_operands(reduce_fn: ReduceFn, commutative: bool,
                        sendbuf: Optional[np.ndarray], recvbuf: np.ndarray):
    """``(opname, dtype, out, acc, src)`` for an allreduce schedule: ``out`` the
    contiguous stand-in of ``recvbuf``, ``acc`` its typed view, ``src`` the typed
    input (None: in place); None when the C reducer cannot apply the op
    (user-defined, non-commutative, or ``recvbuf`` not whole elements).
    Raises ValueError when the buffers' element counts differ."""
    red = sched_reduction(reduce_fn)
    if red is None or not commutative:
        return None
    opname, dtype = red
    if recvbuf.nbytes % dtype.itemsize:
        return None
    out = _Out(recvbuf)
    acc = _typed(out.work, dtype)
    src = None if sendbuf is None else _typed(_contig(sendbuf), dtype)
    if src is not None and src.size != acc.size:
        raise ValueError(f"allreduce: send buffer has {src.size} elements, "
                         f"receive buffer {acc.size}")
    return opname, dtype, out, acc, src


# -- allreduce ---------------------------------------------------------------

def allreduce_sched_ring(t: Transport, sendbuf: Optional[np.ndarray],
                         recvbuf: np.ndarray, reduce_fn: ReduceFn,
                         commutative: bool = True) -> Optional[bool]:
    """Ring reduce-scatter then ring allgather (each rank sends 2(n-1)/n of
    the vector), chunk-pipelined in C.  Not in place, the reduce-scatter
    receives straight into ``recvbuf`` and reduces ``sendbuf`` into it, so
    no copy of the input is made; in place, it receives into two
    alternating scratch blocks.  Commutative predefined ops only."""
    n, r = t.size, t.rank
    if not _can_schedule(t, 2 * n):
        return False
    ops = _reduction_operands(reduce_fn, commutative, sendbuf, recvbuf)
    if ops is None:
        return False
    opname, dtype, out, acc, src = ops
    if n == 1 or acc.size == 0:
        if src is not None:
            acc[...] = src
        out.done()
        return True
    cnts, disps = even_blocks(acc.size, n)

    def blk(arr, i):
        return arr[disps[i]:disps[i] + cnts[i]]

    b = t.schedule()
    tmp = None if src is not None else [np.empty(cnts[0], dtype), np.empty(cnts[0], dtype)]
    right, left = (r + 1) % n, (r - 1) % n
    reds, sends = [], []
    for k in range(n - 1):                       # reduce-scatter
        s, q = (r - k) % n, (r - k - 1) % n
        si = b.send(blk(src, s) if (k == 0 and src is not None) else blk(acc, s), right, k)
        if k:
            b.after(si, reds[k - 1])
        if src is None:
            tb = tmp[k % 2][:cnts[q]]
            ri = b.recv(tb, left, k)
            if k >= 2:
                b.after(ri, reds[k - 2])         # scratch block reuse
            ei = b.reduce(tb, blk(acc, q), opname)
        else:
            ri = b.recv(blk(acc, q), left, k)
            ei = b.reduce(blk(src, q), blk(acc, q), opname)
        b.after(ei, ri)
        reds.append(ei)
        sends.append(si)
    prev = reds[-1]                              # rank r owns block r+1
    for k in range(n - 1):                       # allgather
        s, q = (r + 1 - k) % n, (r - k) % n
        si = b.send(blk(acc, s), right, n - 1 + k)
        b.after(si, prev)
        ri = b.recv(blk(acc, q), left, n - 1 + k)
        b.after(ri, sends[k])                    # block q left in reduce-scatter step k
        prev = ri
    b.run()
    out.done()
    return True


# -- reduce_scatter ----------------------------------------------------------

def allreduce_sched_pair(t: Transport, sendbuf: Optional[np.ndarray],
                         recvbuf: np.ndarray, reduce_fn: ReduceFn,
                         commutative: bool = True) -> Optional[bool]:
    """Two ranks, one engine call (``erdma_coll_allreduce_pair``): each reads
    the other's whole input (CMA on one host) and reduces it with its own in
    rank order, so both compute the same bits; one round of messages before
    and one after, for mid sizes where a ring's extra rounds cost more than
    the second half of the reduction.  Predefined ops on C-reducible types;
    in place too (the engine keeps the inputs it still reads)."""
    if t.size != 2:
        return False
    b = _bulk(t)
    if b is None:
        return False
    ops = _reduction_operands(reduce_fn, commutative, sendbuf, recvbuf)
    if ops is None:
        return False
    opname, dtype, out, acc, src = ops
    if acc.size:
        if src is not None and src is not acc and np.shares_memory(src, acc):
            src = src.copy()
        b.allreduce_pair(src, acc, opname, t.rank)
    out.done()
    return True


def allreduce_sched_slices(t: Transport, sendbuf: Optional[np.ndarray],
                           recvbuf: np.ndarray, reduce_fn: ReduceFn,
                           commutative: bool = True) -> Optional[bool]:
    """Three or more ranks of one host, one engine call
    (``erdma_coll_allreduce_slices``): rank k reduces slice k of every input
    straight out of the other ranks' buffers (CMA) in rank order, then every
    rank reads each slice out of its owner: each byte is read twice and
    reduced once, with four rounds of small messages, where a ring passes
    partial blocks through n - 1 steps.  Where CMA cannot be used (or the
    op and type are not C-reducible) :func:`allreduce_sched_ring` runs
    instead; in place too."""
    b = _bulk(t) if t.size >= 3 else None
    ops = None if b is None else _reduction_operands(reduce_fn, commutative, sendbuf, recvbuf)
    if ops is None:
        return allreduce_sched_ring(t, sendbuf, recvbuf, reduce_fn, commutative)
    opname, dtype, out, acc, src = ops
    if acc.size:
        if src is not None and src is not acc and np.shares_memory(src, acc):
            src = src.copy()
        if not b.allreduce_slices(src, acc, opname, t.rank):
            return allreduce_sched_ring(t, sendbuf, recvbuf, reduce_fn, commutative)
    out.done()
    return True


def reduce_scatter_sched_pair(t: Transport, sendbuf: Optional[np.ndarray],
                              recvbuf: np.ndarray, recvcounts: Sequence[int],
                              reduce_fn: ReduceFn,
                              commutative: bool = True) -> Optional[bool]:
    """Two ranks, equal blocks, one engine call
    (``erdma_coll_reduce_scatter_pair``): each reads its block of the
    other's input (CMA on one host) and reduces it with its own in rank
    order; one round of messages before and one after.  Unequal blocks or
    more ranks: :func:`reduce_scatter_sched_ring` (on every rank alike).
    ``sendbuf=None``: in place, as there."""
    if t.size != 2 or len(recvcounts) != 2 or int(recvcounts[0]) != int(recvcounts[1]):
        return reduce_scatter_sched_ring(t, sendbuf, recvbuf, recvcounts, reduce_fn,
                                         commutative)
    red = sched_reduction(reduce_fn)
    b = _bulk(t)
    if red is None or not commutative or b is None:
        return False
    opname, dtype = red
    ops = _block_operands(sendbuf, recvbuf, 2, int(recvcounts[0]), dtype)
    if ops is None:
        return True
    out, acc, src = ops
    b.reduce_scatter_pair(src, acc, opname, t.rank)
    out.done()
    return True


def _block_operands(sendbuf, recvbuf, n, cnt, dtype):
    """``(out, acc, src)`` for a Reduce_scatter of ``n`` equal blocks of
    ``cnt`` elements: ``out`` the contiguous stand-in of ``recvbuf``, ``acc``
    its first block, ``src`` the whole input, copied where it shares memory
    with ``acc`` (``sendbuf=None``: the input is ``recvbuf``'s first n
    blocks); None when the blocks are empty.  Raises ValueError when the
    input does not hold the n blocks."""
    data = _typed(_contig(recvbuf if sendbuf is None else sendbuf), dtype)
    if data.size < n * cnt or sendbuf is not None and data.size != n * cnt:
        raise ValueError(f"reduce_scatter: {'send' if sendbuf is not None else 'receive'} "
                         f"buffer has {data.size} elements, recvcounts sum to {n * cnt}")
    if cnt == 0:
        return None
    out = _Out(recvbuf)
    acc = _typed(out.work, dtype)[:cnt]
    src = data[:n * cnt]
    if sendbuf is None or np.shares_memory(src, acc):
        src = src.copy()
    return out, acc, src


def reduce_scatter_sched_slices(t: Transport, sendbuf: Optional[np.ndarray],
                                recvbuf: np.ndarray, recvcounts: Sequence[int],
                                reduce_fn: ReduceFn,
                                commutative: bool = True) -> Optional[bool]:
    """Three or more ranks of one host, equal blocks, one engine call
    (``erdma_coll_reduce_scatter_slices``): each rank reduces its block of
    every input straight out of the other ranks' buffers (CMA) in rank
    order.  Unequal blocks, ops or types the C reducer lacks, or no CMA:
    :func:`reduce_scatter_sched_ring` (on every rank alike).
    ``sendbuf=None``: in place, as there."""
    n = t.size
    cnts = [int(c) for c in recvcounts]
    red = sched_reduction(reduce_fn)
    b = _bulk(t) if n >= 3 and len(cnts) == n and len(set(cnts)) == 1 else None
    if b is None or red is None or not commutative or recvbuf.nbytes % red[1].itemsize:
        return reduce_scatter_sched_ring(t, sendbuf, recvbuf, recvcounts, reduce_fn,
                                         commutative)
    opname, dtype = red
    ops = _block_operands(sendbuf, recvbuf, n, cnts[0], dtype)
    if ops is None:
        return True
    out, acc, src = ops
    if not b.reduce_scatter_slices(src, acc, opname, t.rank):
        return reduce_scatter_sched_ring(t, sendbuf, recvbuf, recvcounts, reduce_fn,
                                         commutative)
    out.done()
    return True


def reduce_scatter_sched_ring(t: Transport, sendbuf: Optional[np.ndarray],
                              recvbuf: np.ndarray, recvcounts: Sequence[int],
                              reduce_fn: ReduceFn,
                              commutative: bool = True) -> Optional[bool]:
    """Ring reduce-scatter (n-1 steps; rank r ends with block r), chunk-
    pipelined in C: each step receives the left neighbour's partial block
    into a scratch block, reduces this rank's input into it and forwards it.
    ``sendbuf=None``: the input is ``recvbuf[:sum(recvcounts)]`` and the
    result goes to its first ``recvcounts[r]`` elements."""
    n, r = t.size, t.rank
    red = sched_reduction(reduce_fn)
    if red is None or not commutative or not _can_schedule(t, n):
        return False
    opname, dtype = red
    if recvbuf.nbytes % dtype.itemsize:
        return False
    out = _Out(recvbuf)
    rv = _typed(out.work, dtype)
    data = rv if sendbuf is None else _typed(_contig(sendbuf), dtype)
    cnts, disps = check_counts("reduce_scatter", n, recvcounts, None, data.size)
    total = sum(cnts)
    if sendbuf is not None and total != data.size:
        raise ValueError(f"reduce_scatter: send buffer has {data.size} elements, "
                         f"recvcounts sum to {total}")
    x = data[:total] if sendbuf is not None else data[:total].view()

    def blk(arr, i):
        return arr[disps[i]:disps[i] + cnts[i]]

    if n == 1:
        if sendbuf is not None and cnts[0]:
            rv[:cnts[0]] = x[:cnts[0]]
        out.done()
        return True
    b = t.schedule()
    m = max(cnts)
    tmp = [np.empty(m, dtype), np.empty(m, dtype)]
    right, left = (r + 1) % n, (r - 1) % n
    reds, sends = [], []
    for k in range(n - 1):
        s, q = (r - k - 1) % n, (r - k - 2) % n
        si = b.send(blk(x, s) if k == 0 else tmp[(k - 1) % 2][:cnts[s]], right, k)
        if k:
            b.after(si, reds[k - 1])
        last = k == n - 2                        # then q == r
        direct = last and sendbuf is not None
        dst = rv[:cnts[r]] if direct else tmp[k % 2][:cnts[q]]
        ri = b.recv(dst, left, k)
        if not direct and k >= 1:
            b.after(ri, sends[k - 1])            # scratch block reuse
        ei = b.reduce(blk(x, q), dst, opname)
        b.after(ei, ri)
        reds.append(ei)
        sends.append(si)
    if sendbuf is None and cnts[r]:
        b.barrier()                              # the input overlaps the result
        b.copy(tmp[(n - 2) % 2][:cnts[r]], rv[:cnts[r]])
    b.run()
    out.done()
    return True


# -- allgatherv ----------------------------------------------------------------

def allgatherv_sched_ring(t: Transport, sendbuf: Optional[np.ndarray],
                          recvbuf: np.ndarray, counts: Sequence[int],
                          displs: Optional[Sequence[int]]) -> Optional[bool]:
    """Ring allgather (n-1 steps), each received block forwarded chunk by
    chunk as it arrives.  Up to :data:`BULK_PULL_MAX_RANKS` ranks with the
    bulk engine calls, every rank reads each block straight out of its
    owner's buffer instead (one CMA read per block on one host, in one
    engine call).  ``sendbuf=None``: own block already in place."""
    n, r = t.size, t.rank
    if not _can_schedule(t, n):
        return False
    out = _Out(recvbuf)
    rv = out.work.reshape(-1)
    cnts, disps = check_counts("allgatherv", n, counts, displs, rv.size)
    mine = rv[disps[r]:disps[r] + cnts[r]]
    src = mine if sendbuf is None else _contig(sendbuf).reshape(-1)[:cnts[r]]
    if src.size != cnts[r]:
        raise ValueError(f"allgatherv: send buffer has {src.size} elements, "
                         f"counts[{r}] is {cnts[r]}")
    bulk = _bulk(t) if n <= BULK_PULL_MAX_RANKS else None
    if bulk is not None and (sendbuf is None or src.dtype == rv.dtype):
        # every rank reads each block straight out of its owner's buffer
        isz = rv.itemsize
        bulk.allgather_bulk(None if sendbuf is None else src, rv,
                            [d * isz for d in disps], [c * isz for c in cnts], r)
        out.done()
        return True
    b = t.schedule()
    if sendbuf is not None and cnts[r]:
        b.copy(src, mine)
    right, left = (r + 1) % n, (r - 1) % n
    prev = None
    for k in range(n - 1):
        s, q = (r - k) % n, (r - k - 1) % n
        si = b.send(src if k == 0 else rv[disps[s]:disps[s] + cnts[s]], right, k)
        if prev is not None:
            b.after(si, prev)
        prev = b.recv(rv[disps[q]:disps[q] + cnts[q]], left, k)
    b.run()
    out.done()
    return True


# -- bcast ---------------------------------------------------------------------

#: ranks up to which :func:`bcast_sched_chain` lets every rank read the root's
#: buffer itself (one engine call, :func:`bcast_sched_pull`) instead of a chain
BULK_PULL_MAX_RANKS = 8


def bcast_sched_pull(t: Transport, buf: np.ndarray, root: int) -> Optional[bool]:
    """Every rank reads the whole buffer straight out of the root's (CMA on
    one host, which takes no CPU time of the root), in one engine call
    (``erdma_coll_bcast_bulk``); a rank the root cannot share memory with
    gets it as a message from the root."""
    root = check_root("bcast", root, t.size)
    b = _bulk(t)
    if b is None:
        return False
    if t.size == 1 or buf.nbytes == 0:
        return True
    out = _Out(buf)
    b.bcast_bulk(out.work, root, t.rank)
    out.done()
    return True


def bcast_sched_chain(t: Transport, buf: np.ndarray, root: int) -> Optional[bool]:
    """Pipelined chain root -> root+1 -> ...: every rank forwards each chunk
    as soon as it has arrived (time ~ N/B + (n-2) chunks).  Up to
    :data:`BULK_PULL_MAX_RANKS` ranks with the bulk engine calls, every rank
    reads the root's buffer itself instead (:func:`bcast_sched_pull`): no
    chain of dependencies, and a rank that is not running holds up nobody."""
    n, r = t.size, t.rank
    root = check_root("bcast", root, n)
    if not _can_schedule(t, 1):
        return False
    if n == 1 or buf.nbytes == 0:
        return True
    if n <= BULK_PULL_MAX_RANKS and bcast_sched_pull(t, buf, root):
        return True
    out = _Out(buf)
    data = out.work.reshape(-1)
    vr = (r - root) % n
    b = t.schedule()
    ri = b.recv(data, (r - 1) % n, 0) if vr > 0 else None
    if vr < n - 1:
        si = b.send(data, (r + 1) % n, 0)
        if ri is not None:
            b.after(si, ri)
    b.run()
    out.done()
    return True


def _bulk(t: Transport):
    """The transport's builder if it has the one-call bulk collectives, else None."""
    if not _can_schedule(t):
        return None
    b = t.schedule(chunked=False)
    return b if hasattr(b, "bcast_pair") else None


def bcast_sched_pair(t: Transport, buf: np.ndarray, root: int) -> Optional[bool]:
    """Two ranks: both copy at once.  On one host the root writes the first
    half into the other rank's buffer (CMA) while that rank reads the second
    half, so both cores copy; otherwise the buffer goes as one message.  One
    engine call (``erdma_coll_bcast_pair``); more than two ranks: ``False``."""
    n = t.size
    root = check_root("bcast", root, n)
    b = _bulk(t) if n == 2 else None
    if b is None:
        return False
    if buf.nbytes == 0:
        return True
    out = _Out(buf)
    b.bcast_pair(out.work, root, t.rank)
    out.done()
    return True


def alltoall_sched(t: Transport, sendbuf: Optional[np.ndarray],
                        recvbuf: np.ndarray) -> Optional[bool]:
    """All-to-all of equal blocks in one engine call
    (``erdma_coll_alltoall_bulk``): every rank copies its own block and
    reads each peer's block for it straight out of the peer's send buffer
    (CMA), so each process copies exactly what it receives and no core
    waits for another; peers without CMA exchange messages instead.  Every
    rank must choose it alike (it is selected only for :func:`alltoall`,
    whose block size all ranks know).  ``sendbuf=None``: in place (through
    a copy of ``recvbuf``)."""
    n, r = t.size, t.rank
    b = _bulk(t)
    if b is None:
        return False
    rv = _Out(recvbuf)
    blk = recvbuf.size // n
    work = rv.work.reshape(-1)
    if sendbuf is None:
        src = work[:blk * n].copy()
    else:
        src = _contig(sendbuf).reshape(-1)
        if src.size != blk * n:
            raise ValueError(f"alltoall: send buffer has {src.size} elements, "
                             f"expected {blk * n}")
        if np.shares_memory(src, work):
            src = src.copy()
    if blk and src.dtype != work.dtype:
        raise ValueError("alltoall: send and receive element types differ")
    b.alltoall_bulk(src.view(np.uint8), work[:blk * n].view(np.uint8), r)
    rv.done()
    return True


# -- alltoallv -----------------------------------------------------------------

def alltoallv_sched(t: Transport, sendbuf: Optional[np.ndarray],
                    scounts: Optional[Sequence[int]], sdispls: Optional[Sequence[int]],
                    recvbuf: np.ndarray, rcounts: Sequence[int],
                    rdispls: Optional[Sequence[int]]) -> Optional[bool]:
    """Pairwise exchange run in C: step k sends to r+k and receives from
    r-k, at most two steps in flight.  Whole blocks with the pairwise tags,
    so it interoperates with the Python all-to-all algorithms (ranks may
    choose differently).  In place: not handled (returns ``False``)."""
    n, r = t.size, t.rank
    if sendbuf is None or not _can_schedule(t, n):
        return False
    out = _Out(recvbuf)
    rv = out.work.reshape(-1)
    sv = _contig(sendbuf).reshape(-1)
    scnt, sdsp = check_counts("alltoallv", n, scounts, sdispls, sv.size)
    rcnt, rdsp = check_counts("alltoallv", n, rcounts, rdispls, rv.size)
    if scnt[r] != rcnt[r]:
        return False                             # the Python path reports it
    b = t.schedule(chunked=False)
    if rcnt[r]:
        b.copy(sv[sdsp[r]:sdsp[r] + scnt[r]], rv[rdsp[r]:rdsp[r] + rcnt[r]])
    sends, recvs = [], []
    for k in range(1, n):
        dst, src = (r + k) % n, (r - k) % n
        ri = b.recv(rv[rdsp[src]:rdsp[src] + rcnt[src]], src, k % (MAX_TAG + 1))
        si = b.send(sv[sdsp[dst]:sdsp[dst] + scnt[dst]], dst, k % (MAX_TAG + 1))
        if k >= 3:
            b.after(ri, recvs[k - 3], False)
            b.after(si, sends[k - 3], False)
        recvs.append(ri)
        sends.append(si)
    b.run()
    out.done()
    return True
