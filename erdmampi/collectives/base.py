"""The small point-to-point interface that every collective algorithm runs on.

Algorithms in :mod:`erdmampi.collectives` are free functions ``algo(t, ...)``
whose first argument is a :class:`Transport`.  They never see sockets, the
engine or communicators (Gloo's ``Algorithm`` over ``Pair`` pattern): the comm
layer builds one Transport per collective call over the collective context id
of the communicator, and ``tests/threadranks.py`` builds one over in-process
queues.

Tags used by an algorithm only need to be unique within one call, because
collective calls on one communicator are made in the same order by all ranks
and messages between a pair of ranks with the same tag are matched in order
(MPI's non-overtaking rule).  Algorithms use tags in ``0 .. MAX_TAG``.

Reductions are callbacks ``reduce_fn(inarr, inoutarr)`` computing
``inoutarr[:] = inarr OP inoutarr`` in place (like an ``MPI_User_function``:
the *first* argument is the left operand).  Python-object reductions use
``py_op(x, y) -> x OP y``.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = [
    "Transport", "Req", "ReduceFn", "PyOp", "MAX_TAG",
    "check_counts", "block", "even_blocks", "dumps_default", "loads_default",
]

#: Largest tag an algorithm may use.
MAX_TAG = 1023

#: An opaque request returned by :meth:`Transport.isend` / :meth:`Transport.irecv`.
Req = Any

#: ``reduce_fn(inarr, inoutarr)``: ``inoutarr[:] = inarr OP inoutarr``.
ReduceFn = Callable[[np.ndarray, np.ndarray], None]

#: ``py_op(x, y) -> x OP y`` for Python objects.
PyOp = Callable[[Any, Any], Any]


@runtime_checkable
class Transport(Protocol):
    """Point-to-point messaging among the ``size`` ranks of one collective call.

    Ranks are ranks of the communicator (0 .. size-1), not world ranks.
    Messages between one (source, dest) pair with the same tag are matched in
    the order they were sent and in the order the receives were posted.
    """

    #: this process's rank in the communicator
    rank: int
    #: number of ranks in the communicator
    size: int

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> Req:
        """Start sending the raw bytes of ``buf`` (C-contiguous, any dtype) to
        ``dest``.  ``buf`` must not be modified until the request completes.
        Never blocks waiting for the receiver."""
        ...

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> Req:
        """Start receiving one message from ``source`` into ``buf`` (writable,
        C-contiguous); the message has exactly ``buf.nbytes`` bytes."""
        ...

    def irecv_upto(self, buf: np.ndarray, source: int, tag: int) -> Req:
        """Like :meth:`irecv`, but the message may be shorter than ``buf``
        (compressed chunks: their encoding records its own length).  Only
        :mod:`erdmampi.collectives.compressed` uses it."""
        ...

    def send_obj(self, obj: Any, dest: int, tag: int) -> None:
        """Send a pickled Python object; may block until it is matched."""
        ...

    def recv_obj(self, source: int, tag: int) -> Any:
        """Receive and unpickle one object sent with :meth:`send_obj`."""
        ...

    def waitall(self, reqs: list) -> None:
        """Block until every request in ``reqs`` has completed."""
        ...


def dumps_default(obj: Any) -> bytes:
    """Pickle with the highest protocol (what mpi4py's ``MPI.pickle`` uses)."""
    return pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)


def loads_default(data) -> Any:
    """Inverse of :func:`dumps_default`; accepts any bytes-like object."""
    return pickle.loads(data)


def check_counts(name: str, size: int, counts: Optional[Sequence[int]],
                 displs: Optional[Sequence[int]] = None,
                 buflen: Optional[int] = None) -> tuple[list[int], list[int]]:
    """Validate per-rank ``counts``/``displs`` (in elements) and return them as
    lists of ints; ``displs=None`` means packed (exclusive prefix sums).
    Raises ``ValueError`` on wrong lengths, negative values, or blocks that do
    not fit in a buffer of ``buflen`` elements."""
    if counts is None:
        raise ValueError(f"{name}: counts are required")
    counts = [int(c) for c in counts]
    if len(counts) != size:
        raise ValueError(f"{name}: expected {size} counts, got {len(counts)}")
    if any(c < 0 for c in counts):
        raise ValueError(f"{name}: negative count in {counts}")
    if displs is None:
        displs, off = [], 0
        for c in counts:
            displs.append(off)
            off += c
    else:
        displs = [int(d) for d in displs]
        if len(displs) != size:
            raise ValueError(f"{name}: expected {size} displacements, got {len(displs)}")
        if any(d < 0 for d in displs):
            raise ValueError(f"{name}: negative displacement in {displs}")
    if buflen is not None:
        for c, d in zip(counts, displs):
            if c and d + c > buflen:
                raise ValueError(f"{name}: block [{d}, {d + c}) does not fit "
                                 f"in a buffer of {buflen} elements")
    return counts, displs


def block(buf: np.ndarray, displ: int, count: int) -> np.ndarray:
    """The contiguous slice ``buf[displ:displ+count]`` (a view)."""
    return buf[displ:displ + count]


def even_blocks(count: int, nblocks: int) -> tuple[list[int], list[int]]:
    """Split ``count`` elements into ``nblocks`` nearly equal blocks; returns
    (counts, displs).  The first ``count % nblocks`` blocks get one more."""
    q, r = divmod(count, nblocks)
    counts = [q + (1 if i < r else 0) for i in range(nblocks)]
    displs, off = [], 0
    for c in counts:
        displs.append(off)
        off += c
    return counts, displs


def check_root(name: str, root: int, size: int) -> int:
    """Return ``root`` as int or raise ``ValueError`` if out of range."""
    root = int(root)
    if not 0 <= root < size:
        raise ValueError(f"{name}: root {root} out of range for size {size}")
    return root


def as_bytes(buf: np.ndarray) -> np.ndarray:
    """A uint8 view of a C-contiguous array (for byte-wise splitting)."""
    return buf.reshape(-1).view(np.uint8)
