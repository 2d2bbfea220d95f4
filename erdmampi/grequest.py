"""Generalized requests (``MPI.Grequest``): operations the application
completes itself, with its query, free and cancel callbacks (MPI 4.0 13.2).

As in mpi4py, an exception raised by a callback is printed to stderr and
turns into an MPI error: its class for ``MPI.Exception``, ``ERR_OTHER`` for
anything else, raised by the call that ran the callback.
"""

import sys
import threading
import traceback

from .exceptions import ERR_OTHER, Exception as MPIException, SUCCESS
from .request import Request
from .status import Status

__all__ = ["Grequest"]

ANY_SOURCE = -2
ANY_TAG = -1


def _error_class(exc):
    if isinstance(exc, MPIException):
        return exc.Get_error_class()
    return ERR_OTHER


def _call(fn, *args, **kwargs):
    """Run a user callback; (SUCCESS or the error class, printed)."""
    try:
        fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001  (any user error becomes an MPI error)
        traceback.print_exc(file=sys.stderr)
        return _error_class(exc)
    return SUCCESS


class _GreqOp:
    """The operation behind a Grequest (the request protocol of request.py)."""

    persistent = False

    def __init__(self, query_fn, free_fn, cancel_fn, args, kwargs):
        self.query_fn, self.free_fn, self.cancel_fn = query_fn, free_fn, cancel_fn
        self.args, self.kwargs = tuple(args or ()), dict(kwargs or {})
        self.event = threading.Event()
        self.result = None          # complete(obj)
        self.fields = None          # set once, at the first completed test
        self.obj = None
        self.freed = False

    def complete(self, obj=None):
        self.result = obj
        self.event.set()

    def _finish(self):
        status = Status()
        status._fill(ANY_SOURCE, ANY_TAG, SUCCESS, 0, False)
        err = SUCCESS
        if self.query_fn is not None:
            err = _call(self.query_fn, status, *self.args, **self.kwargs)
        ferr = self._run_free()
        err = err or ferr
        self.fields = (status._source, status._tag, err or status._error,
                       status._nbytes, status._cancelled)
        self.obj = self.result

    def _run_free(self):
        if self.freed:
            return SUCCESS
        self.freed = True
        if self.free_fn is None:
            return SUCCESS
        return _call(self.free_fn, *self.args, **self.kwargs)

    def test(self):
        if self.fields is not None:
            return True
        if not self.event.is_set():
            return False
        self._finish()
        return True

    def wait(self):
        self.event.wait()
        self.test()

    def cancel(self):
        if self.cancel_fn is None:
            return
        err = _call(self.cancel_fn, self.event.is_set(), *self.args, **self.kwargs)
        if err:
            raise MPIException(err)

    def free(self):
        err = self._run_free()
        if err:
            raise MPIException(err)


class Grequest(Request):
    """Generalized request."""

    __slots__ = ()

    def __init__(self, request=None):
        super().__init__(request)
        if request is not None and self and not isinstance(request, Grequest):
            raise TypeError(f"Cannot convert {type(request).__module__}."
                            f"{type(request).__name__} to erdmampi.MPI.Grequest")

    @classmethod
    def Start(cls, query_fn=None, free_fn=None, cancel_fn=None, args=None, kwargs=None):
        """Start a request the caller completes with :meth:`Complete`."""
        for name, fn in (("query_fn", query_fn), ("free_fn", free_fn),
                         ("cancel_fn", cancel_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{name} must be callable or None")
        return cls._new(_GreqOp(query_fn, free_fn, cancel_fn, args, kwargs))

    def Complete(self):
        """Notify that the operation is complete."""
        op = self._op
        if not isinstance(op, _GreqOp):
            from .exceptions import ERR_REQUEST, raise_error
            raise_error(ERR_REQUEST, "not an active generalized request")
        op.complete()

    def complete(self, obj=None):
        """Complete with ``obj``, what ``wait()``/``test()`` return."""
        op = self._op
        if not isinstance(op, _GreqOp):
            from .exceptions import ERR_REQUEST, raise_error
            raise_error(ERR_REQUEST, "not an active generalized request")
        op.complete(obj)
