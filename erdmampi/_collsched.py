"""Schedule builder of one collective call (the comm side of
:mod:`erdmampi.collectives.sched`).

:class:`CollSchedule` turns the array-level steps of a schedule algorithm
into an :class:`erdmampi._engine.Schedule`: arrays become addresses (kept
alive until the schedule is done), communicator ranks become world ranks and
algorithm tags become the call's engine tags on the collective context id.

``ERDMA_SCHED_CHUNK`` (bytes, default 512 KiB; the same on every rank) sets
the pipelining chunk.
"""

import threading

from . import _engine
from .request import engine_exception

__all__ = ["CollSchedule", "notify_started", "icoll_state", "icoll_enter", "icoll_exit",
           "BULK_ROOT_PART", "BULK_TAGS"]

#: chunk size for non-chunked schedules (whole messages)
_WHOLE = 1 << 62


def _chunk_from_env():
    from . import config
    return config.get("ERDMA_SCHED_CHUNK")


_CHUNK = _chunk_from_env()

#: tags a bulk collective uses from its base (ERDMA_BULK_TAGS)
BULK_TAGS = _engine.lib.ERDMA_BULK_TAGS


def _part_from_env(name):
    from . import config
    part = config.get(name)
    return -1.0 if part is None else part


#: two-rank bulk Bcast: the root's fixed share (``ERDMA_BULK_ROOT_PART``, the
#: root's value counts); -1: both copy until they meet (the default)
BULK_ROOT_PART = _part_from_env("ERDMA_BULK_ROOT_PART")
#: two-rank bulk Alltoall: fixed share of its block for the peer a rank pushes
#: (``ERDMA_BULK_PULL_PART``, per rank); -1: dynamic (the default)
BULK_PULL_PART = _part_from_env("ERDMA_BULK_PULL_PART")

#: per-thread state of a nonblocking collective being started (see comm._icoll)
icoll_state = threading.local()
_icoll_running = 0            # threads between icoll_enter and icoll_exit
_icoll_lock = threading.Lock()


def icoll_enter(started):
    """This thread runs a nonblocking collective's algorithm: ``started``
    (an Event) is set at its first message (notify_started)."""
    global _icoll_running
    with _icoll_lock:
        _icoll_running += 1
    icoll_state.started = started


def icoll_exit():
    global _icoll_running
    icoll_state.started = None
    with _icoll_lock:
        _icoll_running -= 1


def notify_started():
    """Tell the caller of a nonblocking collective that the algorithm running
    in its thread has posted its first message or started its schedule."""
    if not _icoll_running:      # no thread-local lookup in a blocking call
        return
    ev = getattr(icoll_state, "started", None)
    if ev is not None:
        icoll_state.started = None
        ev.set()


_CRANKS = {}


def _cranks(ranks):
    """``int[]`` of a communicator's world ranks, made once per rank list."""
    key = tuple(ranks)
    arr = _CRANKS.get(key)
    if arr is None:
        if len(_CRANKS) > 64:
            _CRANKS.clear()
        arr = _CRANKS[key] = _engine.ranks_array(key)
    return arr


class CollSchedule:
    """Builder with the interface described in :mod:`erdmampi.collectives.sched`."""

    __slots__ = ("_sched", "_eng", "_chunk", "_ranks", "_ctx", "_base")

    def __init__(self, engine, ranks, ctx, base, chunked=True):
        self._sched = None          # the engine schedule, made by the first step
        self._eng = engine
        self._chunk = _CHUNK if chunked else _WHOLE
        self._ranks = ranks
        self._ctx = ctx
        self._base = base

    @property
    def _s(self):
        s = self._sched
        if s is None:
            try:
                s = self._sched = _engine.Schedule(self._eng, self._chunk)
            except _engine.EngineError as e:
                raise engine_exception(e) from None
        return s

    # -- one-call bulk collectives among ranks of one host (not schedules) --

    def bcast_pair(self, arr, root, me, root_part=None):
        """Two ranks: ``arr`` of ``root`` into ``arr`` of the other, the root
        writing pieces from the front with CMA while the other reads pieces
        from the back until they meet (``root_part`` in [0, 1]: a fixed
        share instead); erdma_coll_bcast_pair, messages where CMA is not
        possible."""
        notify_started()
        self._bulk(_engine.lib.erdma_coll_bcast_pair(
            self._eng._h, _engine.ffi.cast("void *", arr.ctypes.data), arr.nbytes, root,
            _cranks(self._ranks), len(self._ranks), me,
            BULK_ROOT_PART if root_part is None else root_part,
            self._base, self._ctx, -1.0), "bcast")

    def bcast_bulk(self, arr, root, me):
        """Every rank reads ``arr`` straight out of the root's
        (erdma_coll_bcast_bulk; messages where CMA is not possible)."""
        notify_started()
        self._bulk(_engine.lib.erdma_coll_bcast_bulk(
            self._eng._h, _engine.ffi.cast("void *", arr.ctypes.data), arr.nbytes, root,
            _cranks(self._ranks), len(self._ranks), me, self._base, self._ctx, -1.0), "bcast")

    def allgather_bulk(self, sarr, rarr, offs, lens, me):
        """Block j (``lens[j]`` bytes) to ``rarr`` at byte ``offs[j]`` on every
        rank, read out of rank j's ``sarr`` (None: in place in ``rarr``);
        erdma_coll_allgather_bulk."""
        ffi = _engine.ffi
        self._engine_call(_engine.coll_allgather_bulk,
                          None if sarr is None else sarr.ctypes.data, rarr.ctypes.data,
                          ffi.new("uint64_t[]", list(offs)), ffi.new("uint64_t[]", list(lens)),
                          me=me)

    def allreduce_pair(self, sarr, rarr, op, me):
        """Two ranks: ``rarr = in0 OP in1`` on both (erdma_coll_allreduce_pair);
        ``op`` an erdma op name, element type from ``rarr``; ``sarr`` None:
        in place."""
        self._pair(_engine.coll_allreduce_pair, sarr, rarr, op, me)

    def allreduce_slices(self, sarr, rarr, op, me):
        """Three or more ranks of one host: ``rarr`` = in0 OP in1 OP ... on
        all, rank k reducing slice k (erdma_coll_allreduce_slices); False,
        on every rank alike, where CMA cannot be used (nothing written)."""
        return self._slices(_engine.coll_allreduce_slices, sarr, rarr, op, me)

    def reduce_scatter_slices(self, sarr, rarr, op, me):
        """Three or more ranks of one host: ``rarr`` = block ``me`` of in0
        OP in1 OP ... (erdma_coll_reduce_scatter_slices); False, on every
        rank alike, where CMA cannot be used (the inputs intact)."""
        return self._slices(_engine.coll_reduce_scatter_slices, sarr, rarr, op, me)

    def _slices(self, fn, sarr, rarr, op, me):
        notify_started()
        try:
            return fn(self._eng, None if sarr is None else sarr.ctypes.data, rarr.ctypes.data,
                      rarr.size, _engine.SCHED_OPS[op], _engine.SCHED_DTYPES[rarr.dtype.name],
                      _cranks(self._ranks), len(self._ranks), me, self._base, self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    def reduce_scatter_pair(self, sarr, rarr, op, me):
        """Two ranks: ``rarr`` = block ``me`` of in0 OP in1
        (erdma_coll_reduce_scatter_pair); element type from ``rarr``."""
        self._pair(_engine.coll_reduce_scatter_pair, sarr, rarr, op, me)

    def _pair(self, fn, sarr, rarr, op, me):
        self._engine_call(fn, None if sarr is None else sarr.ctypes.data, rarr.ctypes.data,
                          rarr.size, _engine.SCHED_OPS[op],
                          _engine.SCHED_DTYPES[rarr.dtype.name], me=me)

    def alltoall_bulk(self, sarr, rarr, me):
        """Equal blocks: every rank reads its block out of each peer's
        ``sarr`` (erdma_coll_alltoall_bulk); ``sarr`` and ``rarr`` contiguous
        and distinct, ``rarr.nbytes`` a multiple of the rank count."""
        self._engine_call(_engine.coll_alltoall_bulk, sarr.ctypes.data, rarr.ctypes.data,
                          rarr.nbytes // len(self._ranks), BULK_PULL_PART, me=me)

    def _engine_call(self, fn, *lead, me):
        """``fn(engine, *lead, ranks, n, me, tag base, ctx)``, one of _engine's
        coll_* calls; its error as the MPI exception."""
        notify_started()
        try:
            fn(self._eng, *lead, _cranks(self._ranks), len(self._ranks), me, self._base,
               self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    @staticmethod
    def _bulk(rc, what):
        if rc:
            raise engine_exception(_engine.EngineError(rc, what)) from None

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
