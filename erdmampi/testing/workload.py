"""One collective workload for three stacks, for runs on the WAN bed::

    python -m erdmampi.testing.workload --stack erdmampi|mpi4py|gloo \\
        [--op allreduce|bcast] [--count N] [--iters K] [--warmup W]

Every rank checks its result (exact: small integers in float32) and exits 1 on
a mismatch; rank 0 prints one JSON line ``{"stack", "op", "size", "bytes",
"times": [seconds per iteration], "ok": true}``.  Rank and size come from each
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

    def close(self):
        self.dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m erdmampi.testing.workload")
    ap.add_argument("--stack", choices=["erdmampi", "mpi4py", "gloo"], required=True)
    ap.add_argument("--op", choices=["allreduce", "bcast"], default="allreduce")
    ap.add_argument("--count", type=int, default=1 << 18, help="float32 elements")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    a = ap.parse_args(argv)
    st = _GlooStack() if a.stack == "gloo" else _MPIStack(a.stack)
    base, x = _inputs(a.count, st.rank)
    want = _expected(a.op, base, st.size)
    out = np.empty_like(x)
    times, ok = [], True
    for i in range(a.warmup + a.iters):
        out.fill(-1)
        st.barrier()
        t0 = time.perf_counter()
        st.run(a.op, x, out)
        dt = time.perf_counter() - t0
        if not np.array_equal(out, want):
            bad = int(np.count_nonzero(out != want))
            print(f"rank {st.rank}: iteration {i}: {bad} of {a.count} elements wrong",
                  file=sys.stderr, flush=True)
            ok = False
        if i >= a.warmup:
            times.append(dt)
    all_ok = st.gather_ok(ok)
    if st.rank == 0:
        print(json.dumps({"stack": a.stack, "op": a.op, "size": st.size,
                          "bytes": int(x.nbytes), "times": times, "ok": all_ok}), flush=True)
    st.close()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
