"""Worker management behind the executors of ``erdmampi.futures``.

An executor owns a :class:`Pool`: a task queue drained by a manager thread.
The manager either runs tasks in local threads (``ThreadPool``) or ships them
to worker processes over a private communicator: under
``python -m erdmampi.futures`` the ranks other than 0 of ``COMM_WORLD`` form a
pool shared by every executor of rank 0 (``SharedPoolCtx``), and
``MPICommExecutor`` turns the non-root ranks of a communicator into workers.
Workers started with ``Spawn`` are not available.

Protocol (lowercase p2p on a duplicate communicator, one tag per executor):
the manager sends ``(fn, args, kwargs)`` or a :class:`_Control` message; the
worker answers ``(result, exception)`` with the same tag; ``None`` stops it.
"""

import collections
import itertools
import os
import runpy
import sys
import threading
import time
import traceback
import types
import weakref

from .. import MPI
from ._base import BrokenExecutor

# -- small utilities -------------------------------------------------------------

BACKOFF = 0.001


def _getopt_backoff(options):
    value = options.get("backoff")
    if value is None:
        value = os.environ.get("MPI4PY_FUTURES_BACKOFF", BACKOFF)
    return float(value)


class Backoff:
    """Sleep for exponentially growing periods while polling."""

    def __init__(self, seconds=BACKOFF):
        self.tmax = max(float(seconds), 0.0)
        self.tmin = self.tmax / 1024
        self.tval = 0.0

    def reset(self):
        self.tval = 0.0

    def sleep(self):
        time.sleep(self.tval)
        self.tval = min(self.tmax, max(self.tmin, self.tval * 2))


class TaskQueue:
    """FIFO of ``(future, task)`` items (``None`` ends it) with a blocking get."""

    def __init__(self):
        self._items = collections.deque()
        self._cond = threading.Condition(threading.Lock())

    def __len__(self):
        return len(self._items)

    def __bool__(self):
        return bool(self._items)

    def put(self, item):
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def add(self, item):
        with self._cond:
            self._items.appendleft(item)
            self._cond.notify()

    def pop(self):
        """Next item; LookupError when empty."""
        with self._cond:
            return self._items.popleft()

    def get(self, timeout=None):
        """Next item, waiting for one; LookupError after ``timeout``."""
        with self._cond:
            if not self._items:
                self._cond.wait(timeout)
            return self._items.popleft()


class RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker."""


def _unwrap_exc(exc, tb):
    exc.__cause__ = RemoteTraceback(tb)
    return exc


class _ExceptionWrapper(Exception):
    # unpickles as the original exception with the worker traceback as cause
    def __reduce__(self):
        return _unwrap_exc, self.args


def _remote_exception(comm):
    exc = sys.exception()
    body = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    where = f"### Worker {comm.Get_rank()} of {comm.Get_size()} on {MPI.Get_processor_name()}\n"
    exc.__cause__ = exc.__context__ = exc.__traceback__ = None
    return _ExceptionWrapper(exc, f'\n{where}"""\n{body}"""')


def _unsupported(what):
    raise MPI.Exception(MPI.ERR_UNSUPPORTED_OPERATION,
                        f"{what} needs MPI dynamic processes (Spawn), which erdmampi "
                        "does not provide; run the program with "
                        "'erdmarun -n N python -m erdmampi.futures script.py' or use "
                        "MPICommExecutor")


# -- executor side: the pool and its manager threads ------------------------------

_THREADS = weakref.WeakKeyDictionary()     # manager thread -> its queue


def join_threads(threads=_THREADS):
    items = list(threads.items())
    for _, queue in items:
        queue.put(None)
    for thread, _ in items:
        thread.join()


threading._register_atexit(join_threads)


class Pool:
    """Task queue of one executor and the thread that serves it."""

    def __init__(self, executor, manager, *args):
        self.size = None
        self.event = threading.Event()
        self.queue = queue = TaskQueue()
        # the manager stops when the executor is garbage collected
        self.exref = weakref.ref(executor, lambda _, q=queue: q.put(None))
        self.thread = threading.Thread(target=manager, args=(self, executor._options, *args),
                                       daemon=False)
        self.thread.start()
        _THREADS[self.thread] = queue

    def wait(self):
        self.event.wait()

    def push(self, item):
        self.queue.put(item)

    def done(self):
        self.queue.put(None)

    def join(self):
        self.thread.join()

    def setup(self, size):
        self.size = size
        self.event.set()
        return self.queue

    def cancel(self, handler=None):
        queue = self.queue
        while True:
            try:
                item = queue.pop()
            except LookupError:
                break
            if item is None:
                queue.put(None)
                break
            future, _ = item
            if handler:
                handler(future)
            else:
                future.cancel()
                future.set_running_or_notify_cancel()

    def broken(self, message):
        executor = self.exref()
        lock = None
        if executor is not None:
            executor._broken = message
            if not executor._shutdown:
                lock = executor._lock

        def handler(future):
            if future.set_running_or_notify_cancel():
                future.set_exception(BrokenExecutor(message))

        self.event.set()
        if lock:
            lock.acquire()
        try:
            self.cancel(handler)
        finally:
            if lock:
                lock.release()


def initialize(options):
    """Run the executor's initializer; False if it raised."""
    initializer = options.pop("initializer", None)
    initargs = options.pop("initargs", ())
    initkwargs = options.pop("initkwargs", {})
    if initializer is None:
        return True
    try:
        initializer(*initargs, **initkwargs)
    except BaseException:
        return False
    return True


def _manager_thread(pool, options):
    """Run tasks in up to ``max_workers`` threads of this process."""
    size = options.pop("max_workers", 1)
    queue = pool.setup(size)
    threads = []
    ok = [None]
    init_lock = threading.Lock()

    def init():
        with init_lock:
            if ok[0] is None:
                ok[0] = initialize(options)
                if not ok[0]:
                    pool.broken("initializer failed")
            return ok[0]

    def execute(future, task):
        func, args, kwargs = task
        try:
            result = func(*args, **kwargs)
        except BaseException:
            future.set_exception(sys.exception())
        else:
            future.set_result(result)

    def worker():
        if not init():
            queue.put(None)
            return
        while True:
            try:
                item = queue.get()
            except LookupError:
                continue
            if item is None:
                queue.put(None)        # let the other threads see it
                return
            future, task = item
            if future.set_running_or_notify_cancel():
                if queue and len(threads) < size - 1:
                    thread = threading.Thread(target=worker, daemon=True)
                    threads.append(thread)
                    thread.start()
                execute(future, task)
            del future, task, item

    worker()
    for thread in threads:
        thread.join()
    try:
        queue.pop()                    # the None left for the threads
    except LookupError:
        pass


def ThreadPool(executor):  # noqa: N802
    return Pool(executor, _manager_thread)


def SpawnPool(executor):  # noqa: N802
    _unsupported("ProcessPoolExecutor")


def WorkerPool(executor):  # noqa: N802
    if SharedPool is not None:
        return SharedPool(executor)
    _unsupported("MPIPoolExecutor outside 'python -m erdmampi.futures'")


class _Control:
    """A request to workers other than a task: ``sync`` (import the main
    module, set path/cwd/env) or ``init`` (run an initializer)."""

    __slots__ = ("kind", "data")

    def __init__(self, kind, data):
        self.kind = kind
        self.data = data

    def __reduce__(self):
        return _Control, (self.kind, self.data)


def _to_all(comm, workers, msg, tag):
    """Send ``msg`` to every worker and return their answers' first items."""
    reqs = [comm.issend(msg, pid, tag) for pid in workers]
    answers = [comm.recv(None, pid, tag)[0] for pid in workers]
    MPI.Request.waitall(reqs)
    return answers


def _sync_data(options):
    """What workers need to unpickle tasks defined in the main module."""
    main = sys.modules["__main__"]
    data = {k: v for k, v in options.items()
            if k in ("path", "wdir", "env", "globals")}
    if options.pop("main", True):
        spec = getattr(main, "__spec__", None)
        if getattr(spec, "name", None) is not None:
            data["@main:mod_name"] = spec.name
        if getattr(main, "__file__", None) is not None:
            data["@main:mod_path"] = main.__file__
    return data


def _init_data(options):
    return {k: options.pop(k, v) for k, v in
            (("initializer", None), ("initargs", ()), ("initkwargs", {}))}


def client_exec(comm, options, tag, workers, queue):
    """Hand queued tasks to idle ``workers`` and complete futures from answers."""
    backoff = Backoff(_getopt_backoff(options))
    status = MPI.Status()
    pending = {}

    def recv(pid=MPI.ANY_SOURCE):
        try:
            answer = comm.recv(None, pid, tag, status)
        except BaseException:
            answer = (None, sys.exception())
        pid = status.Get_source()
        workers.append(pid)
        future, request = pending.pop(pid)
        request.wait()
        result, exception = answer
        if exception is None:
            future.set_result(result)
        else:
            future.set_exception(exception)

    def send():
        """Start one task; True when the queue has ended."""
        try:
            pid = workers.popleft()
        except IndexError:
            return False
        try:
            item = queue.pop()
        except LookupError:
            workers.appendleft(pid)
            return False
        if item is None:
            workers.appendleft(pid)
            return True
        future, task = item
        if not future.set_running_or_notify_cancel():
            workers.appendleft(pid)
            return False
        try:
            pending[pid] = (future, comm.issend(task, pid, tag))
        except BaseException:
            workers.appendleft(pid)
            future.set_exception(sys.exception())
        return False

    while True:
        if queue and workers:
            backoff.reset()
            if send():
                break
        if pending and comm.iprobe(MPI.ANY_SOURCE, tag):
            backoff.reset()
            recv()
        backoff.sleep()
    while pending:
        recv()


def _client_start(comm, options, tag, workers, sync):
    """Sync (first executor) and initialize the workers; False if broken."""
    if sync:
        _to_all(comm, workers, _Control("sync", _sync_data(options)), tag)
    init = _init_data(options)
    if init["initializer"] is None:
        return True
    return all(_to_all(comm, workers, _Control("init", init), tag))


def client_stop(comm, workers):
    for req in [comm.issend(None, pid, 0) for pid in workers]:
        req.wait()


# -- worker side -----------------------------------------------------------------

MAIN_RUN_NAME = "__worker__"


def import_main(mod_name, mod_path, init_globals, run_name=MAIN_RUN_NAME):
    """Run the manager's main module here as ``run_name`` and serve it as
    ``__main__``, so functions defined there unpickle."""
    module = types.ModuleType(run_name)
    if init_globals:
        module.__dict__.update(init_globals)
        module.__name__ = run_name
    if mod_name:
        glbs = runpy.run_module(mod_name, init_globals=init_globals, run_name=run_name)
    elif mod_path:
        if not getattr(sys.flags, "safe_path", False):
            sys.path[0] = os.path.realpath(os.path.dirname(mod_path))
        glbs = runpy.run_path(mod_path, init_globals=init_globals, run_name=run_name)
    else:
        glbs = {}
    module.__dict__.update(glbs)
    sys.modules["__main__"] = sys.modules[run_name] = module


def _server_control(msg):
    if msg.kind == "sync":
        data = dict(msg.data)
        if "path" in data:
            sys.path.extend(data.pop("path"))
        if "wdir" in data:
            os.chdir(data.pop("wdir"))
        if "env" in data:
            os.environ.update(data.pop("env"))
        import_main(data.pop("@main:mod_name", None), data.pop("@main:mod_path", None),
                    data.pop("globals", None))
        return (True, None)
    if msg.kind == "init":
        return (initialize(dict(msg.data)), None)
    return (None, ValueError(f"unknown control message {msg.kind!r}"))


def server_exec(comm):
    """Serve tasks from the manager until told to stop."""
    status = MPI.Status()
    while True:
        try:
            task = comm.recv(None, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        except BaseException:
            task = _remote_exception(comm)
        if task is None:
            break
        pid, tag = status.Get_source(), status.Get_tag()
        if isinstance(task, BaseException):
            answer = (None, task)
        elif isinstance(task, _Control):
            try:
                answer = _server_control(task)
            except BaseException:
                answer = (None, _remote_exception(comm))
        else:
            func, args, kwargs = task
            try:
                answer = (func(*args, **kwargs), None)
            except BaseException:
                answer = (None, _remote_exception(comm))
        try:
            comm.ssend(answer, pid, tag)
        except BaseException:
            comm.ssend((None, _remote_exception(comm)), pid, tag)


_comm_server = [None]


def get_comm_server():
    """The intracommunicator of the workers (in a worker), else None."""
    return _comm_server[0]


def set_comm_server(intracomm):
    _comm_server[0] = intracomm


def del_comm_server():
    _comm_server[0] = None


def comm_split(comm, root):
    """(private duplicate, intracommunicator of the non-root ranks or COMM_NULL)."""
    rank = comm.Get_rank()
    dup = comm.Dup()
    workers = comm.Split(0 if rank == root else 1, rank)
    if rank == root:
        workers.Free()
        workers = MPI.COMM_NULL
    return dup, workers


# -- the static pool of ``python -m erdmampi.futures`` -------------------------------

SharedPool = None


class SharedPoolCtx:
    """Context of ``python -m erdmampi.futures``: rank 0 enters with the pool,
    the other ranks serve as its workers when the context exits."""

    def __init__(self):
        self.lock = threading.Lock()
        self.comm = MPI.COMM_NULL
        self.intracomm = MPI.COMM_NULL
        self.on_root = None
        self.counter = None
        self.workers = None
        self.threads = weakref.WeakKeyDictionary()

    def __reduce__(self):
        return "SharedPool"

    def _manager(self, pool, options):
        if self.counter is None:       # a world of one: run tasks in a thread
            options["max_workers"] = 1
            set_comm_server(MPI.COMM_SELF)
            _manager_thread(pool, options)
            return
        with self.lock:
            tag = next(self.counter)
            ok = _client_start(self.comm, options, tag, list(range(1, self.comm.Get_size())),
                               sync=(tag == 0))
        if not ok:
            pool.broken("initializer failed")
            return
        queue = pool.setup(self.comm.Get_size() - 1)
        client_exec(self.comm, options, tag, self.workers, queue)

    def __call__(self, executor):
        with self.lock:
            pool = Pool(executor, self._manager)
            del _THREADS[pool.thread]
            self.threads[pool.thread] = pool.queue
        return pool

    def __enter__(self):
        global SharedPool
        world = MPI.COMM_WORLD
        self.on_root = world.Get_rank() == 0
        if world.Get_size() > 1:
            self.comm, self.intracomm = comm_split(world, 0)
            if self.on_root:
                self.counter = itertools.count(0)
                self.workers = collections.deque(range(1, world.Get_size()))
        SharedPool = self
        return self if self.on_root else None

    def __exit__(self, *exc):
        global SharedPool
        if self.on_root:
            join_threads(self.threads)
        if self.comm:
            if self.on_root:
                client_stop(self.comm, range(1, self.comm.Get_size()))
            else:
                set_comm_server(self.intracomm)
                try:
                    server_exec(self.comm)
                finally:
                    del_comm_server()
                    self.intracomm.Free()
            self.comm.Free()
        SharedPool = None
        self.comm = self.intracomm = MPI.COMM_NULL
        self.on_root = self.counter = self.workers = None
        self.threads.clear()
        return False


# -- MPICommExecutor ------------------------------------------------------------

def _comm_executor_helper(executor, comm, root):
    """Give ``executor`` (at ``root``) a pool over the other ranks of ``comm``;
    at the other ranks, serve tasks until the executor shuts down."""

    def manager(pool, options, dup):
        if dup is None:
            options["max_workers"] = 1
            set_comm_server(MPI.COMM_SELF)
            _manager_thread(pool, options)
            return
        workers = [r for r in range(dup.Get_size()) if r != root]
        try:
            if not _client_start(dup, options, 0, workers, sync=False):
                pool.broken("initializer failed")
                return
            queue = pool.setup(len(workers))
            client_exec(dup, options, 0, collections.deque(workers), queue)
        finally:
            client_stop(dup, workers)
            dup.Free()

    if comm.Get_rank() == root:
        if SharedPool is not None:
            executor._pool = SharedPool(executor)
            return
        dup = None
        if comm.Get_size() > 1:
            dup, _ = comm_split(comm, root)
        executor._pool = Pool(executor, manager, dup)
    else:
        dup, intracomm = comm_split(comm, root)
        set_comm_server(intracomm)
        try:
            server_exec(dup)
        finally:
            del_comm_server()
            intracomm.Free()
            dup.Free()
