"""Executors of ``erdmampi.futures``: MPIPoolExecutor and friends."""

import collections
import functools
import itertools
import threading
import time
import weakref

from . import _core
from ._base import Executor, Future, as_completed


class MPIPoolExecutor(Executor):
    """MPI-based asynchronous executor."""

    Future = Future

    def __init__(self, max_workers=None, initializer=None, initargs=(), **kwargs):
        """Initialize a new MPIPoolExecutor instance.

        Args:
            max_workers: The maximum number of worker processes (threads for
                ``ThreadPoolExecutor``).
            initializer: A callable used to initialize workers.
            initargs: A tuple of arguments to pass to the initializer.

        Keyword Args:
            globals, main, path, wdir, env: set up the workers (as mpi4py).
            backoff: polling interval in seconds.
        """
        if max_workers is not None:
            max_workers = int(max_workers)
            if max_workers <= 0:
                raise ValueError("max_workers must be greater than 0")
            kwargs["max_workers"] = max_workers
        if initializer is not None:
            if not callable(initializer):
                raise TypeError("initializer must be a callable")
            kwargs["initializer"] = initializer
            kwargs["initargs"] = tuple(initargs)
        self._options = kwargs
        self._shutdown = False
        self._broken = None
        self._lock = threading.Lock()
        self._pool = None

    _make_pool = staticmethod(_core.WorkerPool)

    def _bootstrap(self):
        if self._pool is None:
            self._pool = self._make_pool(self)

    @property
    def _max_workers(self):
        return self.num_workers

    @property
    def num_workers(self):
        """Number of workers."""
        with self._lock:
            if self._broken or self._shutdown:
                return 0
            self._bootstrap()
            self._pool.wait()
            return self._pool.size

    def bootup(self, wait=True):
        """Allocate executor resources eagerly."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot bootup after shutdown")
            self._bootstrap()
            if wait:
                self._pool.wait()
            return self

    def submit(self, fn, /, *args, **kwargs):
        """Schedule ``fn(*args, **kwargs)`` and return a `Future`."""
        with self._lock:
            if self._broken:
                raise _core.BrokenExecutor(self._broken)
            if self._shutdown:
                raise RuntimeError("cannot submit after shutdown")
            self._bootstrap()
            future = self.Future()
            self._pool.push((future, (fn, args, kwargs)))
            return future

    def map(self, fn, *iterables, timeout=None, chunksize=1, buffersize=None,
            unordered=False):
        """Return an iterator equivalent to ``map(fn, *iterables)``."""
        # pylint: disable=too-many-arguments
        return self.starmap(fn, zip(*iterables), timeout, chunksize, buffersize, unordered)

    def starmap(self, fn, iterable, timeout=None, chunksize=1, buffersize=None,
                unordered=False):
        """Return an iterator equivalent to ``itertools.starmap(fn, iterable)``."""
        # pylint: disable=too-many-arguments,too-many-positional-arguments
        if chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        if buffersize is not None:
            if not isinstance(buffersize, int):
                raise TypeError("buffersize must be an integer or None")
            if buffersize < 1:
                raise ValueError("buffersize must be None or > 0")
            if unordered:
                raise ValueError("buffersize must be None if unordered")
        if chunksize == 1:
            return _starmap(self, fn, iterable, timeout, buffersize, unordered)
        chunks = _chunks(iterable, chunksize)
        results = _starmap(self, functools.partial(_apply_chunk, fn), chunks,
                           timeout, buffersize, unordered)
        return itertools.chain.from_iterable(results)

    def shutdown(self, wait=True, *, cancel_futures=False):
        """Clean up the resources associated with the executor."""
        with self._lock:
            if not self._shutdown:
                self._shutdown = True
                if self._pool is not None:
                    self._pool.done()
            if cancel_futures and self._pool is not None:
                self._pool.cancel()
            pool = None
            if wait:
                pool, self._pool = self._pool, None
        if pool is not None:
            pool.join()


def _apply_chunk(fn, chunk):
    return list(itertools.starmap(fn, chunk))


def _chunks(iterable, size):
    iterable = iter(iterable)
    while chunk := tuple(itertools.islice(iterable, size)):
        yield (chunk,)


def _starmap(executor, fn, iterable, timeout, buffersize, unordered):
    """Submit ``fn(*args)`` for each item (at most ``buffersize`` ahead of
    the consumer) and return the iterator over the results."""
    # pylint: disable=too-many-arguments,too-many-positional-arguments
    end = None if timeout is None else time.monotonic() + timeout
    iterable = iter(iterable)
    if buffersize is not None:
        pending = collections.deque(executor.submit(fn, *args)
                                    for args in itertools.islice(iterable, buffersize))
    else:
        pending = collections.deque(executor.submit(fn, *args) for args in iterable)
    # the iterator must not keep the executor alive
    exref = weakref.ref(executor)
    del executor

    def left():
        return None if end is None else end - time.monotonic()

    def results():
        try:
            if unordered:
                waiting = set(pending)
                for future in as_completed(waiting, left()):
                    waiting.discard(future)
                    pending.remove(future)
                    yield future.result()
                return
            while pending:
                future = pending.popleft()
                try:
                    result = future.result(left())
                finally:
                    future.cancel()
                del future
                if buffersize is not None:
                    ex = exref()
                    args = next(iterable, None) if ex is not None else None
                    if args is not None:
                        pending.append(ex.submit(fn, *args))
                    del ex
                yield result
        finally:
            while pending:
                pending.pop().cancel()

    return results()


class MPICommExecutor:
    """Context manager making the ranks of ``comm`` but ``root`` its workers.

    The ``with`` target is an `MPIPoolExecutor` at the root and ``None`` at
    the workers, which serve tasks inside ``__enter__`` until the root exits::

        with MPICommExecutor(MPI.COMM_WORLD, root=0) as executor:
            if executor is not None:
                executor.map(...)
    """

    def __init__(self, comm=None, root=0, **kwargs):
        """Initialize a new MPICommExecutor instance.

        Raises:
            ValueError: If ``comm`` is an intercommunicator or ``root`` is
                not in ``range(comm.size)``.
        """
        if comm is None:
            comm = _core.MPI.COMM_WORLD
        if comm.Is_inter():
            raise ValueError("expecting an intracommunicator")
        if root < 0 or root >= comm.Get_size():
            raise ValueError("expecting root in range(comm.size)")
        if _core.SharedPool is not None:
            comm = _core.MPI.COMM_WORLD
            root = comm.Get_rank()
        self._comm = comm
        self._root = root
        self._options = kwargs
        self._executor = None

    def __enter__(self):
        """Return the `MPIPoolExecutor` at the root, ``None`` elsewhere."""
        if self._executor is not None:
            raise RuntimeError("__enter__")
        executor = None
        if self._comm.Get_rank() == self._root:
            executor = MPIPoolExecutor(**self._options)
        _core._comm_executor_helper(executor, self._comm, self._root)
        self._executor = executor
        return executor

    def __exit__(self, *args):
        """Shut the executor down at the root."""
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
            return False
        return True


class ThreadPoolExecutor(MPIPoolExecutor):
    """`MPIPoolExecutor` subclass using a pool of threads."""

    _make_pool = staticmethod(_core.ThreadPool)


class ProcessPoolExecutor(MPIPoolExecutor):
    """`MPIPoolExecutor` subclass using spawned processes (not available)."""

    _make_pool = staticmethod(_core.SpawnPool)


def get_comm_workers():
    """The intracommunicator grouping the worker processes (in a task)."""
    return _core.get_comm_server()
