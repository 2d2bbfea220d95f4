"""Collectives on pickled Python objects (mpi4py's lowercase API).

The data movement mirrors mpi4py so results match it exactly:

* bcast / gather / scatter / allgather / alltoall pickle each object, move
  the sizes with the buffer collective, then the bytes with its ``v`` form;
  every receiver (the root included) gets a fresh unpickled copy.  Over a
  transport whose receives take messages of any length (the comm layer's)
  each pickle is one message instead, with no round for the sizes.
* reduce is a binomial tree rooted at rank 0 combining ``op(lower, upper)``
  in rank order, then forwarded to the root; non-roots get ``None``.
  allreduce is that reduce followed by a bcast.  scan / exscan are recursive
  doubling; exscan gives ``None`` on rank 0.

``dumps``/``loads`` default to :mod:`pickle` with the highest protocol; the
comm layer may pass its own (``MPI.pickle``).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from erdmampi.collectives.alltoall import alltoallv_direct, alltoallv_pairwise
from erdmampi.collectives.base import (PyOp, Transport, check_root, dumps_default,
                                       loads_default)
from erdmampi.collectives.bcast import bcast_binomial, bcast_scatter_allgather
from erdmampi.collectives.gather import (allgatherv_direct, allgatherv_ring,
                                         gatherv_linear, scatterv_linear)

__all__ = ["bcast_obj", "gather_obj", "scatter_obj", "allgather_obj",
           "alltoall_obj", "reduce_obj", "allreduce_obj", "scan_obj",
           "exscan_obj"]

_LARGE = 512 * 1024
Dumps = Optional[Callable[[Any], bytes]]
Loads = Optional[Callable[[Any], Any]]


def _pk(dumps: Dumps, loads: Loads):
    return dumps or dumps_default, loads or loads_default


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def _load(loads, buf: np.ndarray):
    if buf.size == 0:
        return None
    return loads(memoryview(buf))


def _offsets(counts):
    displs, off = [], 0
    for c in counts:
        displs.append(off)
        off += c
    return displs, off


def _dumpv(t: Transport, objs, dumps) -> list[bytes]:
    n = t.size
    items = [None] * n if objs is None else list(objs)
    if len(items) != n:
        raise ValueError(f"expecting {n} items, got {len(items)}")
    return [dumps(x) for x in items]


# -- one message per object ------------------------------------------------
#
# A transport that moves messages of any length (``isend_bytes`` /
# ``recv_bytes``: the comm layer's, whose receiver learns the length from the
# message) needs no round for the sizes: each pickle is one message, tag 0.

def _has_bytes(t: Transport) -> bool:
    return hasattr(t, "isend_bytes")


def _finish(t: Transport, reqs: list) -> None:
    t.waitall([q for q in reqs if q is not None])


def _bcast_bytes(t, obj, root, dumps, loads):
    """Binomial tree of whole pickles."""
    n, r = t.size, t.rank
    vr = (r - root) % n
    data = dumps(obj) if r == root else None
    mask = 1
    while mask < n:
        if vr & mask:
            data = t.recv_bytes((vr - mask + root) % n, 0)
            break
        mask <<= 1
    reqs = []
    mask >>= 1
    while mask > 0:
        if vr + mask < n:
            reqs.append(t.isend_bytes(data, (vr + mask + root) % n, 0))
        mask >>= 1
    _finish(t, reqs)
    return loads(data)


def _gather_bytes(t, obj, root, dumps, loads):
    n, r = t.size, t.rank
    data = dumps(obj)
    if r != root:
        _finish(t, [t.isend_bytes(data, root, 0)])
        return None
    return [loads(data) if i == root else loads(t.recv_bytes(i, 0)) for i in range(n)]


def _scatter_bytes(t, objs, root, dumps, loads):
    n, r = t.size, t.rank
    if r != root:
        return loads(t.recv_bytes(root, 0))
    items = _dumpv(t, objs, dumps)
    _finish(t, [t.isend_bytes(items[i], i, 0) for i in range(n) if i != root])
    return loads(items[root])


def _exchange_bytes(t, items, loads):
    """items[j] to rank j (items[r] stays); every rank's item for this one, by rank."""
    n, r = t.size, t.rank
    reqs = [t.isend_bytes(items[(r + k) % n], (r + k) % n, 0) for k in range(1, n)]
    out = [loads(items[r]) if i == r else loads(t.recv_bytes(i, 0)) for i in range(n)]
    _finish(t, reqs)
    return out


def bcast_obj(t: Transport, obj: Any, root: int,
              dumps: Dumps = None, loads: Loads = None) -> Any:
    """Broadcast ``obj`` from ``root``; every rank returns an unpickled copy."""
    dumps, loads = _pk(dumps, loads)
    root = check_root("bcast", root, t.size)
    if _has_bytes(t):
        return _bcast_bytes(t, obj, root, dumps, loads)
    size = np.zeros(1, dtype=np.int64)
    data = None
    if t.rank == root:
        data = _u8(dumps(obj))
        size[0] = data.size
    bcast_binomial(t, size, root)
    if t.rank != root:
        data = np.empty(int(size[0]), dtype=np.uint8)
    (bcast_scatter_allgather if data.nbytes > _LARGE else bcast_binomial)(t, data, root)
    return _load(loads, data)


def gather_obj(t: Transport, obj: Any, root: int,
               dumps: Dumps = None, loads: Loads = None) -> Optional[list]:
    """Gather one object per rank at ``root`` (a list); others get ``None``."""
    dumps, loads = _pk(dumps, loads)
    n, r = t.size, t.rank
    root = check_root("gather", root, n)
    if _has_bytes(t):
        return _gather_bytes(t, obj, root, dumps, loads)
    data = _u8(dumps(obj))
    mine = np.array([data.size], dtype=np.int64)
    sizes = np.zeros(n, dtype=np.int64) if r == root else None
    gatherv_linear(t, mine, sizes, [1] * n, list(range(n)), root)
    if r != root:
        gatherv_linear(t, data, None, None, None, root)
        return None
    counts = [int(c) for c in sizes]
    displs, total = _offsets(counts)
    buf = np.empty(total, dtype=np.uint8)
    gatherv_linear(t, data, buf, counts, displs, root)
    return [_load(loads, buf[d:d + c]) for c, d in zip(counts, displs)]


def scatter_obj(t: Transport, objs: Optional[Sequence], root: int,
                dumps: Dumps = None, loads: Loads = None) -> Any:
    """Scatter ``objs`` (``size`` items, significant at ``root``; ``None``
    means ``[None] * size``); each rank returns its item."""
    dumps, loads = _pk(dumps, loads)
    n, r = t.size, t.rank
    root = check_root("scatter", root, n)
    if _has_bytes(t):
        return _scatter_bytes(t, objs, root, dumps, loads)
    sizes = buf = counts = displs = None
    if r == root:
        items = _dumpv(t, objs, dumps)
        counts = [len(x) for x in items]
        displs, _ = _offsets(counts)
        sizes = np.array(counts, dtype=np.int64)
        buf = _u8(b"".join(items))
    mine = np.zeros(1, dtype=np.int64)
    scatterv_linear(t, sizes, [1] * n, list(range(n)), mine, root)
    out = np.empty(int(mine[0]), dtype=np.uint8)
    scatterv_linear(t, buf, counts, displs, out, root)
    return _load(loads, out)


def allgather_obj(t: Transport, obj: Any,
                  dumps: Dumps = None, loads: Loads = None) -> list:
    """Every rank returns the list of all ranks' objects."""
    dumps, loads = _pk(dumps, loads)
    n = t.size
    if _has_bytes(t):
        data = dumps(obj)
        return _exchange_bytes(t, [data] * n, loads)
    data = _u8(dumps(obj))
    sizes = np.zeros(n, dtype=np.int64)
    allgatherv_direct(t, np.array([data.size], dtype=np.int64), sizes,
                      [1] * n, list(range(n)))
    counts = [int(c) for c in sizes]
    displs, total = _offsets(counts)
    buf = np.empty(total, dtype=np.uint8)
    algo = allgatherv_ring if total > _LARGE else allgatherv_direct
    algo(t, data, buf, counts, displs)
    return [_load(loads, buf[d:d + c]) for c, d in zip(counts, displs)]


def alltoall_obj(t: Transport, objs: Optional[Sequence],
                 dumps: Dumps = None, loads: Loads = None) -> list:
    """Rank i sends ``objs[j]`` to rank j; returns the list received."""
    dumps, loads = _pk(dumps, loads)
    n = t.size
    items = _dumpv(t, objs, dumps)
    if _has_bytes(t):
        return _exchange_bytes(t, items, loads)
    scounts = [len(x) for x in items]
    sdispls, _ = _offsets(scounts)
    sbuf = _u8(b"".join(items))
    rsizes = np.zeros(n, dtype=np.int64)
    one, idx = [1] * n, list(range(n))
    alltoallv_direct(t, np.array(scounts, dtype=np.int64), one, idx, rsizes, one, idx)
    rcounts = [int(c) for c in rsizes]
    rdispls, total = _offsets(rcounts)
    rbuf = np.empty(total, dtype=np.uint8)
    algo = alltoallv_pairwise if max(total, sbuf.size) > _LARGE else alltoallv_direct
    algo(t, sbuf, scounts, sdispls, rbuf, rcounts, rdispls)
    return [_load(loads, rbuf[d:d + c]) for c, d in zip(rcounts, rdispls)]


def _copy(obj, dumps, loads):
    return loads(dumps(obj))


def _reduce_to_root(t: Transport, obj: Any, py_op: PyOp, root: int, dumps, loads) -> Any:
    n, r = t.size, t.rank
    result = _copy(obj, dumps, loads)
    mask = 1
    while mask < n:
        if r & mask:
            t.send_obj(result, r & ~mask, 0)
            break
        child = r | mask
        if child < n:
            result = py_op(result, t.recv_obj(child, 0))
        mask <<= 1
    if root != 0:
        if r == 0:
            t.send_obj(result, root, 1)
        elif r == root:
            result = t.recv_obj(0, 1)
    return result if r == root else None


def reduce_obj(t: Transport, obj: Any, py_op: PyOp, root: int,
               dumps: Dumps = None, loads: Loads = None) -> Any:
    """``x0 op x1 op ... op x_{n-1}`` (rank order) at ``root``; others get
    ``None``."""
    dumps, loads = _pk(dumps, loads)
    root = check_root("reduce", root, t.size)
    return _reduce_to_root(t, obj, py_op, root, dumps, loads)


def allreduce_obj(t: Transport, obj: Any, py_op: PyOp,
                  dumps: Dumps = None, loads: Loads = None) -> Any:
    """Reduce to rank 0, then broadcast: every rank returns the result."""
    dumps, loads = _pk(dumps, loads)
    result = _reduce_to_root(t, obj, py_op, 0, dumps, loads)
    return bcast_obj(t, result, 0, dumps, loads)


def _sendrecv(t: Transport, obj: Any, peer: int, tag: int) -> Any:
    # both ends agree on the order (lower rank sends first): no deadlock even
    # if send_obj blocks until matched
    if t.rank < peer:
        t.send_obj(obj, peer, tag)
        return t.recv_obj(peer, tag)
    got = t.recv_obj(peer, tag)
    t.send_obj(obj, peer, tag)
    return got


def scan_obj(t: Transport, obj: Any, py_op: PyOp,
             dumps: Dumps = None, loads: Loads = None) -> Any:
    """Inclusive prefix ``x0 op ... op x_r`` on rank r."""
    dumps, loads = _pk(dumps, loads)
    n, r = t.size, t.rank
    result = partial = _copy(obj, dumps, loads)
    mask, step = 1, 0
    while mask < n:
        dst = r ^ mask
        if dst < n:
            got = _sendrecv(t, partial, dst, step)
            if r > dst:
                partial = py_op(got, partial)
                result = py_op(got, result)
            else:
                partial = py_op(partial, got)
        mask <<= 1
        step += 1
    return result


def exscan_obj(t: Transport, obj: Any, py_op: PyOp,
               dumps: Dumps = None, loads: Loads = None) -> Any:
    """Exclusive prefix ``x0 op ... op x_{r-1}`` on rank r; ``None`` on 0."""
    dumps, loads = _pk(dumps, loads)
    n, r = t.size, t.rank
    result = partial = _copy(obj, dumps, loads)
    have = False
    mask, step = 1, 0
    while mask < n:
        dst = r ^ mask
        if dst < n:
            got = _sendrecv(t, partial, dst, step)
            if r > dst:
                partial = py_op(got, partial)
                if have:
                    result = py_op(got, result)
                else:
                    result, have = got, True
            else:
                partial = py_op(partial, got)
        mask <<= 1
        step += 1
    return None if r == 0 else result
