"""One-sided communication (``MPI.Win``) as active messages over the engine.

Every window duplicates its communicator; on the duplicate's point-to-point
context each process runs a service thread that receives the requests other
processes address to its memory (tag ``_REQ``), applies them in arrival order
and answers on the same context with the origin's reply tag.  Passive-target
epochs therefore progress while the target's application thread computes.
Operations on the calling process's own memory are applied in place.

A target serves each origin's requests in order, so Put and Accumulate go
unanswered: Flush/Fence/Complete send a flush request (Unlock its unlock
request) behind them and wait for its reply, which also carries the first
error the target met applying them.  Operations that return data complete
with their own reply.  Locks are granted by the
target's lock manager (exclusive/shared queue); general active target
synchronisation exchanges post/complete notices on the same context.
"""

import ctypes
import mmap
import os
import pickle
import struct
import sys
import threading
import traceback
from collections import deque

import numpy as np

from . import _engine
from . import errhandler as _eh
from .buffers import getbuffer, is_bottom, message_p2p
from .datatype import PREDEFINED as _TYPES
from .exceptions import (ERR_ARG, ERR_DISP, ERR_KEYVAL, ERR_OTHER,
                         ERR_RANK, ERR_RMA_ATTACH, ERR_RMA_FLAVOR, ERR_RMA_RANGE,
                         ERR_RMA_SYNC, ERR_SIZE, ERR_WIN, Exception as MPIException,
                         raise_error)
from .handleobj import HandleObject
from .mpibuffer import buffer
from .op import PREDEFINED_OPS as _OPS
from .op import SUM as _SUM

PROC_NULL = -1
UNDEFINED = -32766

# Attribute keys, flavors, models, assertions, lock types (MPICH's values)
WIN_BASE = 1711276033
WIN_SIZE = 1711276035
WIN_DISP_UNIT = 1711276037
WIN_CREATE_FLAVOR = 1711276039
WIN_FLAVOR = WIN_CREATE_FLAVOR
WIN_MODEL = 1711276041

WIN_FLAVOR_CREATE = 1
WIN_FLAVOR_ALLOCATE = 2
WIN_FLAVOR_DYNAMIC = 3
WIN_FLAVOR_SHARED = 4

WIN_SEPARATE = 1
WIN_UNIFIED = 2

MODE_NOCHECK = 1024
MODE_NOSTORE = 2048
MODE_NOPUT = 4096
MODE_NOPRECEDE = 8192
MODE_NOSUCCEED = 16384

LOCK_EXCLUSIVE = 234
LOCK_SHARED = 235

KEYVAL_INVALID = 603979776
_PREDEF_KEYS = (WIN_BASE, WIN_SIZE, WIN_DISP_UNIT, WIN_CREATE_FLAVOR, WIN_MODEL)
_ALL_MODES = MODE_NOCHECK | MODE_NOSTORE | MODE_NOPUT | MODE_NOPRECEDE | MODE_NOSUCCEED

# Wire protocol on the window's context
_REQ = 1            # origin -> target service thread
_POST = 2           # PSCW: target -> origin, "exposure epoch open"
_DONE = 3           # PSCW: origin -> target, "access epoch complete"
_REPLY0 = 16        # replies use tags _REPLY0 .. _REPLY0 + _NREPLY - 1
_NREPLY = 1 << 26

_PUT, _GET, _ACC, _GACC, _CAS, _LOCK, _UNLOCK, _STOP, _FLUSH, _KICK = range(10)
_NOREPLY = 0        # reply tag of Put/Accumulate: completed by a later _FLUSH/_UNLOCK

_HDR = struct.Struct("<I")
_OK, _FAILED = b"\0", b"\1"      # first byte of a reply (an empty reply: a lock grant)

_OPNAMES = "cswap,max,min,sum,prod,land,band,lor,bor,lxor,bxor,minloc,maxloc,replace,no_op"
# MPICH's answer to MPI_Win_get_info (erdmampi reads no window hint)
_DEFAULT_HINTS = {
    "no_locks": "false", "accumulate_ordering": "rar,raw,war,waw",
    "accumulate_ops": "same_op_no_op", "alloc_shared_noncontig": "false",
    "same_size": "false", "same_disp_unit": "false", "alloc_shm": "false",
    "which_accumulate_ops": _OPNAMES, "accumulate_noncontig_dtype": "true",
    "accumulate_max_bytes": "unlimited", "disable_shm_accumulate": "false",
    "coll_attach": "false", "perf_preference": _OPNAMES,
}


def _rt():
    from .comm import _rt as rt
    return rt


def _engine_or_raise():
    from .comm import _engine_or_raise as f
    return f()


def _eng_error(e):
    from .request import engine_exception
    return engine_exception(e)


def _mem_view(addr, nbytes):
    """A writable uint8 array over ``nbytes`` bytes at address ``addr``."""
    if nbytes <= 0:
        return np.empty(0, np.uint8)
    return np.frombuffer((ctypes.c_ubyte * nbytes).from_address(addr), dtype=np.uint8)


def _encode(header, payload=b""):
    h = pickle.dumps(header, protocol=pickle.HIGHEST_PROTOCOL)
    return _HDR.pack(len(h)) + h + bytes(payload)


def _decode(data):
    n = _HDR.unpack_from(data, 0)[0]
    header = pickle.loads(bytes(data[4:4 + n]))
    return header, memoryview(data)[4 + n:]


def _typename(datatype):
    """The predefined element type of ``datatype``, by name (for the wire)."""
    base = datatype._base
    for name, dt in _TYPES.items():
        if dt is base:
            return name
    return "BYTE"


# -----------------------------------------------------------------------------
# Messages


class _Empty:
    """An empty buffer (None, or PROC_NULL with only a datatype)."""

    addr = 0
    nbytes = 0
    count = 0
    device = False

    def __init__(self, datatype):
        self.datatype = datatype
        self.array = np.empty(0, np.uint8)

    def finish(self):
        pass


def _message(spec, readonly, rank):
    if spec is None:
        return _Empty(_TYPES["BYTE"])
    if isinstance(spec, (list, tuple)) and spec and spec[0] is None:
        dt = spec[-1] if len(spec) > 1 and not isinstance(spec[-1], int) else None
        if rank == PROC_NULL or all(isinstance(x, int) and x == 0 for x in spec[1:-1]):
            from .datatype import asdatatype
            return _Empty(asdatatype(dt) if dt is not None else _TYPES["BYTE"])
    return message_p2p(spec, readonly)


def _target(target, msg):
    """``(disp, count, datatype)`` from mpi4py's target argument."""
    disp, count, datatype = 0, msg.count, msg.datatype
    if target is None:
        pass
    elif isinstance(target, (list, tuple)):
        n = len(target)
        if n >= 4:
            raise ValueError("target: expecting 3 items at most")
        if n >= 1:
            disp = int(target[0].__index__())
        if n >= 2:
            count = int(target[1].__index__())
        if n >= 3:
            from .datatype import asdatatype
            datatype = asdatatype(target[2])
    else:
        try:
            disp = int(target.__index__())
        except AttributeError:
            raise ValueError("target: expecting integral or list/tuple") from None
    return disp, count, datatype


def _typed(mem, datatype):
    """``mem`` (uint8) as elements of ``datatype``'s reduction type."""
    dt = datatype._reduce_dtype if datatype._reduce_dtype is not None else datatype.np_dtype
    if dt is None:
        return mem
    return mem.view(dt)


# -----------------------------------------------------------------------------
# Window state


class _Keyval:
    __slots__ = ("copy_fn", "delete_fn", "nopython")

    def __init__(self, copy_fn, delete_fn, nopython):
        self.copy_fn, self.delete_fn, self.nopython = copy_fn, delete_fn, nopython


_keyvals = {}
_next_keyval = [1711276100]
_kv_lock = threading.Lock()


class _Pending:
    """One operation awaiting its target's reply."""

    __slots__ = ("target", "ereq", "finish", "done", "error", "lock")

    def __init__(self, target, ereq, finish):
        self.target = target
        self.ereq = ereq
        self.finish = finish
        self.done = False
        self.error = 0
        self.lock = threading.Lock()

    def _complete(self, raw):
        with self.lock:
            if self.done:
                return
            data = self.ereq.take() if raw.nbytes else b""
            self.ereq.free()
            self.done = True
            if data[:1] == _FAILED:
                self.error = int(bytes(data[1:]).decode())
            elif self.finish is not None:
                self.finish(memoryview(data)[1:])

    def test(self):
        if self.done:
            return True
        try:
            raw = self.ereq.test()
        except _engine.EngineError as e:
            raise _eng_error(e) from None
        if raw is None:
            return False
        self._complete(raw)
        return True

    def wait(self):
        if not self.done:
            try:
                raw = self.ereq.wait()
            except _engine.EngineError as e:
                raise _eng_error(e) from None
            self._complete(raw)
        if self.error:
            err, self.error = self.error, 0
            raise_error(err)


class _ReqOp:
    """Request operation of Rput/Rget/...: completes with its reply."""

    __slots__ = ("pending", "fields", "obj")
    persistent = False

    def __init__(self, pending):
        self.pending = pending
        self.fields = None
        self.obj = None

    def _done(self):
        self.fields = (-2, -1, 0, 0, False)     # ANY_SOURCE, ANY_TAG

    def test(self):
        if self.fields is None:
            if self.pending is not None and not self.pending.test():
                return False
            self.wait()
        return True

    def wait(self):
        if self.fields is None:
            if self.pending is not None:
                self.pending.wait()
            self._done()

    def cancel(self):
        pass

    def free(self):
        pass


class _State:
    """Everything behind one window handle."""

    def __init__(self, comm, flavor, raw, base, size, disp_unit):
        self.comm = comm                    # private duplicate
        self.ctx = comm._ctx
        self.ranks = comm._ranks            # COMM_WORLD ranks
        self.rank = comm._rank
        self.me = self.ranks[self.rank]
        self.flavor = flavor
        self.raw = raw                      # keeps the memory alive
        self.base = base
        self.size = size
        self.disp_unit = disp_unit
        self.regions = {}                   # dynamic: base address -> (size, keep)
        self.shared = None                  # shared: (mmap, offsets, sizes, units)
        self.name = ""
        self.hints = {}
        self.attrs = {}
        self.mlock = threading.Lock()       # memory updates
        self.plock = threading.Lock()       # pending list, reply tags
        self.pending = []
        self.unacked = set()                # targets of unanswered Put/Accumulate
        self.errs = {}                      # origin -> first error of its unanswered ops
        self.next_tag = 0
        # lock manager (this process as a target)
        self.lk = threading.Lock()
        self.lk_excl = None
        self.lk_shared = 0
        self.lk_queue = deque()
        self.waiting = set()                # origins whose lock is queued
        self.blocked = {}                   # origin -> its deferred requests
        # this process as an origin
        self.locked = {}                    # target world rank -> lock type
        self.lock_all = False
        self.start_group = None
        self.post_reqs = None
        self.thread = None

    # -- replies --------------------------------------------------------------

    def reply_tag(self):
        with self.plock:
            t = self.next_tag
            self.next_tag = (t + 1) % _NREPLY
        return _REPLY0 + t

    def send(self, dest, tag, data):
        arr = np.frombuffer(data, dtype=np.uint8) if data else np.empty(0, np.uint8)
        eng = _engine_or_raise()
        try:
            r = eng.isend(arr.ctypes.data if arr.size else 0, arr.nbytes, dest, tag, self.ctx,
                          keep=(data, arr))
        except _engine.EngineError as e:
            raise _eng_error(e) from None
        r.free()

    def request(self, target, header, payload=b"", finish=None, reply=True):
        """Send one request to ``target`` (world rank); returns its _Pending
        (None when ``reply`` is false: a later flush completes it)."""
        if not reply:
            with self.plock:
                self.unacked.add(target)
            self.send(target, _REQ, _encode((header[0], _NOREPLY) + tuple(header[1:]), payload))
            return None
        eng = _engine_or_raise()
        tag = self.reply_tag()
        try:
            ereq = eng.irecv_alloc(target, tag, self.ctx)
        except _engine.EngineError as e:
            raise _eng_error(e) from None
        p = _Pending(target, ereq, finish)
        with self.plock:
            self.pending.append(p)
        self.send(target, _REQ, _encode((header[0], tag) + tuple(header[1:]), payload))
        return p

    def flush(self, target=None, acked=False):
        """Complete the operations to ``target`` (all targets if None);
        ``acked``: the caller's own request will cover unanswered ones."""
        with self.plock:
            if target is None:
                todo, self.pending = self.pending, []
                unacked, self.unacked = self.unacked, set()
            else:
                todo = [p for p in self.pending if p.target == target]
                self.pending = [p for p in self.pending if p.target != target]
                unacked = {target} & self.unacked
                self.unacked.discard(target)
        if not acked:
            todo += [self.request(t, (_FLUSH,)) for t in unacked]
            with self.plock:
                self.pending = [p for p in self.pending if p not in todo]
        err = None
        for p in todo:
            try:
                p.wait()
            except MPIException as e:
                err = err or e
        if err is not None:
            raise err

    # -- target memory --------------------------------------------------------

    def locate(self, disp, nbytes):
        """uint8 array over the target bytes of ``disp`` (raises MPI errors)."""
        if self.flavor == WIN_FLAVOR_DYNAMIC:
            for addr, (size, _) in self.regions.items():
                if addr <= disp and disp + nbytes <= addr + size:
                    return _mem_view(disp, nbytes)
            if nbytes == 0:
                return np.empty(0, np.uint8)
            raise_error(ERR_RMA_RANGE, "target memory is not attached to the window")
        off = disp * self.disp_unit
        if off < 0 or off + nbytes > self.size:
            if nbytes == 0:
                return np.empty(0, np.uint8)
            raise_error(ERR_RMA_RANGE, f"target range [{off}, {off + nbytes}) out of the "
                        f"window (size {self.size})")
        return _mem_view(self.base + off, nbytes)

    def apply(self, kind, disp, nbytes, tname, opname, payload):
        """Apply one operation to this process's memory; returns the reply bytes."""
        with self.mlock:
            mem = self.locate(disp, nbytes)
            if kind == _PUT:
                mem[:] = np.frombuffer(payload, np.uint8, nbytes)
                return b""
            if kind == _GET:
                return mem.tobytes()
            datatype = _TYPES[tname]
            if kind == _CAS:
                old = mem.tobytes()
                n = len(payload) // 2
                if bytes(payload[n:]) == old:
                    mem[:] = np.frombuffer(payload, np.uint8, n)
                return old
            old = mem.tobytes() if kind == _GACC else b""
            op = _OPS[opname]
            if opname != "NO_OP" and nbytes:
                src = np.frombuffer(payload, np.uint8, nbytes).copy()
                op._apply(_typed(src, datatype), _typed(mem, datatype), datatype)
            return old

    # -- lock manager ---------------------------------------------------------
    #
    # Lock returns at once at the origin; a remote origin whose lock cannot be
    # granted yet is "waiting": the service thread defers its later requests
    # (they belong to the epoch) until the grant, then drains them in order.

    def _grantable(self, ltype):
        if self.lk_excl is not None:
            return False
        return ltype == LOCK_SHARED or self.lk_shared == 0

    def lock_request(self, origin, ltype, grant, remote=False):
        with self.lk:
            now = not self.lk_queue and self._grantable(ltype)
            if now:
                self._take(origin, ltype)
            else:
                self.lk_queue.append((origin, ltype, grant, remote))
                if remote:
                    self.waiting.add(origin)
        if now:
            grant()

    def _take(self, origin, ltype):
        if ltype == LOCK_EXCLUSIVE:
            self.lk_excl = origin
        else:
            self.lk_shared += 1

    def unlock_request(self, origin):
        grants = []
        with self.lk:
            if self.lk_excl == origin:
                self.lk_excl = None
            elif self.lk_shared:
                self.lk_shared -= 1
            while self.lk_queue and self._grantable(self.lk_queue[0][1]):
                o, t, g, remote = self.lk_queue.popleft()
                self._take(o, t)
                if remote:
                    self.waiting.discard(o)
                grants.append((g, o if remote else None))
        for g, o in grants:
            g()
            if o is not None:       # the service thread drains o's deferred requests
                self.send(self.me, _REQ, _encode((_KICK, _NOREPLY, o)))

    # -- service thread -------------------------------------------------------

    def serve(self):
        eng = _rt().engine
        while eng is not None:
            try:
                ereq = eng.irecv_alloc(_engine.ANY_SOURCE, _REQ, self.ctx)
                raw = ereq.wait()
                data = ereq.take()
                ereq.free()
            except _engine.EngineError:
                return
            header, payload = _decode(data)
            origin = raw.source
            kind = header[0]
            if kind == _STOP:
                return
            try:
                if kind == _KICK:
                    self.drain(header[2])
                elif origin in self.waiting or self.blocked.get(origin):
                    self.blocked.setdefault(origin, deque()).append((header, payload))
                else:
                    self.handle(origin, header, payload)
            except MPIException:        # the engine is gone
                return

    def drain(self, origin):
        q = self.blocked.get(origin)
        while q and origin not in self.waiting:
            header, payload = q.popleft()
            self.handle(origin, header, payload)
        if not q:
            self.blocked.pop(origin, None)

    def handle(self, origin, header, payload):
        """Serve one request of ``origin``; replies unless it is unanswered."""
        kind, tag = header[0], header[1]
        try:
            if kind == _LOCK:
                self.lock_request(origin, header[2],
                                  lambda o=origin, t=tag: self.send(o, t, b""), remote=True)
                return
            if kind in (_FLUSH, _UNLOCK):
                if kind == _UNLOCK:
                    self.unlock_request(origin)
                err = self.errs.pop(origin, 0)
                out = _FAILED + b"%d" % err if err else _OK
            else:
                out = _OK + self.apply(kind, *header[2:], payload)
        except MPIException as e:
            if tag == _NOREPLY:
                self.errs.setdefault(origin, e.Get_error_class())
                return
            out = _FAILED + b"%d" % e.Get_error_class()
        except BaseException:       # keep serving; report to the origin
            traceback.print_exc()
            if tag == _NOREPLY:
                self.errs.setdefault(origin, ERR_OTHER)
                return
            out = _FAILED + b"%d" % ERR_OTHER
        if tag != _NOREPLY:
            self.send(origin, tag, out)

    def start(self):
        self.thread = threading.Thread(target=self.serve, daemon=True,
                                       name="erdmampi-win")
        self.thread.start()

    def stop(self):
        self.send(self.me, _REQ, _encode((_STOP, 0)))
        self.thread.join()


# -----------------------------------------------------------------------------
# Win


class Win(HandleObject, _eh.HasErrhandler):
    """Remote memory access context."""

    _NULL = 0x20000000          # MPICH's MPI_WIN_NULL
    _FIRST = 0xffffffffa0000000 - 1
    _ERR = ERR_WIN
    _NULL_NAME = "WIN_NULL"
    _registry = {}
    _errh_kind = "Win"

    def _check(self):
        return self._state()

    def free(self):
        """Call Free if not null."""
        if self:
            self.Free()

    # -- creation -------------------------------------------------------------

    @staticmethod
    def _comm_arg(comm):
        from .comm import COMM_SELF, Comm, Intercomm
        if comm is None:
            comm = COMM_SELF
        if not isinstance(comm, Comm):
            raise TypeError(f"expected Intracomm, got {type(comm).__name__}")
        comm._check()
        if isinstance(comm, Intercomm) or comm.Is_inter():
            from .exceptions import ERR_COMM
            raise_error(ERR_COMM, "windows need an intracommunicator")
        return comm

    @classmethod
    def _new(cls, comm, flavor, raw, base, size, disp_unit, info):
        disp_unit = int(disp_unit)
        if disp_unit <= 0:
            raise_error(ERR_DISP, f"invalid displacement unit {disp_unit}")
        dup = comm.Dup()
        st = _State(dup, flavor, raw, base, size, disp_unit)
        st.hints = dict(_DEFAULT_HINTS)
        st.hints.update(cls._info_items(info))
        if len(st.ranks) > 1:
            st.start()
        return cls._register(st)

    @staticmethod
    def _info_items(info):
        if info is None or not info:
            return {}
        try:
            return {k: info.Get(k) for k in info.keys()}
        except Exception:
            return {}

    @classmethod
    def Create(cls, memory, disp_unit=1, info=None, comm=None):
        """Create a window over ``memory`` (a buffer, or BOTTOM/None: empty)."""
        comm = cls._comm_arg(comm)
        if is_bottom(memory):
            raw, base, size = None, 0, 0
        else:
            raw = getbuffer(memory, False).raw
            size = raw.nbytes
            base = raw.ctypes.data if size else 0
        return cls._new(comm, WIN_FLAVOR_CREATE, raw, base, size, disp_unit, info)

    @classmethod
    def Allocate(cls, size, disp_unit=1, info=None, comm=None):
        """Create a window over new memory of ``size`` bytes."""
        comm = cls._comm_arg(comm)
        size = int(size)
        if size < 0:
            raise_error(ERR_SIZE, f"invalid window size {size}")
        raw = np.zeros(max(size, 1), np.uint8)[:size]
        return cls._new(comm, WIN_FLAVOR_ALLOCATE, raw, raw.ctypes.data if size else 0,
                        size, disp_unit, info)

    @classmethod
    def Allocate_shared(cls, size, disp_unit=1, info=None, comm=None):
        """Create a window over memory the processes of ``comm`` share.

        One mapping of a file in /dev/shm, each process's part after the
        previous one's.
        """
        comm = cls._comm_arg(comm)
        size = int(size)
        if size < 0:
            raise_error(ERR_SIZE, f"invalid window size {size}")
        disp_unit = int(disp_unit)
        layout = comm.allgather((size, disp_unit))
        sizes = [s for s, _ in layout]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        total = max(sum(sizes), 1)
        path = None
        if comm.Get_rank() == 0:
            import tempfile
            d = "/dev/shm" if os.path.isdir("/dev/shm") else None
            fd, path = tempfile.mkstemp(prefix="erdmampi-win-", dir=d)
            os.ftruncate(fd, total)
            os.close(fd)
        path = comm.bcast(path, 0)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, total)
        finally:
            os.close(fd)
        comm.Barrier()
        if comm.Get_rank() == 0:
            os.unlink(path)
        whole = np.frombuffer(mm, dtype=np.uint8)
        rank = comm.Get_rank()
        raw = whole[offsets[rank]:offsets[rank] + size]
        base = whole.ctypes.data + offsets[rank]
        win = cls._new(comm, WIN_FLAVOR_SHARED, raw, base, size, disp_unit, info)
        win._state().shared = (mm, whole, offsets, sizes, [u for _, u in layout])
        return win

    @classmethod
    def Create_dynamic(cls, info=None, comm=None):
        """Create a window whose memory is attached later.

        Displacements are absolute addresses.
        """
        comm = cls._comm_arg(comm)
        return cls._new(comm, WIN_FLAVOR_DYNAMIC, None, 0, 0, 1, info)

    def Attach(self, memory):
        """Attach memory to a dynamic window."""
        st = self._check()
        if st.flavor != WIN_FLAVOR_DYNAMIC:
            raise_error(ERR_RMA_FLAVOR, "Attach needs a dynamic window")
        raw = getbuffer(memory, False).raw
        if raw.nbytes:
            with st.mlock:
                st.regions[raw.ctypes.data] = (raw.nbytes, raw)

    def Detach(self, memory):
        """Detach memory from a dynamic window."""
        st = self._check()
        if st.flavor != WIN_FLAVOR_DYNAMIC:
            raise_error(ERR_RMA_FLAVOR, "Detach needs a dynamic window")
        raw = getbuffer(memory, False).raw
        if raw.nbytes:
            with st.mlock:
                if st.regions.pop(raw.ctypes.data, None) is None:
                    raise_error(ERR_RMA_ATTACH, "memory is not attached to the window")

    def Free(self):
        """Free the window (collective): completes pending operations."""
        st = self._check()
        try:
            st.flush()
        finally:
            st.comm.Barrier()
            if st.thread is not None:
                st.stop()
            self._delete_all_attrs(st)
            st.comm.Free()
            self._release()

    # -- queries --------------------------------------------------------------

    def Get_group(self):
        """The group of the processes of the window."""
        st = self._check()
        from .group import Group
        return Group._from_ranks(st.ranks)

    @property
    def group(self):
        return self.Get_group()

    @property
    def group_size(self):
        return len(self._check().ranks)

    @property
    def group_rank(self):
        return self._check().rank

    def Get_attr(self, keyval):
        """The value of an attribute (`WIN_BASE`, `WIN_SIZE`, ...; None if not set)."""
        st = self._check()
        keyval = int(keyval)
        if keyval == WIN_BASE:
            return st.base
        if keyval == WIN_SIZE:
            return st.size
        if keyval == WIN_DISP_UNIT:
            return st.disp_unit
        if keyval == WIN_CREATE_FLAVOR:
            return st.flavor
        if keyval == WIN_MODEL:
            return WIN_UNIFIED
        if keyval not in _keyvals:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        return st.attrs.get(keyval)

    def Set_attr(self, keyval, attrval):
        """Store an attribute value on the window under ``keyval``."""
        st = self._check()
        keyval = int(keyval)
        if keyval not in _keyvals:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        if keyval in st.attrs:
            self._delete_attr(st, keyval)
        st.attrs[keyval] = attrval

    def Delete_attr(self, keyval):
        """Delete the attribute stored under ``keyval`` (its delete function runs)."""
        st = self._check()
        keyval = int(keyval)
        if keyval not in _keyvals:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        if keyval in st.attrs:
            self._delete_attr(st, keyval)

    def _delete_attr(self, st, keyval):
        val = st.attrs.pop(keyval)
        kv = _keyvals.get(keyval)
        if kv is not None and kv.delete_fn is not None:
            try:
                kv.delete_fn(self, keyval, val)
            except BaseException:
                traceback.print_exc(file=sys.stderr)
                raise_error(ERR_OTHER, "attribute delete callback failed")

    def _delete_all_attrs(self, st):
        for k in list(st.attrs):
            try:
                self._delete_attr(st, k)
            except MPIException:
                pass

    @classmethod
    def Create_keyval(cls, copy_fn=None, delete_fn=None, nopython=False):
        """Create a new attribute key for windows, with optional copy and delete functions."""
        with _kv_lock:
            k = _next_keyval[0]
            _next_keyval[0] += 1
        _keyvals[k] = _Keyval(copy_fn, delete_fn, nopython)
        return k

    @classmethod
    def Free_keyval(cls, keyval):
        """Free an attribute key for windows; returns `KEYVAL_INVALID`."""
        if _keyvals.pop(int(keyval), None) is None:
            raise_error(ERR_KEYVAL, f"invalid keyval {keyval}")
        return KEYVAL_INVALID

    @property
    def attrs(self):
        st = self._check()
        return (st.base, st.size, st.disp_unit)

    @property
    def flavor(self):
        return self._check().flavor

    @property
    def model(self):
        self._check()
        return WIN_UNIFIED

    def tomemory(self):
        """The local window memory as a buffer (format "B")."""
        st = self._check()
        if st.raw is None or st.size == 0:
            return buffer()
        return buffer.frombuffer(st.raw)

    def Shared_query(self, rank):
        """The ``(memory, disp_unit)`` of ``rank``'s part of a shared window."""
        st = self._check()
        rank = int(rank)
        if st.flavor != WIN_FLAVOR_SHARED:
            raise_error(ERR_RMA_FLAVOR, "Shared_query needs a shared window")
        _, whole, offsets, sizes, units = st.shared
        if rank == PROC_NULL:
            rank = next((i for i, s in enumerate(sizes) if s > 0), 0)
        elif rank < 0 or rank >= len(sizes):
            raise_error(ERR_RANK, f"invalid rank {rank}")
        if sizes[rank] == 0:
            return buffer(), units[rank]
        return buffer.frombuffer(whole[offsets[rank]:offsets[rank] + sizes[rank]]), units[rank]

    def Get_info(self):
        """An `Info` with the hints of the window."""
        st = self._check()
        from .info import Info
        return Info.Create(st.hints)

    def Set_info(self, info):
        """Set the hints of the window."""
        st = self._check()
        st.hints.update(self._info_items(info))

    info = property(Get_info, Set_info)

    def Get_name(self):
        """The name of the window (``MPI_WIN_NULL`` for a null one)."""
        if self._h == self._NULL:
            return "MPI_WIN_NULL"
        return self._check().name

    def Set_name(self, name):
        """Give the window a name (a string)."""
        st = self._check()
        if not isinstance(name, str):
            raise TypeError(f"expected str, got {type(name).__name__}")
        st.name = name

    name = property(Get_name, Set_name)

    # -- communication --------------------------------------------------------

    def _world(self, st, rank):
        rank = int(rank)
        if rank == PROC_NULL:
            return None
        if rank < 0 or rank >= len(st.ranks):
            raise_error(ERR_RANK, f"invalid target rank {rank} (window size {len(st.ranks)})")
        return st.ranks[rank]

    @staticmethod
    def _tbytes(count, datatype):
        return count * datatype.Get_size()

    def _op(self, st, target, header, payload, finish, reply=True):
        """Run one operation on world rank ``target``.

        In place when it is this process, else as a request; returns its
        _Pending or None.
        """
        if target == st.me:
            out = st.apply(*header, payload)
            if finish is not None:
                finish(out)
            return None
        return st.request(target, header, payload, finish, reply)

    def _put(self, origin, target_rank, target, kind, op=None):
        st = self._check()
        msg = _message(origin, True, target_rank)
        disp, count, datatype = _target(target, msg)
        wt = self._world(st, target_rank)
        if kind == _ACC:
            op = _op_arg(op)
        if wt is None:
            return None
        nbytes = self._tbytes(count, datatype)
        if kind == _ACC and nbytes:
            op._check(datatype)
        data = msg.array.view(np.uint8).tobytes()[:nbytes] if msg.nbytes else b""
        if len(data) < nbytes:
            data = data + bytes(nbytes - len(data))
        opname = op._name if op is not None else ""
        return self._op(st, wt, (kind, disp, nbytes, _typename(datatype), opname), data, None,
                        reply=False)

    @staticmethod
    def _into(msg):
        """A finish callback copying reply bytes into the buffer of ``msg``."""
        def finish(data):
            n = min(len(data), msg.nbytes)
            if n:
                ctypes.memmove(msg.addr, bytes(data[:n]), n)
            msg.finish()
        return finish

    def _get(self, origin, target_rank, target):
        st = self._check()
        msg = _message(origin, False, target_rank)
        disp, count, datatype = _target(target, msg)
        wt = self._world(st, target_rank)
        if wt is None:
            return None
        nbytes = self._tbytes(count, datatype)
        return self._op(st, wt, (_GET, disp, nbytes, "BYTE", ""), b"", self._into(msg))

    def _get_acc(self, origin, result, target_rank, target, op):
        st = self._check()
        msg = _message(origin, False, target_rank)
        res = _message(result, False, target_rank)
        disp, count, datatype = _target(target, msg)
        op = _op_arg(op)
        wt = self._world(st, target_rank)
        if wt is None:
            return None
        nbytes = self._tbytes(count, datatype)
        if nbytes:
            op._check(datatype)
        if op._name == "NO_OP":
            data = b""
            if msg.count == 0 and target is None:
                nbytes = res.nbytes
        else:
            data = msg.array.view(np.uint8).tobytes()[:nbytes] if msg.nbytes else b""
        return self._op(st, wt, (_GACC, disp, nbytes, _typename(datatype), op._name),
                        data, self._into(res))

    def Put(self, origin, target_rank, target=None):
        """Write the origin buffer into the window of ``target_rank``."""
        self._put(origin, target_rank, target, _PUT)

    def Get(self, origin, target_rank, target=None):
        """Read from the window of ``target_rank`` into the origin buffer."""
        self._get(origin, target_rank, target)

    def Accumulate(self, origin, target_rank, target=None, op=_SUM):
        """Combine the origin buffer with the target's window memory by ``op``."""
        self._put(origin, target_rank, target, _ACC, op)

    def Get_accumulate(self, origin, result, target_rank, target=None, op=_SUM):
        """Fetch the target's window memory into ``result``, then accumulate the origin into it."""
        self._get_acc(origin, result, target_rank, target, op)

    @staticmethod
    def _single(msg, what):
        if msg.count != 1:
            raise ValueError(f"{what}: expecting a single element, got {msg.count}")

    def Fetch_and_op(self, origin, result, target_rank, target_disp=0, op=_SUM):
        """Fetch one element of the target window into ``result``, then combine ``origin`` in."""
        st = self._check()
        msg = _message(origin, True, target_rank)
        res = _message(result, False, target_rank)
        op = _op_arg(op)
        wt = self._world(st, target_rank)
        if wt is None:
            return
        self._single(msg, "origin")
        self._single(res, "result")
        if msg.datatype != res.datatype:
            raise ValueError("mismatch in origin and result MPI datatypes")
        op._check(msg.datatype)
        nbytes = msg.datatype.Get_size()
        data = msg.array.view(np.uint8).tobytes()[:nbytes]
        self._op(st, wt, (_GACC, int(target_disp), nbytes, _typename(msg.datatype), op._name),
                 data, self._into(res))

    def Compare_and_swap(self, origin, compare, result, target_rank, target_disp=0):
        """Replace one element of the target's window by ``origin`` if it equals ``compare``."""
        st = self._check()
        msg = _message(origin, True, target_rank)
        cmp_ = _message(compare, True, target_rank)
        res = _message(result, False, target_rank)
        wt = self._world(st, target_rank)
        if wt is None:
            return
        self._single(msg, "origin")
        self._single(cmp_, "compare")
        self._single(res, "result")
        if msg.datatype != cmp_.datatype:
            raise ValueError("mismatch in origin and compare MPI datatypes")
        if msg.datatype != res.datatype:
            raise ValueError("mismatch in origin and result MPI datatypes")
        nbytes = msg.datatype.Get_size()
        data = (msg.array.view(np.uint8).tobytes()[:nbytes]
                + cmp_.array.view(np.uint8).tobytes()[:nbytes])
        self._op(st, wt, (_CAS, int(target_disp), nbytes, _typename(msg.datatype), ""),
                 data, self._into(res))

    @staticmethod
    def _request(pending):
        from .request import Request
        return Request._new(_ReqOp(pending))

    def Rput(self, origin, target_rank, target=None):
        """Like `Put`, returning a `Request` completed when the data has left the origin."""
        return self._request(self._put(origin, target_rank, target, _PUT))

    def Rget(self, origin, target_rank, target=None):
        """Like `Get`, returning a `Request` completed when the data has arrived."""
        return self._request(self._get(origin, target_rank, target))

    def Raccumulate(self, origin, target_rank, target=None, op=_SUM):
        """Like `Accumulate`, returning a `Request`."""
        return self._request(self._put(origin, target_rank, target, _ACC, op))

    def Rget_accumulate(self, origin, result, target_rank, target=None, op=_SUM):
        """Like `Get_accumulate`, returning a `Request`."""
        return self._request(self._get_acc(origin, result, target_rank, target, op))

    # -- synchronisation ------------------------------------------------------

    @staticmethod
    def _assert(assertion):
        assertion = int(assertion)
        if assertion & ~_ALL_MODES:
            raise_error(ERR_ARG, f"invalid assertion {assertion}")
        return assertion

    def Fence(self, assertion=0):
        """Synchronize the window's processes: the operations before the fence complete."""
        st = self._check()
        self._assert(assertion)
        st.flush()
        if len(st.ranks) > 1:
            st.comm.Barrier()

    def _lock(self, st, wt, ltype):
        if wt == st.me:
            ev = threading.Event()
            st.lock_request(wt, ltype, ev.set)
            ev.wait()
        else:       # granted later: the target defers this epoch's requests till then
            st.request(wt, (_LOCK, ltype))

    def Lock(self, rank, lock_type=LOCK_EXCLUSIVE, assertion=0):
        """Begin a passive target epoch at the process of rank ``rank``."""
        st = self._check()
        lock_type = int(lock_type)
        if lock_type not in (LOCK_EXCLUSIVE, LOCK_SHARED):
            raise_error(ERR_ARG, f"invalid lock type {lock_type}")
        self._assert(assertion)
        wt = self._world(st, rank)
        if wt is None:
            return
        if wt in st.locked or st.lock_all:
            raise_error(ERR_RMA_SYNC, "target is already locked")
        self._lock(st, wt, lock_type)
        st.locked[wt] = lock_type

    def _unlock(self, st, wt):
        if wt == st.me:
            st.flush(wt)
            st.unlock_request(wt)
            return
        # with unanswered Put/Accumulate, the unlock reply completes them; else
        # nothing is left to complete and the unlock needs no answer (this
        # origin's next request to the target is served after it)
        answer = wt in st.unacked
        st.flush(wt, acked=True)
        if answer:
            st.request(wt, (_UNLOCK,)).wait()
        else:
            st.send(wt, _REQ, _encode((_UNLOCK, _NOREPLY)))

    def Unlock(self, rank):
        """End the passive target epoch at the process of rank ``rank``."""
        st = self._check()
        wt = self._world(st, rank)
        if wt is None:
            return
        if st.locked.pop(wt, None) is None:
            raise_error(ERR_RMA_SYNC, "target is not locked")
        self._unlock(st, wt)

    def Lock_all(self, assertion=0):
        """Begin a shared passive target epoch at all the processes."""
        st = self._check()
        self._assert(assertion)
        if st.locked or st.lock_all:
            raise_error(ERR_RMA_SYNC, "a passive target epoch is already open")
        for wt in st.ranks:
            self._lock(st, wt, LOCK_SHARED)
        st.lock_all = True

    def Unlock_all(self):
        """End the passive target epoch begun by `Lock_all`."""
        st = self._check()
        if not st.lock_all:
            raise_error(ERR_RMA_SYNC, "no Lock_all epoch is open")
        st.lock_all = False
        for wt in st.ranks:
            self._unlock(st, wt)

    def Flush(self, rank):
        """Complete the operations issued to the process of rank ``rank``."""
        st = self._check()
        wt = self._world(st, rank)
        if wt is not None:
            st.flush(wt)

    def Flush_all(self):
        """Complete the operations issued to all the processes."""
        self._check().flush()

    Flush_local = Flush
    Flush_local_all = Flush_all

    def Sync(self):
        """Synchronize the public and private copies of the window (one copy: nothing to do)."""
        self._check()

    # general active target (PSCW)

    def Post(self, group, assertion=0):
        """Begin an exposure epoch for the processes of ``group``."""
        st = self._check()
        self._assert(assertion)
        if st.post_reqs is not None:
            raise_error(ERR_RMA_SYNC, "an exposure epoch is already open")
        eng = _engine_or_raise()
        reqs = []
        for w in group._check():
            try:
                reqs.append(eng.irecv_alloc(w, _DONE, st.ctx))
            except _engine.EngineError as e:
                raise _eng_error(e) from None
        for w in group._ranks:
            st.send(w, _POST, b"")
        st.post_reqs = reqs

    def Start(self, group, assertion=0):
        """Begin an access epoch to the processes of ``group``."""
        st = self._check()
        self._assert(assertion)
        if st.start_group is not None:
            raise_error(ERR_RMA_SYNC, "an access epoch is already open")
        eng = _engine_or_raise()
        ranks = list(group._check())
        try:
            for w in ranks:
                r = eng.irecv_alloc(w, _POST, st.ctx)
                r.wait()
                r.free()
        except _engine.EngineError as e:
            raise _eng_error(e) from None
        st.start_group = ranks

    def Complete(self):
        """End the access epoch begun by `Start`."""
        st = self._check()
        if st.start_group is None:
            raise_error(ERR_RMA_SYNC, "no access epoch is open")
        ranks, st.start_group = st.start_group, None
        for w in ranks:
            st.flush(w)
        for w in ranks:
            st.send(w, _DONE, b"")

    def Wait(self):
        """End the exposure epoch begun by `Post`, once the accessing processes completed."""
        st = self._check()
        if st.post_reqs is None:
            raise_error(ERR_RMA_SYNC, "no exposure epoch is open")
        try:
            for r in st.post_reqs:
                r.wait()
                r.free()
        except _engine.EngineError as e:
            raise _eng_error(e) from None
        st.post_reqs = None

    def Test(self):
        """Whether the exposure epoch begun by `Post` could end (and end it if so)."""
        st = self._check()
        if st.post_reqs is None:
            raise_error(ERR_RMA_SYNC, "no exposure epoch is open")
        try:
            if all(r.test() is not None for r in st.post_reqs):
                self.Wait()
                return True
        except _engine.EngineError as e:
            raise _eng_error(e) from None
        return False


def _op_arg(op):
    from .op import Op
    if op is None:
        return _SUM
    if not isinstance(op, Op):
        raise TypeError(f"expected Op, got {type(op).__name__}")
    if op._name == "OP_NULL":
        op._adopt()         # a handle written into a null object
    return op


WIN_NULL = Win()
Win._null_object = WIN_NULL
Win.__module__ = "erdmampi.MPI"
