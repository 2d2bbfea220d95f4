"""Schedule builder of one collective call (the comm side of
:mod:`erdmampi.collectives.sched`).

:class:`CollSchedule` turns the array-level steps of a schedule algorithm
into an :class:`erdmampi._engine.Schedule`: arrays become addresses (kept
alive until the schedule is done), communicator ranks become world ranks and
algorithm tags become the call's engine tags on the collective context id.

``ERDMA_SCHED_CHUNK`` (bytes, default 512 KiB; the same on every rank) sets
the pipelining chunk.
"""

import os
import threading

from . import _engine
from .request import engine_exception

__all__ = ["CollSchedule", "notify_started", "icoll_state"]

#: chunk size for non-chunked schedules (whole messages)
_WHOLE = 1 << 62


def _chunk_from_env():
    try:
        return max(int(os.environ.get("ERDMA_SCHED_CHUNK", "0")), 0)
    except ValueError:
        return 0


_CHUNK = _chunk_from_env()

#: per-thread state of a nonblocking collective being started (see comm._icoll)
icoll_state = threading.local()


def notify_started():
    """Tell the caller of a nonblocking collective that the algorithm running
    in its thread has posted its first message or started its schedule."""
    ev = getattr(icoll_state, "started", None)
    if ev is not None:
        icoll_state.started = None
        ev.set()


class CollSchedule:
    """Builder with the interface described in :mod:`erdmampi.collectives.sched`."""

    __slots__ = ("_s", "_ranks", "_ctx", "_base")

    def __init__(self, engine, ranks, ctx, base, chunked=True):
        try:
            self._s = _engine.Schedule(engine, _CHUNK if chunked else _WHOLE)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        self._ranks = ranks
        self._ctx = ctx
        self._base = base

    def send(self, arr, dest, tag):
        self._s.keep(arr)
        return self._s.send(arr.ctypes.data, arr.nbytes, self._ranks[dest],
                            self._base + tag, self._ctx)

    def recv(self, arr, source, tag):
        self._s.keep(arr)
        return self._s.recv(arr.ctypes.data, arr.nbytes, self._ranks[source],
                            self._base + tag, self._ctx)

    def reduce(self, inarr, inoutarr, op):
        if inarr.nbytes != inoutarr.nbytes:
            raise ValueError("schedule reduce: operands differ in size")
        self._s.keep(inarr)
        self._s.keep(inoutarr)
        return self._s.reduce(inarr.ctypes.data, inoutarr.ctypes.data, inoutarr.size,
                              _engine.SCHED_OPS[op],
                              _engine.SCHED_DTYPES[inoutarr.dtype.name])

    def copy(self, src, dst):
        if src.nbytes != dst.nbytes:
            raise ValueError("schedule copy: operands differ in size")
        self._s.keep(src)
        self._s.keep(dst)
        return self._s.copy(src.ctypes.data, dst.ctypes.data, dst.nbytes)

    def after(self, step, on, chunkwise=True):
        self._s.after(step, on, chunkwise)

    def barrier(self):
        self._s.barrier()

    def run(self):
        """Start the schedule in a C worker and wait for it (GIL released)."""
        s = self._s
        try:
            s.start()
            notify_started()
            s.wait()
        except _engine.EngineError as e:
            raise engine_exception(e) from None
