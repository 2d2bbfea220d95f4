"""Request and Prequest: wrappers of engine requests and background operations.

A :class:`Request` holds an *operation* (``_op``); ``_op is None`` means the
request is null (``REQUEST_NULL``, or completed and deallocated by a wait).
Operations:

* :class:`_EngineOp`: one engine request plus a ``finish(raw)`` completion
  that translates world ranks, copies device staging buffers back and, for
  object receives, unpickles the payload.
* :class:`_DoneOp`: completed at creation (PROC_NULL, empty operations).
* :class:`_ThreadOp`: a nonblocking collective running in a thread.

The MPI handle of a request is made on demand (``py2f``/``handle``), which
stores it in the object's C memory (``_h``, see ``_objmodel.HandleBase``);
it is 0 until then, and again once the request is deallocated.  A null
request object into which a live request's handle was written
(``MPI._addressof``) takes that request's operation when next used
(``_adopt``): the checks sit where a request is found null, off the paths
of active requests.
"""

import threading
import time
import weakref

from . import _engine
from ._objmodel import HandleBase
from .exceptions import (ERR_ARG, ERR_IN_STATUS, ERR_NO_MEM, ERR_OTHER, ERR_PENDING,
                         ERR_PROC_FAILED, ERR_PROC_FAILED_PENDING, ERR_RANK, ERR_REQUEST,
                         ERR_TRUNCATE,
                         Exception as MPIException, raise_error)
from .status import Status

UNDEFINED = -32766
PROC_NULL = -1
ANY_TAG = -1

_ENGINE_ERRORS = {
    _engine.ERR_TRUNCATE: (ERR_TRUNCATE, "message truncated"),
    _engine.ERR_PEER: (ERR_PROC_FAILED, "peer process failed or is unreachable"),
    _engine.ERR_PEER_PENDING: (ERR_PROC_FAILED_PENDING,
                               "a process of the communicator failed; this receive from "
                               "ANY_SOURCE stays pending (Comm.Ack_failed acknowledges)"),
    _engine.ERR_RANK: (ERR_RANK, "invalid rank"),
    _engine.ERR_INVAL: (ERR_ARG, "invalid argument"),
    _engine.ERR_TIMEOUT: (ERR_OTHER, "timed out"),
    _engine.ERR_NOMEM: (ERR_NO_MEM, "out of memory"),
}


def error_class(code):
    """MPI error class for an ERDMA_ERR_* code (0 -> 0)."""
    if not code:
        return 0
    return _ENGINE_ERRORS.get(code, (ERR_OTHER, ""))[0]


def error_text(code, default=""):
    """What an ERDMA_ERR_* code means to a user, or ``default``."""
    return _ENGINE_ERRORS.get(code, (ERR_OTHER, default))[1] or default


def engine_exception(err):
    """MPI.Exception for an :class:`erdmampi._engine.EngineError`."""
    cls, what = _ENGINE_ERRORS.get(err.code, (ERR_OTHER, ""))
    return MPIException(cls, f"{err}")


class _DoneOp:
    """An operation that completed when it was started."""

    __slots__ = ("fields", "obj")
    persistent = False

    def __init__(self, source=PROC_NULL, tag=ANY_TAG, nbytes=0, obj=None):
        self.fields = (source, tag, 0, nbytes, False)
        self.obj = obj

    def test(self):
        return True

    def wait(self):
        pass

    def cancel(self):
        pass

    def free(self):
        pass


class _EngineOp:
    """One engine request and its completion.

    ``finish(raw) -> (source, tag, error_class, nbytes, cancelled, obj)`` runs
    once, when the engine request has completed; ``pure=True`` says it has
    no side effects (a send, a receive into host memory), so threads that
    complete the request at once may each run it, with no lock.
    """

    __slots__ = ("ereq", "finish", "fields", "obj", "_lock")

    def __init__(self, ereq, finish, pure=False):
        self.ereq = ereq
        self.finish = finish
        self.fields = None
        self.obj = None
        self._lock = None if pure else threading.Lock()

    def _complete(self, raw):
        if self._lock is None:
            src, tag, err, nbytes, cancelled, obj = self.finish(raw)
            self.obj = obj
            self.fields = (src, tag, err, nbytes, cancelled)
            return
        with self._lock:
            if self.fields is None:
                src, tag, err, nbytes, cancelled, obj = self.finish(raw)
                self.obj = obj
                self.fields = (src, tag, err, nbytes, cancelled)

    def test(self):
        if self.fields is not None:
            return True
        try:
            raw = self.ereq.test()
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if raw is None:
            return False
        self._complete(raw)
        return True

    def wait(self):
        if self.fields is not None:
            return
        try:
            raw = self.ereq.wait()
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        self._complete(raw)

    def cancel(self):
        if self.fields is None:
            self.ereq.cancel()

    def free(self):
        self.ereq.free()


class _ThreadOp:
    """A callable run in a daemon thread (nonblocking collectives)."""

    __slots__ = ("thread", "fields", "obj", "exc", "_fn")

    def __init__(self, fn):
        self.fields = None
        self.obj = None
        self.exc = None
        self._fn = fn
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name="erdmampi-icoll")
        self.thread.start()

    def _run(self):
        try:
            self.obj = self._fn()
        except BaseException as e:  # re-raised by wait()
            self.exc = e
        self._fn = None

    def _finish(self):
        if self.fields is None:
            self.fields = (ANY_SOURCE_, ANY_TAG, 0, 0, False)
        if self.exc is not None:
            exc, self.exc = self.exc, None
            raise exc

    def test(self):
        if self.thread.is_alive():
            return False
        self.thread.join()
        self._finish()
        return True

    def wait(self):
        while self.thread.is_alive():
            self.thread.join(0.5)
        self._finish()

    def cancel(self):
        pass

    def free(self):
        pass


ANY_SOURCE_ = -2


def _fill(status, fields):
    if status is not None and fields is not None:
        status._fill(*fields)


def _raise_status_error(fields):
    if fields is not None and fields[2]:
        raise_error(fields[2], _ENGINE_ERROR_TEXT.get(fields[2]))


_ENGINE_ERROR_TEXT = {cls: what for cls, what in _ENGINE_ERRORS.values()}


def _raise_engine(code, what):
    raise engine_exception(_engine.EngineError(code, what))


def _park(addr, keep):
    """A fast-path operation (``_engine.fast.Op``) dropped while its request
    is pending: the engine finishes it with its buffer kept alive."""
    _engine.EngineRequest(None, _engine._cast("erdma_req *", addr), keep).free()


#: the operation of Isend/Irecv requests posted in one C call (see
#: erdma_pyfast.c): test/wait/cancel/free and fields as _EngineOp's
_FastOp = None
if _engine.fast is not None:
    _FastOp = _engine.fast.Op
    _engine.fast.configure({code: cls for code, (cls, _) in _ENGINE_ERRORS.items()},
                           _raise_engine, _park, ANY_SOURCE_, ANY_TAG, UNDEFINED, ERR_OTHER)


def raise_status_code(code):
    """Raise what a request completed with ERDMA_ERR_* ``code`` raises in
    Wait (the blocking calls that make no request use it)."""
    _raise_status_error((None, None, error_class(code)))


_handle_new = HandleBase.__new__


class Request(HandleBase):
    """Communication request, as ``MPI.Request``."""

    # _start: a persistent request's operation factory (see Prequest); any
    # request object may share a persistent handle, as Request(prequest)
    __slots__ = ("_op", "_predef", "_start", "_inactive", "__weakref__")

    def __new__(cls, *args, **kwargs):
        # subclasses may override __new__ and pass the object to copy, as
        # with mpi4py's types; __init__ takes it
        return super().__new__(cls)

    def __init__(self, request=None):
        self._predef = False
        self._op = None
        self._start = None
        self._inactive = True
        if request is not None:
            if not isinstance(request, Request):
                raise TypeError(f"expected {type(self).__name__}, "
                                f"got {type(request).__name__}")
            self._op = request._op
            self._start = getattr(request, "_start", None)
            self._inactive = getattr(request, "_inactive", True)

    @classmethod
    def _new(cls, op):
        # Request's own __new__ only hands over to the handle type's
        req = _handle_new(cls) if cls is Request else cls.__new__(cls)
        req._predef = False
        req._op = op
        req._start = None
        return req

    def _key(self):
        # what identifies the MPI handle (None: null): a persistent request
        # stays allocated until Free, others until completed
        start = getattr(self, "_start", None)
        if start is not None:
            return start
        op = self._op
        if op is None and self._h and self._adopt():
            return self._key()
        return op

    def _adopt(self):
        """Take the request named by a handle written into this object.

        The handle was written into this null object's memory (see the
        module docstring); False when it names no live request.
        """
        h = self._h
        if not h or self._op is not None or getattr(self, "_start", None) is not None:
            return False
        orig = _by_handle.get(h)
        if orig is None or orig is self:
            return False
        start = getattr(orig, "_start", None)
        key = start if start is not None else orig._op
        if key is None or (id(key) & 0x7FFFFFFF) != h:
            return False
        self._op, self._start = orig._op, start
        self._inactive = getattr(orig, "_inactive", True)
        return True

    def __eq__(self, other):
        if not isinstance(other, Request):
            return NotImplemented
        a, b = self._key(), other._key()
        if a is None or b is None:
            return a is None and b is None
        return a is b

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # unhashable, as mpi4py's

    def __bool__(self):
        return self._key() is not None

    def __repr__(self):
        return f"<{type(self).__name__} {'active' if self._key() is not None else 'null'}>"

    def __reduce__(self):
        if self._predef:
            return "REQUEST_NULL"
        if self._key() is None:
            return (type(self), ())
        raise ValueError(f"cannot serialize {self!r}")

    # Private

    def _done(self, status):
        """Completed: fill ``status``, deallocate, raise the status error."""
        op = self._op
        fields = op.fields
        if status is not None and fields is not None:
            # MPI_Wait/Test/Recv leave MPI_ERROR alone (MPICH); the error is raised
            status._fill(*fields[:2], None, *fields[3:])
        self._release()
        _raise_status_error(fields)
        return op.obj

    def _release(self):
        self._op = None
        if _named:
            self._h = 0     # the null handle, in memory too (see _named)

    def _empty(self, status):
        if status is not None:
            status._fill(ANY_SOURCE_, ANY_TAG, 0, 0, False)

    # Completion: one request

    def Wait(self, status=None):
        """Wait for completion; the request becomes null."""
        op = self._op
        if type(op) is _FastOp and status is None:
            # the one-call path's operation, without a status: the usual end
            # inline (an error goes the general way below)
            op.wait()
            if not op.fields[2]:
                self._op = None
                if _named:
                    self._h = 0
                return True
        if op is None:
            if self._h and self._adopt():
                return self.Wait(status)
            self._empty(status)
        else:
            op.wait()
            self._done(status)
        return True

    def Test(self, status=None):
        """Test for completion; if complete, the request becomes null."""
        return Request.test(self, status)[0]

    def Get_status(self, status=None):
        """Test for completion without deallocating."""
        op = self._op
        if op is None:
            if self._h and self._adopt():
                return self.Get_status(status)
            self._empty(status)
            return True
        if not op.test():
            return False
        _fill(status, op.fields)
        return True

    def wait(self, status=None):
        """Wait for completion and return the received object (or None)."""
        op = self._op
        if op is None:
            if self._h and self._adopt():
                return self.wait(status)
            self._empty(status)
            return None
        op.wait()
        return self._done(status)

    def test(self, status=None):
        """Test for completion: ``(flag, obj)``, whether complete and the object received."""
        op = self._op
        if op is None:
            if self._h and self._adopt():
                return self.test(status)
            self._empty(status)
            return True, None
        if not op.test():
            return False, None
        return True, self._done(status)

    def get_status(self, status=None):
        """Test for completion without freeing the request (as `Get_status`)."""
        return self.Get_status(status)

    def Cancel(self):
        """Cancel a pending request; it must still be waited for."""
        if self._op is None and self._h:
            self._adopt()
        if self._op is None and self._predef:
            raise_error(ERR_REQUEST, "cannot cancel REQUEST_NULL")
        if self._op is not None:
            self._op.cancel()

    cancel = Cancel

    def Free(self):
        """Deallocate; a pending operation still completes in the background."""
        op = self._op
        if op is None:
            if self._h and self._adopt():
                return self.Free()
            if self._predef:
                raise_error(ERR_REQUEST, "cannot free REQUEST_NULL")
            self._start = None
            self._h = 0
            return
        op.free()
        self._op = None
        self._start = None
        self._h = 0

    def free(self):
        """Call Free if not null (safe on REQUEST_NULL and freed requests)."""
        if self:
            self.Free()

    # Completion: many requests

    @classmethod
    def Waitall(cls, requests, statuses=None):
        """Wait for all requests; fills ``statuses`` (a list) when given."""
        if statuses is None and type(requests) is list:
            start = _end_fast(requests, _GLOBALS, MPIException, _DoneOp)
            if start < len(requests):
                cls._waitall_rest(requests, None, start)
        else:
            cls.waitall(requests, statuses)
        return True

    @classmethod
    def waitall(cls, requests, statuses=None):
        """Wait for all the requests; returns the list of the objects received."""
        requests = list(requests)
        start = 0
        if statuses is None:
            start = _end_fast(requests, _GLOBALS, MPIException, _DoneOp)
            if start == len(requests):
                return [None] * start
        return cls._waitall_rest(requests, statuses, start)

    @classmethod
    def _waitall_rest(cls, requests, statuses, start):
        """Wait for ``requests`` (a list) from index ``start`` on.

        The ones before were ended by _end_inline; returns as waitall."""
        errors = []
        objs = [None] * start
        sts = _statuses(statuses, len(requests))
        for i, req in enumerate(requests):
            if i < start:
                continue
            st = sts[i] if sts is not None else None
            if errors:
                # MPICH stops at the first failed request: the rest stay active
                # and their statuses say MPI_ERR_PENDING
                objs.append(None)
                if st is not None:
                    st._error = ERR_PENDING
                continue
            try:
                objs.append(req.wait(st))
            except MPIException as e:
                objs.append(None)
                errors.append(e)
                if st is not None:
                    st._error = e.Get_error_class()
        if errors:
            if len(requests) == 1:
                raise errors[0]
            raise_error(ERR_IN_STATUS, f"{len(errors)} request(s) failed: {errors[0]}")
        return objs

    @classmethod
    def Testall(cls, requests, statuses=None):
        """Test for the completion of all the requests (True only if all are done)."""
        return cls.testall(requests, statuses)[0]

    @classmethod
    def testall(cls, requests, statuses=None):
        """Test for the completion of all the requests: (flag, objects received or None)."""
        requests = list(requests)
        for req in requests:
            op = req._op
            if op is None and req._h and req._adopt():
                op = req._op
            if op is not None and not op.test():
                return False, None
        return True, cls.waitall(requests, statuses)

    @classmethod
    def Waitany(cls, requests, status=None):
        """Wait for any of the requests; returns its index (`UNDEFINED`: none active)."""
        return cls.waitany(requests, status)[0]

    @classmethod
    def waitany(cls, requests, status=None):
        """Wait for any request: ``(index, obj)``.

        The index is UNDEFINED when every request is null.
        """
        requests = list(requests)
        _block_any(requests)
        index, _, obj = cls.testany(requests, status)
        return index, obj

    @classmethod
    def Testany(cls, requests, status=None):
        """Test for the completion of any of the requests: (index, flag)."""
        index, flag, _ = cls.testany(requests, status)
        return index, flag

    @classmethod
    def testany(cls, requests, status=None):
        """Test for the completion of any request: ``(index, flag, obj)``."""
        requests = list(requests)
        active = [i for i, r in enumerate(requests)
                  if r._op is not None or (r._h and r._adopt())]
        if not active:
            if status is not None:
                status._fill(ANY_SOURCE_, ANY_TAG, 0, 0, False)
            return UNDEFINED, True, None
        for i in active:
            if requests[i]._op.test():
                return i, True, requests[i]._done(status)
        return UNDEFINED, False, None

    @classmethod
    def Waitsome(cls, requests, statuses=None):
        """Wait for some of the requests; returns the indices of those completed."""
        return cls.waitsome(requests, statuses)[0]

    @classmethod
    def waitsome(cls, requests, statuses=None):
        """Wait for some requests: ``(indices, objs)``.

        ``(None, None)`` when every request is null.
        """
        requests = list(requests)
        _block_any(requests)
        return cls.testsome(requests, statuses)

    @classmethod
    def Testsome(cls, requests, statuses=None):
        """Test for the completion of some of the requests; returns the indices completed."""
        return cls.testsome(requests, statuses)[0]

    @classmethod
    def testsome(cls, requests, statuses=None):
        """Test for some of the requests: (indices completed, objects received)."""
        requests = list(requests)
        if all(r._op is None and not (r._h and r._adopt()) for r in requests):
            return None, None
        _adopt_all(requests)
        indices, objs, done = [], [], []
        for i, req in enumerate(requests):
            if req._op is not None and req._op.test():
                indices.append(i)
                st = Status() if statuses is not None else None
                objs.append(req._done(st))
                done.append(st)
        if statuses is not None:
            # one status per completed request, in the order of ``indices``
            sts = _statuses(statuses, len(done))
            for k, st in enumerate(done):
                sts[k]._copy_from(st)
        return indices, objs

    @classmethod
    def Get_status_all(cls, requests, statuses=None):
        """Whether all the requests are complete, without freeing them."""
        sts = _statuses(statuses, len(requests))
        flags = [r.Get_status(sts[i] if sts is not None else None)
                 for i, r in enumerate(requests)]
        return all(flags)

    @classmethod
    def Get_status_any(cls, requests, status=None):
        """Test any of the requests without freeing it: (index, flag)."""
        requests = list(requests)
        if all(r._op is None and not (r._h and r._adopt()) for r in requests):
            if status is not None:
                status._fill(ANY_SOURCE_, ANY_TAG, 0, 0, False)
            return UNDEFINED, True
        _adopt_all(requests)
        for i, r in enumerate(requests):
            if r._op is not None and r.Get_status(status):
                return i, True
        return UNDEFINED, False

    @classmethod
    def Get_status_some(cls, requests, statuses=None):
        """The indices of the complete requests, without freeing them."""
        requests = list(requests)
        if all(r._op is None and not (r._h and r._adopt()) for r in requests):
            return None
        _adopt_all(requests)
        sts = _statuses(statuses, len(requests))
        return [i for i, r in enumerate(requests)
                if r._op is not None and r.Get_status(sts[i] if sts is not None else None)]

    get_status_all = Get_status_all
    get_status_any = Get_status_any
    get_status_some = Get_status_some

    def py2f(self):
        """The Fortran integer handle of the request.

        Also stored in the object's memory (``_h``).
        """
        key = self._key()
        if key is None:
            self._h = 0
            return 0
        global _named
        h = id(key) & 0x7FFFFFFF
        _by_handle[h] = self    # so that fromhandle finds the operation again
        self._h = h
        _named = True
        return h

    _sync_handle = py2f

    @classmethod
    def f2py(cls, arg):
        """A new ``cls`` object over the request whose handle is ``arg``."""
        h = int(arg)
        req = cls.__new__(cls)
        Request.__init__(req)
        if h == 0:
            return req
        orig = _by_handle.get(h)
        if orig is None or orig._key() is None or (id(orig._key()) & 0x7FFFFFFF) != h:
            raise_error(ERR_REQUEST, f"invalid request handle {h:#x}")
        Request.__init__(req, orig)
        return req

    fromhandle = f2py
    fromint = f2py

    def toint(self):
        """The integer handle of the request."""
        return self.py2f()

    @property
    def handle(self):
        return self.py2f()


# requests whose handle was asked for (py2f/handle/toint), by handle
_by_handle = weakref.WeakValueDictionary()
# whether any request handle was made: until then every request's handle
# memory holds 0 (null), so completion need not write it (a slot write
# costs a completed request more than this test)
_named = False


def _end_inline(requests):
    """End the requests of ``requests`` (a list) that the one-call path
    completes without an error, and those complete from the start, from
    the first on: how many.  The first other one is left to the general
    loop (_waitall_rest), which reports its error."""
    start = 0
    for req in requests:
        op = req._op
        t = type(op)
        if t is _FastOp:
            try:
                op.wait()
            except MPIException:
                break
            if op.fields[2]:
                break
        elif t is not _DoneOp or op.obj is not None:
            break
        req._op = None
        if _named:
            req._h = 0
        start += 1
    return start


def _end_inline_args(requests, names, exc, done):
    """_end_inline with the arguments of erdma_pyfast.c's end_inline."""
    return _end_inline(requests)


# the C loop when there is one; it reads _named from this module's globals
_end_fast = getattr(_engine.fast, "end_inline", _end_inline_args)
_GLOBALS = globals()
if hasattr(_engine.fast, "Waitall"):
    # Waitall itself in C: the common call (a list, no statuses) costs no
    # Python frame; any other goes to the method above, kept as _waitall_py
    Request._waitall_py = Request.__dict__["Waitall"]
    _engine.fast.waitall_setup(_GLOBALS, MPIException, _DoneOp)
    Request.Waitall = classmethod(_engine.fast.Waitall)


def _adopt_all(requests):
    """Null requests holding a written handle take their request (see the
    module docstring): for the list calls that read ``_op`` directly."""
    for r in requests:
        if r._op is None and r._h:
            r._adopt()


def _block_any(requests):
    """Block until one active request has completed (or none is active)."""
    _adopt_all(requests)
    while True:
        ops = [r._op for r in requests if r._op is not None]
        if not ops:
            return
        for op in ops:
            if op.test():
                return
        if all(type(op) is _FastOp or isinstance(op, _EngineOp) for op in ops):
            try:
                _engine.waitany([op.handle if type(op) is _FastOp else op.ereq for op in ops])
            except _engine.EngineError as e:
                raise engine_exception(e) from None
        else:
            time.sleep(0.0005)


def _statuses(statuses, n):
    """Grow a user's status list to ``n`` entries (as mpi4py does)."""
    if statuses is None:
        return None
    if not isinstance(statuses, list):
        # another sequence is not grown: its statuses come first, then scratch ones
        statuses = list(statuses)
    while len(statuses) < n:
        statuses.append(Status())
    return statuses


class Prequest(Request):
    """Persistent request: ``Start()`` runs the operation again."""

    __slots__ = ()

    def __init__(self, request=None):
        super().__init__(request)
        # a non-null handle must be a persistent request (mpi4py's <Prequest?> check)
        if request is not None and self and not isinstance(request, Prequest):
            raise TypeError(f"Cannot convert {type(request).__module__}."
                            f"{type(request).__name__} to erdmampi.MPI.Prequest")

    @classmethod
    def _persistent(cls, start):
        req = cls.__new__(cls)
        req._predef = False
        req._op = None
        req._start = start
        req._inactive = True
        return req

    def _release(self):
        self._op = None   # inactive, still allocated

    def Start(self):
        """Start the persistent operation."""
        if getattr(self, "_start", None) is None and not (self._h and self._adopt()):
            raise_error(ERR_REQUEST, "invalid persistent request")
        if self._op is not None:
            raise_error(ERR_REQUEST, "persistent request is already active")
        self._op = self._start()

    @classmethod
    def Startall(cls, requests):
        """Start a list of persistent requests."""
        for r in requests:
            r.Start()

    # Partitioned communication (Comm.Psend_init / Precv_init)

    def _partitioned(self):
        op = self._op
        if op is None or not hasattr(op, "pready"):
            raise_error(ERR_REQUEST, "not an active partitioned request")
        return op

    def Pready(self, partition):
        """Mark a partition of a partitioned send as ready."""
        self._partitioned().pready((partition,))

    def Pready_range(self, partition_low, partition_high):
        """Mark the partitions ``partition_low`` to ``partition_high`` (included) as ready."""
        self._partitioned().pready(range(int(partition_low), int(partition_high) + 1))

    def Pready_list(self, partitions):
        """Mark a list of partitions as ready."""
        self._partitioned().pready(list(partitions))

    def Parrived(self, partition):
        """Whether a partition of a partitioned receive has arrived."""
        return bool(self._partitioned().parrived(partition))

    def Free(self):
        """Free the persistent request."""
        if self._op is None and getattr(self, "_start", None) is None and self._h:
            self._adopt()
        if self._op is not None:
            self._op.free()
        self._op = None
        self._start = None
        self._h = 0

    free = Free


REQUEST_NULL = Request()
REQUEST_NULL._predef = True

from .grequest import Grequest  # noqa: E402,F401  (it builds on Request)
