"""The ``multiprocessing.pool`` interface over ``erdmampi.futures`` (as ``mpi4py.util.pool``)."""

import functools as _functools
import operator as _operator
import os as _os
import threading as _threading
import warnings as _warnings
import weakref as _weakref

from .. import futures as _futures

__all__ = ["Pool", "ThreadPool", "AsyncResult", "ApplyResult", "MapResult"]


class Pool:
    """Pool using MPI processes as workers."""

    Executor = _futures.MPIPoolExecutor

    def __init__(self, processes=None, initializer=None, initargs=(), **kwargs):
        """Initialize a new Pool instance.

        Other keyword arguments go to the executor; ``maxtasksperchild`` and
        ``context`` are not supported and warn (``UserWarning``) unless None.
        """
        if processes is not None and processes < 1:
            raise ValueError("number of processes must be at least 1")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        for name in ("maxtasksperchild", "context"):
            if kwargs.pop(name, None) is not None:
                _warnings.warn(f"argument {name!r} is not supported", stacklevel=2)
        self.executor = self.Executor(processes, initializer=initializer,
                                      initargs=initargs, **kwargs)

    def apply(self, func, args=(), kwds={}):  # noqa: B006
        """Call ``func(*args, **kwds)`` in a worker and return its result."""
        # pylint: disable=dangerous-default-value
        return self.executor.submit(func, *args, **kwds).result()

    def apply_async(self, func, args=(), kwds={}, callback=None,  # noqa: B006
                    error_callback=None):
        """Asynchronous `apply()` returning an `ApplyResult`."""
        # pylint: disable=too-many-arguments,too-many-positional-arguments
        # pylint: disable=dangerous-default-value
        future = self.executor.submit(func, *args, **kwds)
        return ApplyResult(future, callback, error_callback)

    def map(self, func, iterable, chunksize=None):
        """``list(map(func, iterable))`` computed by the workers in chunks."""
        iterable, chunksize = _chunksize(self, iterable, chunksize)
        return list(self.imap(func, iterable, chunksize=chunksize))

    def map_async(self, func, iterable, chunksize=None, callback=None,
                  error_callback=None):
        """Asynchronous `map()` returning a `MapResult`."""
        # pylint: disable=too-many-arguments,too-many-positional-arguments
        iterable, chunksize = _chunksize(self, iterable, chunksize)
        results = self.imap(func, iterable, chunksize=chunksize)
        future = _async_executor(self).submit(list, results)
        return MapResult(future, callback, error_callback)

    def imap(self, func, iterable, chunksize=1):
        """Like `map()` but return an iterator."""
        return self.executor.map(func, iterable, chunksize=chunksize)

    def imap_unordered(self, func, iterable, chunksize=1):
        """Like `imap()`, with results in completion order."""
        return self.executor.map(func, iterable, chunksize=chunksize, unordered=True)

    def starmap(self, func, iterable, chunksize=None):
        """``list(itertools.starmap(func, iterable))`` computed by the workers."""
        iterable, chunksize = _chunksize(self, iterable, chunksize)
        return list(self.istarmap(func, iterable, chunksize=chunksize))

    def starmap_async(self, func, iterable, chunksize=None, callback=None,
                      error_callback=None):
        """Asynchronous `starmap()` returning a `MapResult`."""
        # pylint: disable=too-many-arguments,too-many-positional-arguments
        iterable, chunksize = _chunksize(self, iterable, chunksize)
        results = self.istarmap(func, iterable, chunksize=chunksize)
        future = _async_executor(self).submit(list, results)
        return MapResult(future, callback, error_callback)

    def istarmap(self, func, iterable, chunksize=1):
        """Like `starmap()` but return an iterator."""
        return self.executor.starmap(func, iterable, chunksize=chunksize)

    def istarmap_unordered(self, func, iterable, chunksize=1):
        """Like `istarmap()`, with results in completion order."""
        return self.executor.starmap(func, iterable, chunksize=chunksize, unordered=True)

    def close(self):
        """Accept no more tasks."""
        self.executor.shutdown(wait=False)

    def terminate(self):
        """Stop without completing the pending tasks."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    def join(self):
        """Wait for the workers to finish."""
        self.executor.shutdown(wait=True)
        _async_executor_shutdown(self)

    def __enter__(self):
        return self

    def __exit__(self, *args):
        self.close()


class ThreadPool(Pool):
    """Pool using threads as workers."""

    Executor = _futures.ThreadPoolExecutor


class AsyncResult:
    """Result of an asynchronous call."""

    def __init__(self, future, callback=None, error_callback=None):
        self.future = future
        self._event = _threading.Event()
        future.add_done_callback(_functools.partial(
            _on_done, event=self._event, callback=callback, error_callback=error_callback))

    def get(self, timeout=None):
        """The result (or the call's exception raised), waiting up to
        ``timeout`` seconds; `TimeoutError` if not ready."""
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError
        try:
            return self.future.result()
        except _futures.CancelledError:
            raise TimeoutError from None

    def wait(self, timeout=None):
        """Wait until the result is available or ``timeout`` seconds pass."""
        self._event.wait(timeout)

    def ready(self):
        """Whether the call has completed."""
        return self._event.is_set()

    def successful(self):
        """Whether the call completed without raising (`ValueError` if not ready)."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        try:
            return self.future.exception() is None
        except _futures.CancelledError:
            return False


class ApplyResult(AsyncResult):
    """Result type of `apply_async()`."""


class MapResult(AsyncResult):
    """Result type of `map_async()` and `starmap_async()`."""


def _chunksize(pool, iterable, chunksize):
    """The default chunk size: about four chunks per worker."""
    if chunksize is not None:
        return iterable, chunksize
    chunksize = 1
    workers = getattr(pool.executor, "_max_workers", 0)
    if workers > 0:
        ntasks = _operator.length_hint(iterable)
        if ntasks == 0:
            iterable = list(iterable)
            ntasks = len(iterable)
        if ntasks > 0:
            quot, rem = divmod(ntasks, workers * 4)
            chunksize = quot + bool(rem)
    return iterable, chunksize


def _on_done(future, event, callback, error_callback):
    try:
        exception = future.exception()
    except _futures.CancelledError:
        exception = TimeoutError()
    try:
        if exception is not None:
            if error_callback is not None:
                error_callback(exception)
        elif callback is not None:
            callback(future.result())
    finally:
        event.set()


_cpu_count = getattr(_os, "process_cpu_count", _os.cpu_count)
_async_lock = _threading.Lock()
_async_executors = _weakref.WeakKeyDictionary()   # pool -> ThreadPoolExecutor


def _async_executor(pool):
    """The threads that drain the iterators of ``*_async`` calls."""
    with _async_lock:
        executor = _async_executors.get(pool)
        if executor is None:
            workers = getattr(pool, "_async_max_workers", 0) or min(4, _cpu_count() or 1)
            executor = _async_executors[pool] = _futures.ThreadPoolExecutor(workers)
    return executor


def _async_executor_shutdown(pool, wait=True):
    with _async_lock:
        executor = _async_executors.pop(pool, None)
    if executor is not None:
        executor.shutdown(wait=wait)
