"""One collective workload for three stacks, for runs on the WAN bed::

    python -m erdmampi.testing.workload --stack erdmampi|mpi4py|gloo \\
        [--op allreduce|bcast] [--count N] [--iters K] [--warmup W]
        [--warmup-count N] [--max-seconds S] [--progress] [--input NPY]

Every rank checks its result and exits 1 on a mismatch: exactly for the
default inputs (small integers in float32), and for ``--input`` data (a float32
``.npy`` file of at least ``size * count`` elements, rank r taking the r-th
``count`` of them, e.g. real gradients for runs that compress) exactly for
Bcast and 2-rank Allreduce, within the rounding bound of a sum in any order
otherwise; rank 0 prints one JSON line ``{"stack", "op", "size", "bytes",
"times": [seconds per iteration], "ok": true}``.

For benchmarks that may be killed part-way (bench/wan.py):
``--warmup-count N`` runs the warm-up iterations with N elements instead of
``--count`` (connections up without paying for a full-size transfer);
``--max-seconds S`` stops after the first timed iteration that ends more than S
seconds after the timed iterations began (all ranks agree, one small Allreduce
per iteration); ``--progress`` makes rank 0 print ``{"event": "begin", "iter",
"warmup", "wall"}`` (``time.time()`` after the barrier) before each iteration
and every rank print ``{"event": "iter", "rank", "iter", "warmup", "time",
"ok"}`` after it, so a killed run still tells what it finished and how long
the unfinished iteration had been running.  Rank and size come from each
stack's own launcher contract (erdmampi: ERDMA_*; mpi4py: mpiexec; gloo:
``init_method="env://"`` with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).
"""
import argparse
import json
import sys
import time

import numpy as np


def _inputs(count, rank):
    base = (np.arange(count, dtype=np.int64) % 1024).astype(np.float32)
    return base, base + np.float32(rank)


def _expected(op, base, size):
    if op == "allreduce":
        return base * np.float32(size) + np.float32(size * (size - 1) // 2)
    return base                       # bcast from rank 0: rank 0's input


def _file_inputs(path, count, rank, size, op):
    """(x, want, tol) from a float32 .npy: rank r's input is the r-th ``count``
    elements; ``tol`` is None for an exact check, else the per-element bound of
    a float32 sum of ``size`` terms in any order (size * eps * sum |x_i|)."""
    data = np.load(path, mmap_mode="r")
    if data.dtype != np.float32 or data.size < size * count:
        raise SystemExit("--input %s: need float32 with at least %d elements, got %s x %d"
                         % (path, size * count, data.dtype, data.size))
    flat = data.reshape(-1)
    parts = [np.array(flat[r * count:(r + 1) * count]) for r in range(size)]
    if op != "allreduce":
        return parts[rank], parts[0], None
    want = parts[0].copy()
    for p in parts[1:]:
        want += p
    if size <= 2:                      # a + b is the same float whichever rank adds
        return parts[rank], want, None
    mag = np.zeros(count, np.float64)
    for p in parts:
        mag += np.abs(p)
    return parts[rank], want, size * float(np.finfo(np.float32).eps) * mag


class _MPIStack:
    def __init__(self, name):
        if name == "erdmampi":
            from erdmampi import MPI
        else:
            from mpi4py import MPI
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()

    def barrier(self):
        self.comm.Barrier()

    def run(self, op, x, out):
        if op == "allreduce":
            self.comm.Allreduce(x, out, op=self.MPI.SUM)
        else:
            if self.rank == 0:
                out[...] = x
            self.comm.Bcast(out, root=0)

    def gather_ok(self, ok):
        return self.comm.allreduce(int(ok), op=self.MPI.MIN) == 1

    def max_times(self, times):
        import numpy as np
        t = np.array(times, dtype=np.float64)
        out = np.empty_like(t)
        self.comm.Allreduce(t, out, op=self.MPI.MAX)
        return out.tolist()

    def close(self):
        pass


class _GlooStack:
    def __init__(self):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        dist.init_process_group("gloo", init_method="env://")
        self.rank, self.size = dist.get_rank(), dist.get_world_size()

    def barrier(self):
        self.dist.barrier()

    def run(self, op, x, out):
        out[...] = x
        t = self.torch.from_numpy(out)     # shares memory with out
        if op == "allreduce":
            self.dist.all_reduce(t)
        else:
            self.dist.broadcast(t, src=0)

    def gather_ok(self, ok):
        t = self.torch.tensor([int(ok)])
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MIN)
        return int(t.item()) == 1

    def max_times(self, times):
        t = self.torch.tensor(times, dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return t.tolist()

    def close(self):
        self.dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m erdmampi.testing.workload")
    ap.add_argument("--stack", choices=["erdmampi", "mpi4py", "gloo"], required=True)
    ap.add_argument("--op", choices=["allreduce", "bcast"], default="allreduce")
    ap.add_argument("--count", type=int, default=1 << 18, help="float32 elements")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--warmup-count", type=int, default=None,
                    help="float32 elements of the warm-up iterations (default --count)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop after the timed iteration that ends this long after the "
                         "first timed one began (at least one timed iteration runs)")
    ap.add_argument("--input", metavar="NPY",
                    help="float32 .npy with size*count elements: rank r sends the r-th "
                         "count of them (default: small integers, checked exactly)")
    ap.add_argument("--progress", action="store_true",
                    help="JSON progress lines: 'begin' (rank 0) and 'iter' (every rank)")
    a = ap.parse_args(argv)
    st = _GlooStack() if a.stack == "gloo" else _MPIStack(a.stack)
    wcount = a.count if a.warmup_count is None else a.warmup_count
    bufs = {}
    for n in {a.count, wcount}:
        if a.input:
            x, want, tol = _file_inputs(a.input, n, st.rank, st.size, a.op)
        else:
            base, x = _inputs(n, st.rank)
            want, tol = _expected(a.op, base, st.size), None
        bufs[n] = (x, want, tol, np.empty_like(x))
    times, ok = [], True
    t_first = None
    for i in range(a.warmup + a.iters):
        warm = i < a.warmup
        n = wcount if warm else a.count
        x, want, tol, out = bufs[n]
        out.fill(-1)
        st.barrier()
        if a.progress and st.rank == 0:
            print(json.dumps({"event": "begin", "iter": i, "warmup": warm,
                              "wall": time.time()}), flush=True)
        t0 = time.perf_counter()
        if not warm and t_first is None:
            t_first = t0
        st.run(a.op, x, out)
        dt = time.perf_counter() - t0
        wrong = (out != want) if tol is None else ~(np.abs(out - want) <= tol)
        it_ok = not wrong.any()
        if not it_ok:
            bad = int(np.count_nonzero(wrong))
            print(f"rank {st.rank}: iteration {i}: {bad} of {n} elements wrong",
                  file=sys.stderr, flush=True)
            ok = False
        if a.progress:
            print(json.dumps({"event": "iter", "rank": st.rank, "iter": i, "warmup": warm,
                              "time": dt, "ok": it_ok}), flush=True)
        if not warm:
            times.append(dt)
            if (a.max_seconds is not None and i + 1 < a.warmup + a.iters
                    and not st.gather_ok(time.perf_counter() - t_first <= a.max_seconds)):
                break
    all_ok = st.gather_ok(ok)
    # every rank ran the same iterations (the early stop is agreed): the slowest rank's
    # time of each, in the one record that rank 0 prints (per-rank progress lines may
    # be lost by a launcher that forwards output, as MPICH's hydra now and then does)
    times_max = st.max_times(times) if times else []
    if st.rank == 0:
        x = bufs[a.count][0]
        print(json.dumps({"stack": a.stack, "op": a.op, "size": st.size,
                          "bytes": int(x.nbytes), "times": times, "times_max": times_max,
                          "ok": all_ok}), flush=True)
    st.close()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
