"""Per-communicator locks and private duplicates (``MPI._comm_lock``, ``MPI._commctx_*``).

Utilities layered over the public API (``util.pkl5``) serialize multi-message
protocols with a lock per (communicator, key), and run collectives built from
point-to-point calls on a private duplicate with a fresh tag per call so they
never match user traffic.  Both live with the communicator: locks are keyed by
its handle (shared by every Python object wrapping it), the duplicate is an
attribute whose delete callback frees it with the communicator.
"""

import threading

from . import comm as _comm

__all__ = ["_comm_lock", "_comm_lock_table", "_commctx_intra", "_commctx_inter"]

_tables_lock = threading.Lock()
_tables = {}            # communicator handle -> {key: Lock}

# the duplicate's tag wraps here (MPICH's TAG_UB is far larger; any value
# a receiver can match is fine since the duplicate carries nothing else)
_TAG_UB = 1 << 20


def _table(comm):
    key = comm._handle
    with _tables_lock:
        table = _tables.get(key)
        if table is None:
            table = _tables[key] = {}
        return table


def _comm_lock(comm, key=None):
    """Create/get the lock of ``comm`` for ``key``."""
    table = _table(comm)
    with _tables_lock:
        lock = table.get(key)
        if lock is None:
            lock = table[key] = threading.Lock()
        return lock


def _comm_lock_table(comm):
    """The lock table of ``comm`` (key -> lock)."""
    return _table(comm)


class _Ctx:
    __slots__ = ("owner", "dupcomm", "localcomm", "low_group", "tag")

    def __init__(self, owner, dupcomm):
        self.owner = owner          # handle of the communicator it belongs to
        self.dupcomm = dupcomm
        self.localcomm = None
        self.low_group = False
        self.tag = 0

    def next_tag(self):
        tag = self.tag
        self.tag = 0 if tag + 1 >= _TAG_UB else tag + 1
        return tag


def _free_ctx(comm, keyval, ctx):
    for c in (ctx.localcomm, ctx.dupcomm):
        if c is not None and c:
            try:
                c.Free()
            except Exception:        # already gone at finalize
                pass


_keyval = None


def _lookup(comm):
    global _keyval
    if _keyval is None:
        _keyval = _comm.Comm.Create_keyval(delete_fn=_free_ctx)
    ctx = comm.Get_attr(_keyval)
    # a duplicate of ``comm`` may have inherited the attribute: not its own
    if ctx is None or ctx.owner != comm._handle:
        ctx = _Ctx(comm._handle, comm.Dup())
        comm.Set_attr(_keyval, ctx)
    return ctx


def _commctx_intra(comm):
    """Create/get the private duplicate of ``comm`` and a fresh tag."""
    with _comm_lock(comm, "@commctx_intra"):
        ctx = _lookup(comm)
        return ctx.dupcomm, ctx.next_tag()


def _commctx_inter(comm):
    """Create/get (duplicate, tag, local intracommunicator, low_group) for ``comm``."""
    with _comm_lock(comm, "@commctx_inter"):
        ctx = _lookup(comm)
        if ctx.localcomm is None:
            lsize, rsize = comm.Get_size(), comm.Get_remote_size()
            merged = comm.Merge(lsize > rsize)
            if lsize != rsize:
                low = lsize < rsize
            else:
                low = merged.Get_rank() < lsize
            ctx.localcomm = merged.Create(comm.Get_group())
            ctx.low_group = bool(low)
            merged.Free()
        return ctx.dupcomm, ctx.next_tag(), ctx.localcomm, ctx.low_group
