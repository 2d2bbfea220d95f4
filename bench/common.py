"""What the benchmarks share: size parsing, the three stacks behind one small
interface, timing (medians of repeated runs) and the JSON record.

A *stack* is what moves the bytes:

``erdmampi``  ``from erdmampi import MPI`` (run under ``erdmarun``)
``mpi4py``    ``from mpi4py import MPI``, Debian MPICH (run under ``mpiexec.mpich``)
``gloo``      ``torch.distributed`` with the gloo backend, initialised from the
              environment (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
              ``MASTER_PORT``; run under ``python -m bench.gloorun`` or ``torchrun``)

Without ``--stack`` the stack is guessed from the launcher's environment.
"""
import datetime
import json
import os
import platform
import statistics
import sys
import time

KIB, MIB = 1 << 10, 1 << 20
STACKS = ("erdmampi", "mpi4py", "gloo")


def parse_size(text):
    """'8', '4K', '4KiB', '64M', '64MiB', '1G' -> bytes."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KIB, "M": MIB, "G": 1 << 30}.get(t[-1:], 1)
    try:
        value = int(float(t[:-1] if scale > 1 else t) * scale)
    except ValueError:
        raise ValueError("not a size: %r (use e.g. 8, 4KiB, 64MiB)" % text) from None
    if value <= 0:
        raise ValueError("size must be positive: %r" % text)
    return value


def format_size(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", KIB)):
        if n >= scale and n % scale == 0:
            return "%d %s" % (n // scale, unit)
    return "%d B" % n


def sizes(lo, hi):
    """Powers of two times ``lo`` up to ``hi``."""
    s = lo
    while s <= hi:
        yield s
        s *= 2


def _np():
    import numpy
    return numpy


def fresh_array(count, dtype, offset=0):
    """A zero array on pages the kernel maps anew (a private anonymous mmap,
    the memory malloc gives a large NumPy array): not yet touched, unlike
    malloc's, which may come back already faulted in; it starts ``offset``
    bytes into its first page.  Private, not ``mmap.mmap(-1, n)``'s default
    shared mapping: shared anonymous pages are shmem, whose page faults cost
    more and which no program's arrays are."""
    import mmap
    np = _np()
    dtype = np.dtype(dtype)
    buf = mmap.mmap(-1, max(1, count * dtype.itemsize + offset),
                    flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return np.frombuffer(buf, dtype=dtype, count=count, offset=offset)


def new_array(count, dtype, fresh=False, offset=None):
    """The zero array of a stack's alloc: malloc'd by NumPy (where it lands
    in a page depends on what was allocated before), or, with ``offset``,
    pages of its own, starting ``offset`` bytes into the first one; new,
    untouched pages with ``fresh``."""
    if offset is None and not fresh:
        return _np().zeros(count, dtype=dtype)
    a = fresh_array(count, dtype, offset or 0)
    if not fresh:
        a[:] = 0   # touched, as malloc's would mostly be
    return a


def detect_stack():
    """Guess the stack from the launcher's environment variables."""
    env = os.environ
    if env.get("BENCH_STACK"):
        return env["BENCH_STACK"]
    if "ERDMA_RANK" in env:
        return "erdmampi"
    if "PMI_RANK" in env or "PMI_SIZE" in env or "MPI_LOCALRANKID" in env:
        return "mpi4py"
    if "MASTER_ADDR" in env and "RANK" in env and "WORLD_SIZE" in env:
        return "gloo"
    return "erdmampi"


def add_common_args(p):
    p.add_argument("--stack", "--mpi", dest="stack", choices=STACKS, default=None,
                   help="what to benchmark (default: $BENCH_STACK, else guessed from "
                        "the launcher: erdmarun -> erdmampi, mpiexec -> mpi4py, "
                        "gloorun/torchrun -> gloo)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repetitions per size; the median is reported (default 5)")
    p.add_argument("--target-time", type=float, default=0.25, metavar="SECONDS",
                   help="lower the calls per repetition so that one repetition takes "
                        "about this long, judged from the warm-up (default 0.25)")
    p.add_argument("--json", metavar="PATH", help="write the results as JSON (rank 0)")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")


class Stack:
    """The operations the benchmarks time, over one of the three stacks.

    ``alloc(count, dtype)`` returns ``(buf, view)``: ``buf`` is passed to the
    stack's calls, ``view`` is a numpy array over the same memory.
    ``op(name, send, recv)`` returns a no-argument callable doing one call.
    """
    name = "?"
    allreduce_in_place = False
    rank = 0
    size = 1

    def library(self):
        return self.name

    def wtime(self):
        return time.perf_counter()

    def settings(self):
        """What the stack chose at start-up that changes the figures, every
        rank's (a collective call; {} if nothing)."""
        return {}


class MPIStack(Stack):
    def __init__(self, name):
        import importlib
        self.name = name
        self.MPI = MPI = importlib.import_module(name + ".MPI")
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.wtime = MPI.Wtime

    def library(self):
        try:
            lib = self.MPI.Get_library_version().strip().splitlines()[0]
        except Exception:  # a library without Get_library_version
            lib = self.name
        return "%s (%s)" % (self.name, " ".join(lib.split()))

    def alloc(self, count, dtype, fresh=False, offset=None):
        a = new_array(count, dtype, fresh, offset)
        return a, a

    def settings(self):
        """erdmampi: from which size each rank sends a collective's blocks to a
        rank of its host by CMA rather than through the ring (None: never),
        which start-up measures (ERDMA_SHM_BULK_CMA unset) and may choose
        differently from one launch, or rank, to the next."""
        if self.name != "erdmampi":
            return {}
        from erdmampi.bootstrap import init_world
        mine = init_world().config()["shm_bulk_cma_min"]
        return {"shm_bulk_cma_min": self.comm.allgather(mine)}

    def barrier(self):
        self.comm.Barrier()

    def max(self, x):
        return self.comm.allreduce(x, op=self.MPI.MAX)

    def all(self, flag):
        return bool(self.comm.allreduce(bool(flag), op=self.MPI.LAND))

    #: pass bare arrays (the datatype from the array, as most programs do)
    #: instead of [array, datatype]; set by a benchmark's --plain
    plain = False
    _TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INT", "int64": "INT64_T",
              "uint8": "UNSIGNED_CHAR"}

    def _spec(self, a):
        if self.plain:
            return a
        return [a, getattr(self.MPI, self._TYPES.get(a.dtype.name, "BYTE"))]

    def send(self, buf, dest):
        spec = self._spec(buf)
        comm = self.comm
        return lambda: comm.Send(spec, dest=dest, tag=1)

    def recv(self, buf, source):
        spec = self._spec(buf)
        comm = self.comm
        return lambda: comm.Recv(spec, source=source, tag=1)

    def op(self, name, send, recv):
        c, SUM = self.comm, self.MPI.SUM
        s, r = self._spec(send), self._spec(recv) if recv is not None else None
        if name == "allreduce":
            return lambda: c.Allreduce(s, r, op=SUM)
        if name == "bcast":
            return lambda: c.Bcast(s, root=0)
        if name == "allgather":
            return lambda: c.Allgather(s, r)
        if name == "alltoall":
            return lambda: c.Alltoall(s, r)
        if name == "reduce_scatter":
            return lambda: c.Reduce_scatter_block(s, r, op=SUM)
        raise ValueError("unknown collective %r" % name)

    def close(self):
        self.comm.Barrier()


class GlooStack(Stack):
    name = "gloo"
    #: all_reduce works in place: the input is expected in recv
    allreduce_in_place = True

    def __init__(self):
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        timeout = datetime.timedelta(seconds=float(os.environ.get("BENCH_GLOO_TIMEOUT", "300")))
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self._scalar = torch.zeros(1, dtype=torch.float64)

    def library(self):
        return "gloo (torch %s)" % self.torch.__version__

    def alloc(self, count, dtype, fresh=False, offset=None):
        a = new_array(count, dtype, fresh, offset)
        t = self.torch.from_numpy(a)
        return t, t.numpy()

    def barrier(self):
        self.dist.barrier()

    def max(self, x):
        self._scalar[0] = x
        self.dist.all_reduce(self._scalar, op=self.dist.ReduceOp.MAX)
        return float(self._scalar[0])

    def all(self, flag):
        return self.max(0.0 if flag else 1.0) == 0.0

    def send(self, buf, dest):
        dist = self.dist
        return lambda: dist.send(buf, dest)

    def recv(self, buf, source):
        dist = self.dist
        return lambda: dist.recv(buf, source)

    def op(self, name, send, recv):
        dist = self.dist
        if name == "allreduce":
            # gloo reduces in place, in recv (see allreduce_in_place)
            return lambda: dist.all_reduce(recv)
        if name == "bcast":
            return lambda: dist.broadcast(send, src=0)
        if name == "allgather":
            f = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            return lambda: f(recv, send)
        if name == "alltoall":
            return lambda: dist.all_to_all_single(recv, send)
        if name == "reduce_scatter":
            f = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            return lambda: f(recv, send)
        raise ValueError("unknown collective %r" % name)

    def close(self):
        self.dist.barrier()
        self.dist.destroy_process_group()


def open_stack(name=None):
    name = name or detect_stack()
    if name == "gloo":
        return GlooStack()
    if name in ("erdmampi", "mpi4py"):
        return MPIStack(name)
    raise ValueError("unknown stack %r (choose from %s)" % (name, ", ".join(STACKS)))


def time_calls(stack, fn, max_calls, warmup, repeats, target=0.25):
    """Seconds per call: the median over ``repeats`` repetitions, each timed as
    the slowest rank's mean over ``calls`` calls, after 2 x ``warmup`` calls
    (at least one each; the second pass estimates the time per call). ``calls`` is ``max_calls``, lowered so that one
    repetition takes about ``target`` seconds going by the warm-up, but not
    below min(3, max_calls); all ranks agree on it. Returns (median, [per-repetition values], calls)."""
    warmup = max(1, warmup)
    for _ in range(warmup):
        fn()
    # estimate from a second, timed pass: the first may include one-off costs
    # (connection set-up, page faults) that would shrink ``calls`` too far
    stack.barrier()
    t0 = stack.wtime()
    for _ in range(warmup):
        fn()
    est = stack.max((stack.wtime() - t0) / warmup)
    # a noisy warm-up may overestimate: keep at least 3 calls (or max_calls)
    calls = int(max(min(3, max_calls), min(max_calls, target / est if est > 0 else max_calls)))
    times = []
    for _ in range(repeats):
        stack.barrier()
        t0 = stack.wtime()
        for _ in range(calls):
            fn()
        t = (stack.wtime() - t0) / calls
        times.append(stack.max(t))
    return statistics.median(times), times, calls


def time_each(stack, make_fn, calls, warmup):
    """Seconds per call, OSU style: every call timed alone after a barrier,
    the slowest rank's time per call, the median over ``calls`` calls.
    ``make_fn()`` gives the call to time (it may allocate fresh buffers:
    that happens before the barrier, outside the timed region).  Returns
    (median, [per-call values], calls)."""
    for _ in range(max(1, warmup)):
        make_fn()()
    times = []
    for _ in range(calls):
        fn = make_fn()
        stack.barrier()
        t0 = stack.wtime()
        fn()
        times.append(stack.max(stack.wtime() - t0))
        del fn
    return statistics.median(times), times, calls


def parse_env_spec(name, spec):
    """A variant's 'K=V,K=V' -> {K: V} (ValueError naming the variant on a bad pair)."""
    env = {}
    for kv in filter(None, spec.split(",")):
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise ValueError("variant %s: expected K=V, got %r" % (name, kv))
        env[k] = v
    return env


def git_head():
    """Short commit id of the tree the benchmarks run from ("?" if unknown)."""
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=5).stdout.strip() or "?"
    except Exception:
        return "?"


def write_between_markers(path, text, begin, end, required=False):
    """Write ``text`` to ``path``; if the file exists and holds the ``begin`` and
    ``end`` marker lines, replace only what lies between them (a hand-written
    page around generated tables).  ``required``: a file without them is an
    error rather than overwritten."""
    if os.path.exists(path):
        old = open(path).read()
        if begin in old and end in old:
            head, rest = old.split(begin, 1)
            text = head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1]
        elif required:
            raise ValueError("%s has no markers %s ... %s" % (path, begin, end))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text if text.endswith("\n") else text + "\n")


def write_json(path, benchmark, stack, args, results, settings=None):
    doc = {"benchmark": benchmark, "stack": stack.name, "library": stack.library(),
           "nprocs": stack.size, "host": platform.node(), "python": platform.python_version(),
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "args": {k: v for k, v in vars(args).items() if k != "json"},
           "settings": settings or {}, "results": results}
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)
    return doc


def say(args, stack, text):
    if stack.rank == 0 and not args.quiet:
        print(text, flush=True)


def fail(msg, code=2):
    print("bench: " + msg, file=sys.stderr, flush=True)
    return code
