"""The ``erdma`` process group: torch.distributed collectives over erdmampi.

A :class:`ProcessGroup` written in Python (a subclass of torch's
``ProcessGroup``, as torch's own Python process groups are).  Each group owns
``ERDMA_TORCH_LANES`` (2) lanes: duplicates of an erdmampi communicator, each
with a worker thread that runs the collectives queued on it in order.  The
i-th collective of the group goes to lane i % lanes (every rank issues them
in the same order, as torch requires, so both ends of a collective are on
the same lane), so a collective issued with ``async_op=True`` progresses
while the caller computes, and independent collectives (DDP's gradient
buckets) overlap, as on gloo's two worker threads.  An operation on a tensor
that an unfinished operation of another lane uses waits for it, and a
barrier waits for every earlier operation of the group.  The erdmampi calls
release the GIL while they wait.  Point-to-point operations are posted
straight away as nonblocking erdmampi requests on a second communicator, and
a poller thread completes them, so a send and a receive issued in any order
never wait for each other.

CPU tensors go to erdmampi as they are (numpy views or DLPack: no copy when
contiguous, bfloat16 included); a non-contiguous tensor is copied into a
contiguous one and the result copied back.  A CUDA tensor is copied into
pinned host memory on the caller's current stream (no wait there: the worker
waits for an event recorded after the copy), erdmampi works on that host
copy, and the worker copies results back to the device before the
operation completes.
"""

from __future__ import annotations

import _thread
import atexit
import collections
import datetime
import threading
import time
import weakref
import zlib
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from erdmampi import MPI, config

__all__ = ["ProcessGroupErdma", "ErdmaWork", "create_backend"]

_RED = {int(v): k for k, v in dist.ReduceOp.RedOpType.__members__.items()}
_MPI_OP = {"SUM": MPI.SUM, "AVG": MPI.SUM, "PRODUCT": MPI.PROD, "MIN": MPI.MIN,
           "MAX": MPI.MAX, "BAND": MPI.BAND, "BOR": MPI.BOR, "BXOR": MPI.BXOR,
           "PREMUL_SUM": MPI.SUM}
_BITWISE = ("BAND", "BOR", "BXOR")


def _opname(op) -> str:
    """The name (SUM, AVG, ...) of a torch ReduceOp (or RedOpType)."""
    if isinstance(op, dist.ReduceOp):
        op = op.op
    return _RED.get(int(op), str(op))


class _Red:
    """A reduction of the options of a call: its name (SUM, AVG, ...), the
    erdmampi operation and, for PREMUL_SUM, the factor (a number or a
    tensor) each rank multiplies its input by before the sum, as NCCL does."""

    __slots__ = ("name", "mpi", "factor")

    def __init__(self, name, mpi, factor=None):
        self.name, self.mpi, self.factor = name, mpi, factor

    def scaled(self, t: torch.Tensor, inplace: bool) -> torch.Tensor:
        """``t`` times the PREMUL_SUM factor (in place when ``inplace``, else a
        new tensor); ``t`` itself for the other reductions."""
        if self.factor is None:
            return t
        f = self.factor
        if isinstance(f, torch.Tensor):
            f = f.to(device=t.device).reshape(())
        with torch.no_grad():
            return t.mul_(f) if inplace else torch.mul(t, f).to(t.dtype)


def _seconds(timeout, default: float) -> float:
    """A torch timeout (timedelta, or milliseconds) in seconds; ``default``
    for "none given" (torch's kNoTimeout is 0 and its option default -1 ms)."""
    if timeout is None:
        return default
    if isinstance(timeout, datetime.timedelta):
        s = timeout.total_seconds()
    else:
        s = float(timeout) / 1000.0
    return default if s <= 0 else s


def _backend_error(msg: str, cause: Optional[BaseException] = None) -> dist.DistBackendError:
    e = dist.DistBackendError(f"erdma: {msg}")
    e.__cause__ = cause
    return e


class _Contig:
    """A contiguous host stand-in for ``t``: ``t`` itself when it is a
    contiguous CPU tensor, a contiguous copy of a strided one, a pinned host
    copy of a CUDA tensor (queued on the current stream, without waiting:
    see :func:`_marks`); ``fill=False`` leaves the stand-in's contents
    undefined.  :meth:`back` copies results into ``t`` when a copy was made."""

    __slots__ = ("t", "buf")

    def __init__(self, t: torch.Tensor, fill: bool = True):
        self.t = t
        if t.is_cuda:
            self.buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            if fill:
                self.buf.copy_(t, non_blocking=True)
        elif t.is_contiguous():
            self.buf = t
        else:
            self.buf = t.contiguous() if fill else torch.empty(t.shape, dtype=t.dtype,
                                                               device=t.device)

    def back(self):
        if self.buf is not self.t:
            with torch.no_grad():
                self.t.copy_(self.buf)


def _cuda_sync():
    """Let the kernels queued on the current CUDA stream finish before the
    worker thread reads or writes the tensors (a no-op without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.current_stream().synchronize()


def _marks(tensors) -> list:
    """What a worker waits for before it touches host copies of ``tensors``:
    an event on the current stream of each CUDA device among them, recorded
    after the copies :class:`_Contig` queued there, so the caller goes on
    queueing work.  With no CUDA tensor among them (CPU tensors in a process
    that uses CUDA, which copies queued on the stream may still write) the
    current stream is synchronised here instead."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return []
    devices = {t.device for t in tensors if t.is_cuda}
    if not devices:
        _cuda_sync()
        return []
    marks = []
    for d in devices:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(d))
        marks.append(ev)
    return marks


def _host_empty(shape, dtype, like: torch.Tensor) -> torch.Tensor:
    """A host tensor for results bound for ``like``'s device (pinned for a
    CUDA tensor, so the copy to the device is a direct DMA)."""
    return torch.empty(shape, dtype=dtype, device="cpu", pin_memory=like.is_cuda)


# element types numpy shares with torch: a CPU tensor of one of these goes to
# erdmampi as a numpy view, which takes its one-call paths (a plain host
# array with a known datatype); others (bfloat16, bool) go through DLPack
_NUMPY_TYPES = (torch.float32, torch.float64, torch.float16, torch.int8, torch.uint8,
                torch.int16, torch.int32, torch.int64, torch.complex64, torch.complex128)


def _host(t: torch.Tensor):
    """The buffer erdmampi gets for contiguous ``t``: a numpy view of a CPU
    tensor of a type numpy has (no copy), else ``t`` itself (also for a
    lazily conjugated or negated view, which numpy cannot show)."""
    if t.device.type == "cpu" and t.dtype in _NUMPY_TYPES and not (t.is_conj() or t.is_neg()):
        return t.detach().numpy()
    return t


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two contiguous tensors share memory: torch allows an
    all_gather_into_tensor whose input is its own block of the output, or a
    reduce_scatter_tensor whose output lies in its input (NCCL's in place),
    where MPI fails buffers at one address (ERR_BUFFER)."""
    if a.device != b.device:
        return False
    pa, pb = a.data_ptr(), b.data_ptr()
    return pa < pb + b.numel() * b.element_size() and pb < pa + a.numel() * a.element_size()


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (data movement of any dtype)."""
    return t.reshape(-1).view(torch.uint8)


class _Done:
    """A one-shot completion flag (threading.Event's calls) on a bare lock,
    whose waits and wake-ups run in C: a synchronous operation costs two
    thread hand-offs, which this keeps short."""

    __slots__ = ("_lock", "_set", "_guard")

    def __init__(self):
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False
        self._guard = _thread.allocate_lock()

    def set(self):
        with self._guard:
            if self._set:
                return
            self._set = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout=None) -> bool:
        if self._set:
            return True
        got = False
        try:
            got = self._lock.acquire(True, -1 if timeout is None else max(0.0, timeout))
        finally:
            if got:
                self._lock.release()      # the next waiter passes too
        return got or self._set


class ErdmaWork(dist.Work):
    """An operation in flight: :meth:`wait` blocks (GIL released) until it is
    done, raises :class:`torch.distributed.DistBackendError` when it failed
    or did not finish within the timeout; :meth:`get_future` gives a
    ``torch.futures.Future`` completed with the output tensors."""

    def __init__(self, pg: "ProcessGroupErdma", what: str, result: List[torch.Tensor]):
        super().__init__()
        self._pg = pg
        self._what = what
        self._result = result
        self._event = _Done()
        self._exc: Optional[BaseException] = None
        self._future = torch.futures.Future()
        self._source = -1
        self._timeout_s = pg._timeout_s

    # completion, from the worker or poller thread
    def _finish(self, exc: Optional[BaseException] = None):
        if self._event.is_set():
            return
        self._exc = exc
        self._event.set()
        try:
            if exc is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(exc)
        except RuntimeError:        # already completed by a timeout
            pass

    def wait(self, timeout=None) -> bool:
        secs = _seconds(timeout, self._timeout_s)
        if not self._event.wait(secs):
            exc = _backend_error(f"{self._what} did not complete within {secs:g} s "
                                 f"(rank {self._pg._rank} of {self._pg._size}); the group "
                                 "is unusable from now on")
            self._pg._fail(exc)
            raise exc
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self):
        return self._future

    def is_completed(self) -> bool:
        return self._event.is_set()

    def is_success(self) -> bool:
        return self._event.is_set() and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        return self._result

    def _source_rank(self) -> int:
        return self._source

    def synchronize(self):
        pass


def _world_base():
    """A private duplicate of COMM_WORLD from which groups are made (made
    when the world group is, collectively over all ranks)."""
    global _BASE
    if _BASE is None:
        _BASE = MPI.COMM_WORLD.Dup()
        _BASE.Set_errhandler(MPI.ERRORS_RETURN)
    return _BASE


_BASE = None


class _Lane:
    """A communicator of the group, the operations queued on it and the
    worker thread that runs them in order."""

    __slots__ = ("comm", "queue", "thread", "last", "cv")

    def __init__(self, comm):
        self.comm = comm
        self.queue: collections.deque = collections.deque()
        self.thread: Optional[threading.Thread] = None
        self.last: Optional[ErdmaWork] = None   # the latest operation queued here
        self.cv: Optional[threading.Condition] = None   # on the group's mutex


class ProcessGroupErdma(dist.ProcessGroup):
    """torch.distributed process group over an erdmampi communicator.

    Made by torch through the registered creator (``init_process_group`` and
    ``new_group`` with backend ``"erdma"``); ``comm`` is the erdmampi
    intracommunicator whose ranks are the group's ranks (duplicated here).
    """

    def __init__(self, comm, rank: int, size: int, timeout: datetime.timedelta,
                 name: str = ""):
        super().__init__(rank, size)
        if comm.Get_rank() != rank or comm.Get_size() != size:
            raise ValueError(f"erdma: communicator rank {comm.Get_rank()} of "
                             f"{comm.Get_size()} is not torch's rank {rank} of {size}")
        self._rank, self._size = rank, size
        self._timeout_s = _seconds(timeout, 1800.0)
        # one lane (a duplicate communicator and its worker thread) per
        # concurrent collective: operation i runs on lane i % lanes
        self._lanes = []
        for _ in range(max(1, int(config.get("ERDMA_TORCH_LANES")))):
            c = comm.Dup()
            c.Set_errhandler(MPI.ERRORS_RETURN)
            self._lanes.append(_Lane(c))
        self._comm = self._lanes[0].comm
        self._rr = 0
        self._pin: Optional[int] = None
        self._users: dict = {}          # storage address -> (latest work, its lane)
        self._p2p = comm.Dup()
        self._p2p.Set_errhandler(MPI.ERRORS_RETURN)
        self._name = name               # torch's group name (its _set_group_name)
        self._desc = ""
        self._error: Optional[BaseException] = None
        # one mutex; the poller waits on _lock, each lane's worker on its own
        # condition, so queueing an operation wakes only the thread that runs it
        self._mutex = threading.Lock()
        self._lock = threading.Condition(self._mutex)
        for lane in self._lanes:
            lane.cv = threading.Condition(self._mutex)
        self._pending: list = []          # (request, work, on_done, status) of p2p operations
        self._closed = False
        for k, lane in enumerate(self._lanes):
            lane.thread = threading.Thread(target=self._run, args=(lane,),
                                           name=f"erdma-pg-{name}-{k}", daemon=True)
            lane.thread.start()
        self._poller = threading.Thread(target=self._poll, name=f"erdma-p2p-{name}", daemon=True)
        self._poller.start()
        _LIVE.add(self)

    def getBackendName(self) -> str:
        return "erdma"

    def _get_backend_name(self) -> str:
        return "erdma"

    # torch keeps the group name on the C++ backends a ProcessGroup holds; this
    # group holds none (it is its own backend), so it keeps name and
    # description itself.  DeviceMesh, DTensor and the functional collectives
    # find a group by this name.
    @property
    def group_name(self) -> str:
        if not self._name:
            raise RuntimeError("ProcessGroup name not set")
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = str(name)

    @property
    def group_desc(self) -> str:
        return self._desc or "undefined"

    def _set_group_desc(self, desc: str) -> None:
        self._desc = str(desc)

    # torch asks a group for its backend on a device (FSDP2's allocation
    # from the process group, split_group, the time estimator): this group
    # is its own backend on every device, one that allocates no tensors of
    # its own and cannot split.
    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def _get_backend(self, device):
        return self

    def supports_tensor_alloc(self, device) -> bool:
        return False

    @property
    def comm(self):
        """The erdmampi communicator the collectives run on."""
        return self._comm

    def __repr__(self):
        return f"ProcessGroupErdma(rank={self._rank}, size={self._size})"

    # -- collectives --------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        red = self._red(opts, tensors)
        bufs = [_Contig(t) for t in tensors]

        def run(c):
            for b in bufs:
                red.scaled(b.buf, inplace=True)
                c.Allreduce(MPI.IN_PLACE, _host(b.buf), op=red.mpi)
                if red.name == "AVG":
                    self._avg(b.buf)
                b.back()
        return self._submit("allreduce", list(tensors), run, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def _allreduce_compressed(self, tensor: torch.Tensor, compress: Optional[str]) -> ErdmaWork:
        """SUM allreduce of one tensor with erdmampi's collective compression
        (``compress``: "lossless", "bf16", "int8", "int4", "off" or None for
        the process default, ``ERDMA_COMPRESS``)."""
        b = _Contig(tensor)

        def run(c):
            c.Allreduce(MPI.IN_PLACE, _host(b.buf), op=MPI.SUM, compress=compress)
            b.back()
        return self._submit(f"allreduce (compress={compress})", [tensor], run, None)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        bufs = [_Contig(t, fill=self._rank == root) for t in tensors]

        def run(c):
            for b in bufs:
                c.Bcast(_host(b.buf), root=root)
                if self._rank != root:
                    b.back()
        return self._submit("broadcast", list(tensors), run, opts)

    def reduce(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        red = self._red(opts, tensors)
        bufs = [_Contig(t) for t in tensors]

        def run(c):
            for b in bufs:
                if self._rank == root:
                    red.scaled(b.buf, inplace=True)
                    c.Reduce(MPI.IN_PLACE, _host(b.buf), op=red.mpi, root=root)
                    if red.name == "AVG":
                        self._avg(b.buf)
                    b.back()
                else:       # a non-root's tensor is left as it was
                    c.Reduce(_host(red.scaled(b.buf, inplace=False)), None, op=red.mpi,
                             root=root)
        return self._submit("reduce", list(tensors), run, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        pairs = [(outs, _Contig(inp).buf) for outs, inp in zip(output_tensors, input_tensors)]
        self._check_lists(pairs, "allgather")

        def run(c):
            for outs, src in pairs:
                tmp = _host_empty((self._size,) + tuple(src.shape), src.dtype, outs[0])
                c.Allgather(_host(_bytes(src)), _host(_bytes(tmp)))
                with torch.no_grad():
                    for o, r in zip(outs, tmp):
                        o.copy_(r.view(o.shape))
        return self._submit("allgather", [t for outs in output_tensors for t in outs], run, opts,
                            uses=input_tensors)

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        out = _Contig(output_tensor, fill=False)
        self._check_numel(out.buf, input_tensor, self._size, "all_gather_into_tensor")
        src = _Contig(input_tensor).buf

        def run(c):
            mine = src.clone() if _overlaps(src, out.buf) else src
            c.Allgather(_host(_bytes(mine)), _host(_bytes(out.buf)))
            out.back()
        return self._submit("all_gather_into_tensor", [output_tensor], run, opts,
                            uses=[input_tensor])

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self._chain([lambda o=o, i=i: self.allgather([o], [i], opts)
                            for o, i in zip(output_lists, input_list)])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self._chain([lambda o=o, i=i: self.all_gather_single(o, i, opts)
                            for o, i in zip(outputs, inputs)])

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        red = self._red(opts, output_tensors)
        self._check_lists([(ins, out) for out, ins in zip(output_tensors, input_tensors)],
                          "reduce_scatter")
        pairs = [(out, [_Contig(t).buf for t in ins])
                 for out, ins in zip(output_tensors, input_tensors)]

        def run(c):
            for out, ins in pairs:
                send = red.scaled(torch.stack([t.reshape(out.shape) for t in ins]), inplace=True)
                o = _Contig(out, fill=False)
                c.Reduce_scatter_block(_host(send), _host(o.buf), op=red.mpi)
                if red.name == "AVG":
                    self._avg(o.buf)
                o.back()
        return self._submit("reduce_scatter", list(output_tensors), run, opts,
                            uses=[t for ins in input_tensors for t in ins])

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        red = self._red(opts, [input_tensor])
        out = _Contig(output_tensor, fill=False)
        self._check_numel(input_tensor, out.buf, self._size, "reduce_scatter_tensor")
        src = _Contig(input_tensor).buf

        def run(c):
            send = red.scaled(src, inplace=False)
            if _overlaps(send, out.buf):
                res = torch.empty_like(out.buf)
                c.Reduce_scatter_block(_host(send), _host(res), op=red.mpi)
                out.buf.copy_(res)
            else:
                c.Reduce_scatter_block(_host(send), _host(out.buf), op=red.mpi)
            if red.name == "AVG":
                self._avg(out.buf)
            out.back()
        return self._submit("reduce_scatter_tensor", [output_tensor], run, opts,
                            uses=[input_tensor])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self._chain([lambda o=o, i=i: self.reduce_scatter_single(o, i, opts)
                            for o, i in zip(outputs, inputs)])

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"erdma: all_to_all needs {self._size} input and output tensors")

        srcs = [_Contig(t).buf for t in input_tensors]

        def run(c):
            send = torch.cat([_bytes(t) for t in srcs])
            scounts = [t.numel() * t.element_size() for t in input_tensors]
            rcounts = [t.numel() * t.element_size() for t in output_tensors]
            recv = _host_empty(sum(rcounts), torch.uint8, output_tensors[0])
            c.Alltoallv([_host(send), scounts, _displs(scounts), MPI.BYTE],
                        [_host(recv), rcounts, _displs(rcounts), MPI.BYTE])
            with torch.no_grad():
                for o, chunk in zip(output_tensors, torch.split(recv, rcounts)):
                    o.copy_(chunk.view(o.dtype).view(o.shape))
        return self._submit("all_to_all", list(output_tensors), run, opts, uses=input_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        out = _Contig(output, fill=False)
        src = _Contig(input).buf
        scounts = self._splits(src, input_split_sizes, "input")
        rcounts = self._splits(out.buf, output_split_sizes, "output")

        def run(c):
            c.Alltoallv([_host(_bytes(src)), scounts, _displs(scounts), MPI.BYTE],
                        [_host(_bytes(out.buf)), rcounts, _displs(rcounts), MPI.BYTE])
            out.back()
        return self._submit("all_to_all_single", [output], run, opts, uses=[input])

    alltoall_base = all_to_all_single

    def gather(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        inp = input_tensors[0]
        outs = output_tensors[0] if self._rank == root else []
        if self._rank == root and len(outs) != self._size:
            raise ValueError(f"erdma: gather needs {self._size} output tensors on the root")

        src = _Contig(inp).buf

        def run(c):
            if self._rank == root:
                tmp = _host_empty((self._size,) + tuple(src.shape), src.dtype, outs[0])
                c.Gather(_host(_bytes(src)), _host(_bytes(tmp)), root=root)
                with torch.no_grad():
                    for o, r in zip(outs, tmp):
                        o.copy_(r.view(o.shape))
            else:
                c.Gather(_host(_bytes(src)), None, root=root)
        return self._submit("gather", list(outs), run, opts, uses=[inp])

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        out = _Contig(output_tensors[0], fill=False)
        ins = input_tensors[0] if self._rank == root else []
        if self._rank == root and len(ins) != self._size:
            raise ValueError(f"erdma: scatter needs {self._size} input tensors on the root")
        srcs = [_Contig(t).buf for t in ins]

        def run(c):
            send = None
            if self._rank == root:
                send = _host(_bytes(torch.stack([t.reshape(out.buf.shape) for t in srcs])))
            c.Scatter(send, _host(_bytes(out.buf)), root=root)
            out.back()
        return self._submit("scatter", [output_tensors[0]], run, opts, uses=list(ins))

    def barrier(self, opts=None):
        return self._submit("barrier", [], lambda c: c.Barrier(), opts, barrier=True)

    # -- point to point -----------------------------------------------------

    def send(self, tensors, dst, tag=0):
        src = _Contig(tensors[0]).buf
        self._check_ok()
        _cuda_sync()
        req = self._p2p.Isend(_host(_bytes(src)), dest=dst, tag=tag)
        return self._post("send", [tensors[0]], req, None, keep=src)

    def recv(self, tensors, src, tag=0):
        return self._recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._recv(tensors, MPI.ANY_SOURCE, tag)

    def _recv(self, tensors, src, tag):
        out = _Contig(tensors[0], fill=False)
        self._check_ok()
        _cuda_sync()
        status = MPI.Status()
        req = self._p2p.Irecv(_host(_bytes(out.buf)), source=src, tag=tag)

        def done(work):
            out.back()
            work._source = status.Get_source()
        return self._post("recv", [tensors[0]], req, done, status=status)

    # -- lifecycle ----------------------------------------------------------

    def abort(self):
        self._fail(_backend_error("the process group was aborted"))

    def shutdown(self):
        """Stop the worker and poller threads once the queued operations ran
        (destroy_process_group and interpreter exit call this)."""
        with self._lock:
            self._closed = True
            self._wake_all()
        for t in [lane.thread for lane in self._lanes] + [self._poller]:
            if t is not threading.current_thread():
                t.join(5.0)

    # Private

    def _red(self, opts, tensors) -> _Red:
        """The reduction the options ask for, checked against the tensors."""
        op = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        name = _opname(op)
        if name not in _MPI_OP:
            raise ValueError(f"erdma: reduction {name} is not supported")
        if name in _BITWISE and any(t.is_floating_point() or t.is_complex() for t in tensors):
            raise ValueError(f"erdma: {name} needs integer tensors")
        factor = None
        if name == "PREMUL_SUM":
            if not all(t.is_floating_point() or t.is_complex() for t in tensors):
                raise ValueError("erdma: PREMUL_SUM needs floating-point tensors")
            factor = op.factor
            if isinstance(factor, torch.Tensor) and factor.numel() != 1:
                raise ValueError("erdma: PREMUL_SUM needs a factor of one element, "
                                 f"got {factor.numel()}")
        return _Red(name, _MPI_OP[name], factor)

    def _avg(self, t):
        with torch.no_grad():
            if t.is_floating_point() or t.is_complex():
                t.div_(self._size)
            else:
                t.copy_(torch.div(t, self._size, rounding_mode="floor"))

    def _check_lists(self, pairs, what):
        for outs, _ in pairs:
            if len(outs) != self._size:
                raise ValueError(f"erdma: {what} needs {self._size} tensors per list, "
                                 f"got {len(outs)}")

    @staticmethod
    def _check_numel(big, small, n, what):
        if big.numel() != small.numel() * n or big.dtype != small.dtype:
            raise ValueError(f"erdma: {what}: the output must hold {n} x the input "
                             f"({big.numel()} vs {small.numel()} elements, "
                             f"{big.dtype} vs {small.dtype})")

    def _splits(self, t, sizes, what):
        rows = t.shape[0] if t.dim() else 1
        row_bytes = (t.numel() // rows if rows else 0) * t.element_size()
        if not sizes:
            if rows % self._size:
                raise ValueError(f"erdma: all_to_all_single: {what} of {rows} rows does "
                                 f"not split evenly over {self._size} ranks")
            sizes = [rows // self._size] * self._size
        if len(sizes) != self._size or sum(sizes) != rows:
            raise ValueError(f"erdma: all_to_all_single: {what} split sizes {list(sizes)} "
                             f"do not match {rows} rows over {self._size} ranks")
        return [int(s) * row_bytes for s in sizes]

    def _chain(self, starts: List[Callable[[], ErdmaWork]]) -> ErdmaWork:
        """Submit several operations, all on one lane; the last one's Work
        completes after all of them (the lane's worker runs them in order)."""
        with self._lock:
            self._pin = self._next_lane()
        try:
            works = [s() for s in starts]
        finally:
            self._pin = None
        return works[-1] if works else self._submit("coalesced", [], lambda c: None, None)

    def _check_ok(self):
        if self._error is not None:
            raise self._error

    def _fail(self, exc):
        """Fail every queued and pending operation and refuse new ones."""
        with self._lock:
            if self._error is None:
                self._error = exc
            queued = []
            for lane in self._lanes:
                queued += lane.queue
                lane.queue.clear()
            pending, self._pending = self._pending, []
            self._wake_all()
        for _, w, *_ in queued:
            w._finish(self._error)
        for _, w, _, _ in pending:
            w._finish(self._error)

    def _wake_all(self):
        """Wake every worker and the poller (mutex held)."""
        self._lock.notify_all()
        for lane in self._lanes:
            lane.cv.notify_all()

    def _next_lane(self) -> int:
        """The lane of the next operation (round robin in issue order: the
        same on every rank, as the order of the operations is); lock held."""
        i = self._rr
        self._rr = (i + 1) % len(self._lanes)
        return i

    def _submit(self, what, result, fn, opts, uses=(), barrier=False) -> ErdmaWork:
        """Queue ``fn(comm)`` on the next lane.  It first waits for the
        earlier operations of other lanes that touch the same tensors
        (``result`` and ``uses``), so operations on one tensor keep their
        order; a barrier waits for every earlier operation of the group."""
        work = ErdmaWork(self, what, result)
        if opts is not None and getattr(opts, "timeout", None) is not None:
            t = _seconds(opts.timeout, 0.0)
            if t > 0:
                work._timeout_s = t
        self._check_ok()
        marks = _marks([*result, *uses])
        with self._lock:
            i = self._pin if self._pin is not None else self._next_lane()
            lane = self._lanes[i]
            deps = []
            if len(self._lanes) > 1:
                if barrier:
                    deps = [ln.last for ln in self._lanes
                            if ln is not lane and ln.last is not None
                            and not ln.last.is_completed()]
                deps += self._conflicts(i, work, result, uses)
            lane.last = work
            lane.queue.append((fn, work, deps, marks))
            lane.cv.notify()
        return work

    def _conflicts(self, i, work, result, uses) -> list:
        """Unfinished operations of lanes other than ``i`` on the storage of
        these tensors; records ``work`` as their latest user (lock held)."""
        deps, users = [], self._users
        for t in (*result, *uses):
            try:
                key = t.untyped_storage().data_ptr()
            except Exception:           # no storage to share (e.g. a meta tensor)
                continue
            prev = users.get(key)
            if prev is not None and prev[1] != i and not prev[0].is_completed() \
                    and prev[0] not in deps:
                deps.append(prev[0])
            users[key] = (work, i)
        if len(users) > 512:
            self._users = {k: v for k, v in users.items() if not v[0].is_completed()}
        return deps

    def _run(self, lane: "_Lane"):
        while True:
            with self._lock:
                while not lane.queue and not self._closed:
                    lane.cv.wait()
                if not lane.queue:
                    return
                fn, work, deps, marks = lane.queue.popleft()
            for d in deps:                  # earlier operations of other lanes
                d._event.wait()
            for m in marks:                 # the copies to the host (GIL released)
                m.synchronize()
            if self._error is not None:
                work._finish(self._error)
                continue
            try:
                fn(lane.comm)
            except MPI.Exception as e:
                exc = _backend_error(f"{work._what} failed: {e}", e)
                work._finish(exc)
                self._fail(exc)
            except Exception as e:          # wrong arguments: this operation only
                work._finish(e)
            else:
                work._finish()

    def _post(self, what, result, req, on_done, keep=None, status=None) -> ErdmaWork:
        work = ErdmaWork(self, what, result)
        work._keep = keep
        with self._lock:
            self._pending.append((req, work, on_done, status))
            self._lock.notify()
        return work

    def _poll(self):
        delay = 0.0
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    delay = 0.0
                    self._lock.wait()
                if not self._pending:
                    return
                pending = list(self._pending)
            finished = []
            for entry in pending:
                req, work, on_done, status = entry
                try:
                    done = req.Test(status) if status is not None else req.Test()
                except MPI.Exception as e:
                    finished.append(entry)
                    exc = _backend_error(f"{work._what} failed: {e}", e)
                    work._finish(exc)
                    continue
                if done:
                    finished.append(entry)
                    try:
                        if on_done is not None:
                            on_done(work)
                    except Exception as e:
                        work._finish(e)
                    else:
                        work._finish()
            if finished:
                gone = {id(e) for e in finished}     # by identity: completed requests compare equal
                with self._lock:
                    self._pending = [p for p in self._pending if id(p) not in gone]
                delay = 0.0
            else:
                # back off from a busy poll to 1 ms while nothing completes
                delay = min(0.001, delay * 2 or 2e-5)
                time.sleep(delay)


_LIVE: "weakref.WeakSet[ProcessGroupErdma]" = weakref.WeakSet()


@atexit.register
def _shutdown_all():
    # threads still running while the interpreter and torch's C++ objects
    # are torn down can abort the process at exit
    for pg in list(_LIVE):
        pg.shutdown()


def _displs(counts):
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def create_backend(dist_opts, backend_opts=None):
    """The creator torch calls (extended API) for ``init_process_group`` and
    ``new_group`` with backend ``"erdma"``.

    The ranks of the job are erdmampi's ``COMM_WORLD`` (started by
    ``erdmarun``); the world group must have the same rank and size as
    ``COMM_WORLD`` and a subgroup is made from the global ranks torch lists.
    The ``store`` torch passes is not needed for erdmampi's own traffic.
    """
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = dist_opts.timeout
    ranks = list(dist_opts.global_ranks_in_group or [])
    world = MPI.COMM_WORLD
    name = str(getattr(dist_opts, "group_id", "") or "")
    if not ranks or ranks == list(range(world.Get_size())):
        if world.Get_rank() != rank or world.Get_size() != size:
            raise ValueError(
                f"erdma: torch's rank {rank} of {size} is not erdmampi's rank "
                f"{world.Get_rank()} of {world.Get_size()}: start the job with erdmarun "
                "(the erdma backend runs on the job erdmarun made; RANK and WORLD_SIZE "
                "must be the ones it sets)")
        return ProcessGroupErdma(_world_base(), rank, size, timeout, name)
    base = _world_base()
    if base.Get_rank() not in ranks:
        raise ValueError(f"erdma: rank {base.Get_rank()} is not in the group {ranks}")
    # all members (and only they) make the group: same name, same tag
    tag = zlib.crc32(name.encode()) & 0x7FFF
    sub = base.Create_group(base.Get_group().Incl(ranks), tag)
    sub.Set_errhandler(MPI.ERRORS_RETURN)
    try:
        return ProcessGroupErdma(sub, rank, size, timeout, name)
    finally:
        sub.Free()
