"""Synchronization utilities over MPI (as ``mpi4py.util.sync``).

``Sequential`` passes a token with point-to-point messages; the others keep
their state in one-sided windows (``MPI.Win.Allocate``) updated with atomic
operations:

* ``Counter``: one value at ``root`` changed with ``Fetch_and_op``.
* ``Mutex``: an MCS queue lock.  Every process holds ``[locked, next]`` and
  rank 0 also the queue ``tail``; a process appends itself by swapping the
  tail, links behind its predecessor and spins on its own ``locked`` flag,
  which the releasing predecessor sets.  ``locked`` doubles as the recursion
  count of recursive mutexes.
* ``Condition``: a circular queue of waiting processes (``[flag, next]``,
  ``tail`` at rank 0) next to a mutex; waiters spin on their own ``flag``.
* ``Semaphore``: a counter guarded by a condition.
"""

import array as _array
import time as _time

from .. import MPI

__all__ = ["Sequential", "Counter", "Mutex", "Condition", "Semaphore"]

_NULL = MPI.PROC_NULL
_TAIL_RANK = 0                  # the process holding the queue tails
_LOCK, _NEXT, _TAIL = 0, 1, 2   # int slots of the mutex/condition windows


def _ints(*values):
    return _array.array("i", values)


def _win_memory(window):
    # the window's local memory (a Python-level Win exports it via tomemory)
    try:
        return memoryview(window)
    except TypeError:
        return memoryview(window.tomemory())


def _init_window(comm, info, values, root=None, typecode="i"):
    """Allocate a window of ``values`` (all of them at ``root``, the first
    ``len(values) - 1`` elsewhere, or as given when ``root`` is None) and
    fill the local part."""
    rank = comm.Get_rank()
    if root is not None and rank != root:
        values = values[:-1]
    init = _array.array(typecode, values)
    window = MPI.Win.Allocate(len(init) * init.itemsize, init.itemsize, info, comm)
    window.Lock(rank, MPI.LOCK_SHARED)
    window.Accumulate(init, rank, op=MPI.REPLACE)
    window.Unlock(rank)
    comm.Barrier()
    return window


class Sequential:
    """Run a block one process at a time, in rank order."""

    def __init__(self, comm, tag=0):
        """Initialize sequential execution over ``comm`` with messages of ``tag``."""
        self.comm = comm
        self.tag = int(tag)

    def __enter__(self):
        self.begin()
        return self

    def __exit__(self, *exc):
        self.end()

    def begin(self):
        """Wait for the previous rank to finish."""
        comm = self.comm
        if comm.Get_size() > 1 and comm.Get_rank() != 0:
            comm.Recv((bytearray(), 0, MPI.BYTE), comm.Get_rank() - 1, self.tag)

    def end(self):
        """Let the next rank go."""
        comm = self.comm
        size = comm.Get_size()
        if size > 1 and comm.Get_rank() != size - 1:
            comm.Send((bytearray(), 0, MPI.BYTE), comm.Get_rank() + 1, self.tag)


class Counter:
    """Global counter."""

    def __init__(self, start=0, step=1, *, typecode="i", comm=MPI.COMM_SELF,
                 info=MPI.INFO_NULL, root=0):
        """Initialize a counter of ``typecode`` items held at ``root`` of ``comm``."""
        # pylint: disable=too-many-arguments
        typechar = MPI.Datatype.fromcode(typecode).typechar
        self._start = start
        self._step = step
        self._typechar = typechar
        self._location = (root, 0)
        self._comm = comm
        self._window = _init_window(comm, info, [start], root=root, typecode=typechar)

    def __iter__(self):
        return self

    def __next__(self):
        return self.next()

    def next(self, incr=None):
        """Return the current value and add ``incr`` (default: the step)."""
        if not self._window:
            raise RuntimeError("counter already freed")
        root, disp = self._location
        incr = _array.array(self._typechar, [self._step if incr is None else incr])
        prev = _array.array(self._typechar, [0])
        op = MPI.SUM if incr[0] != 0 else MPI.NO_OP
        self._window.Lock(root, MPI.LOCK_SHARED)
        self._window.Fetch_and_op(incr, prev, root, disp, op)
        self._window.Unlock(root)
        return prev[0]

    def free(self):
        """Free the counter."""
        window, self._window = self._window, MPI.WIN_NULL
        self._comm = MPI.COMM_NULL
        window.free()


class Mutex:
    """Mutual exclusion among the processes of a communicator."""

    def __init__(self, *, recursive=False, comm=MPI.COMM_SELF, info=MPI.INFO_NULL):
        """Initialize a mutex over ``comm`` (``recursive``: may be re-acquired)."""
        self._recursive = bool(recursive)
        self._comm = comm
        self._window = _init_window(comm, info, [False, _NULL, _NULL], root=_TAIL_RANK)

    def _acquire(self, blocking=True):
        window = self._window
        me = window.group_rank
        window.Lock_all()
        rank, null, prev = _ints(me), _ints(_NULL), _ints(_NULL)
        window.Accumulate(null, me, _NEXT, MPI.REPLACE)
        if blocking:
            window.Fetch_and_op(rank, prev, _TAIL_RANK, _TAIL, MPI.REPLACE)
        else:
            window.Compare_and_swap(rank, null, prev, _TAIL_RANK, _TAIL)
        window.Flush(_TAIL_RANK)
        locked = int(prev[0] == _NULL)
        if blocking and not locked:
            # queue behind the previous tail and wait for it to hand over
            window.Accumulate(rank, prev[0], _NEXT, MPI.REPLACE)
            locked = _spin(window, _LOCK, 0)
        window.Accumulate(_ints(locked), me, _LOCK, MPI.REPLACE)
        window.Unlock_all()
        return bool(locked)

    def _release(self):
        window = self._window
        me = window.group_rank
        window.Lock_all()
        rank, null, prev = _ints(me), _ints(_NULL), _ints(_NULL)
        window.Compare_and_swap(null, rank, prev, _TAIL_RANK, _TAIL)
        window.Flush(_TAIL_RANK)
        if prev[0] != me:
            # someone queued behind: wait for the link, then hand over
            nxt = _spin(window, _NEXT, _NULL)
            window.Accumulate(_ints(True), nxt, _LOCK, MPI.REPLACE)
        window.Accumulate(_ints(False), me, _LOCK, MPI.REPLACE)
        window.Unlock_all()

    def _count_op(self, value, op):
        window = self._window
        me = window.group_rank
        prev = _ints(0)
        window.Lock(me, MPI.LOCK_SHARED)
        window.Fetch_and_op(_ints(value), prev, me, _LOCK, op)
        window.Unlock(me)
        return prev[0]

    def _acquire_restore(self, state):
        self._acquire()
        if self._recursive:
            self._count_op(state, MPI.REPLACE)

    def _release_save(self):
        state = self._count_op(0, MPI.NO_OP) if self._recursive else None
        self._release()
        return state

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self, blocking=True):
        """Acquire the mutex; with ``blocking=False`` return False if held elsewhere."""
        if not self._window:
            raise RuntimeError("mutex already freed")
        if self.locked():
            if self._recursive:
                self._count_op(+1, MPI.SUM)
                return True
            raise RuntimeError("cannot acquire already held mutex")
        return self._acquire(blocking)

    def release(self):
        """Release the mutex."""
        if not self._window:
            raise RuntimeError("mutex already freed")
        if not self.locked():
            raise RuntimeError("cannot release unheld mutex")
        if self._recursive and self._count_op(-1, MPI.SUM) > 1:
            return
        self._release()

    def locked(self):
        """Whether this process holds the mutex."""
        if not self._window:
            raise RuntimeError("mutex already freed")
        return bool(_win_memory(self._window).cast("i")[_LOCK])

    def count(self):
        """The recursion count."""
        if not self._window:
            raise RuntimeError("mutex already freed")
        return self._count_op(0, MPI.NO_OP)

    def free(self):
        """Free the mutex (releasing it if held)."""
        if self._window and self.locked():
            self._release()
        window, self._window = self._window, MPI.WIN_NULL
        self._comm = MPI.COMM_NULL
        window.free()


class Condition:
    """Condition variable among the processes of a communicator."""

    def __init__(self, mutex=None, *, recursive=True, comm=MPI.COMM_SELF,
                 info=MPI.INFO_NULL):
        """Initialize a condition over ``mutex`` (a new one over ``comm`` if None)."""
        if mutex is None:
            self._mutex = Mutex(recursive=recursive, comm=comm, info=info)
            self._mutex_free = self._mutex.free
        else:
            self._mutex = mutex
            self._mutex_free = lambda: None
            comm = mutex._comm  # pylint: disable=protected-access
        self._comm = comm
        self._window = _init_window(comm, info, [0, _NULL, _NULL], root=_TAIL_RANK)

    def _enqueue(self, process):
        window = self._window
        rank, prev, nxt = _ints(process), _ints(_NULL), _ints(process)
        window.Lock_all()
        window.Fetch_and_op(rank, prev, _TAIL_RANK, _TAIL, MPI.REPLACE)
        window.Flush(_TAIL_RANK)
        if prev[0] != _NULL:
            # insert after the old tail: we point to its successor (the head)
            window.Fetch_and_op(rank, nxt, prev[0], _NEXT, MPI.REPLACE)
            window.Flush(prev[0])
        window.Accumulate(nxt, process, _NEXT, MPI.REPLACE)
        window.Unlock_all()

    def _dequeue(self, maxnumprocs):
        window = self._window
        null, tail, nxt = _ints(_NULL), _ints(_NULL), _ints(_NULL)
        processes = []
        maxnumprocs = max(0, min(maxnumprocs, window.group_size))
        window.Lock_all()
        window.Fetch_and_op(null, tail, _TAIL_RANK, _TAIL, MPI.NO_OP)
        window.Flush(_TAIL_RANK)
        if tail[0] != _NULL:
            window.Fetch_and_op(null, nxt, tail[0], _NEXT, MPI.NO_OP)
            window.Flush(tail[0])
            empty = False
            while len(processes) < maxnumprocs and not empty:
                rank = nxt[0]
                processes.append(rank)
                window.Fetch_and_op(null, nxt, rank, _NEXT, MPI.NO_OP)
                window.Flush(rank)
                empty = processes[0] == nxt[0]
            if empty:
                window.Accumulate(null, _TAIL_RANK, _TAIL, MPI.REPLACE)
            else:
                window.Accumulate(nxt, tail[0], _NEXT, MPI.REPLACE)
        window.Unlock_all()
        return processes

    def _sleep(self):
        window = self._window
        window.Lock_all()
        _spin(window, _LOCK, 0, reset=True)
        window.Unlock_all()

    def _wakeup(self, processes):
        window = self._window
        window.Lock_all()
        for rank in processes:
            window.Accumulate(_ints(1), rank, _LOCK, MPI.REPLACE)
        window.Unlock_all()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self, blocking=True):
        """Acquire the underlying mutex."""
        if not self._window:
            raise RuntimeError("condition already freed")
        return self._mutex.acquire(blocking)

    def release(self):
        """Release the underlying mutex."""
        if not self._window:
            raise RuntimeError("condition already freed")
        self._mutex.release()

    def locked(self):
        """Whether this process holds the underlying mutex."""
        return self._mutex.locked()

    def wait(self):
        """Release the mutex, wait to be notified, re-acquire; returns True."""
        if not self._window:
            raise RuntimeError("condition already freed")
        if not self.locked():
            raise RuntimeError("cannot wait on unheld mutex")
        self._enqueue(self._window.group_rank)
        state = self._mutex._release_save()  # pylint: disable=protected-access
        self._sleep()
        self._mutex._acquire_restore(state)  # pylint: disable=protected-access
        return True

    def wait_for(self, predicate):
        """Wait until ``predicate()`` is true and return its value."""
        result = predicate()
        while not result:
            self.wait()
            result = predicate()
        return result

    def notify(self, n=1):
        """Wake up to ``n`` waiting processes; return how many were woken."""
        if not self._window:
            raise RuntimeError("condition already freed")
        if not self.locked():
            raise RuntimeError("cannot notify on unheld mutex")
        processes = self._dequeue(n)
        self._wakeup(processes)
        return len(processes)

    def notify_all(self):
        """Wake up every waiting process; return how many were woken."""
        return self.notify((1 << 31) - 1)

    def free(self):
        """Free the condition (and the mutex it created)."""
        mutex = self._mutex
        if mutex._window and mutex.locked():  # pylint: disable=protected-access
            mutex._release()  # pylint: disable=protected-access
        self._mutex_free()
        window, self._window = self._window, MPI.WIN_NULL
        self._comm = MPI.COMM_NULL
        window.free()


class Semaphore:
    """Counting semaphore among the processes of a communicator."""

    def __init__(self, value=1, *, bounded=True, comm=MPI.COMM_SELF, info=MPI.INFO_NULL):
        """Initialize a semaphore with ``value`` (``bounded``: never above it)."""
        if value < 0:
            raise ValueError("initial value must be non-negative")
        self._bounded = bool(bounded)
        self._counter = Counter(value, comm=comm, info=info)
        self._condvar = Condition(recursive=False, comm=comm, info=info)
        self._comm = comm

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()

    def acquire(self, blocking=True):
        """Decrement the counter, waiting while it is zero (unless not ``blocking``)."""
        with self._condvar:
            while self._counter.next(0) == 0:
                if not blocking:
                    return False
                self._condvar.wait()
            self._counter.next(-1)
            return True

    def release(self, n=1):
        """Increment the counter by ``n`` and wake up as many waiters."""
        if n < 1:
            raise ValueError("increment must be one or more")
        with self._condvar:
            if self._bounded:
                current = self._counter.next(0)
                if current + n > self._counter._start:  # pylint: disable=protected-access
                    raise ValueError("semaphore released too many times")
            self._counter.next(n)
            self._condvar.notify(n)

    def free(self):
        """Free the semaphore."""
        self._counter.free()
        self._condvar.free()
        self._comm = MPI.COMM_NULL


_DELAY_MAX = 1 / 1024


def _spin(window, index, sentinel, reset=False):
    """Wait (in a passive epoch) until local int ``index`` differs from
    ``sentinel``; return it, storing ``sentinel`` back if ``reset``."""
    memory = _win_memory(window).cast("i")
    delay = 0.0
    window.Sync()
    while memory[index] == sentinel:
        _time.sleep(delay)
        delay = min(_DELAY_MAX, max(_DELAY_MAX / 1024, delay * 2))
        window.Flush(window.group_rank)      # let the target make progress
        window.Sync()
    value = memory[index]
    if reset:
        memory[index] = sentinel
    return value
