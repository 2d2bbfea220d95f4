"""Allreduce bandwidth of float32 arrays (SUM), reported as nccl-tests does.

Written against the mpi4py API; the MPI module is chosen at run time:

    erdmarun -n 4 python bench/allreduce.py --mpi erdmampi
    mpiexec  -n 4 python bench/allreduce.py --mpi mpi4py

For each size, every rank calls Allreduce(send, recv, SUM) on float32 numpy
arrays. After warm-up calls, the timed calls are repeated --repeats times; the
time of one call in a repetition is the slowest rank's mean (MAX over ranks),
and the reported time is the median over repetitions. As in nccl-tests:
algbw = bytes / time and busbw = algbw * 2 * (n - 1) / n, with n processes
(10^9 bytes per second). The result of each size is checked once.
Rank 0 prints a table and, with --json, writes the results.
"""
import argparse
import importlib
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pingpong import MIB, KIB, parse_size, sizes, write_json  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mpi", choices=["erdmampi", "mpi4py"],
                   default=os.environ.get("BENCH_MPI", "erdmampi"),
                   help="MPI module to import (default: $BENCH_MPI or erdmampi)")
    p.add_argument("--min-size", type=parse_size, default=4 * KIB,
                   help="smallest array in bytes (default 4KiB)")
    p.add_argument("--max-size", type=parse_size, default=64 * MIB,
                   help="largest array in bytes (default 64MiB)")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per size (default 5)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed calls per size, scaled down for large sizes (default 5)")
    p.add_argument("--budget", type=parse_size, default=64 * MIB,
                   help="bytes reduced per repetition; sets calls per size (1 to 200; default 64MiB)")
    p.add_argument("--json", metavar="PATH", help="write results as JSON (rank 0)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    MPI = importlib.import_module(args.mpi + ".MPI")
    import numpy as np

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    results = []
    if rank == 0:
        print("# allreduce float32 SUM (%s), %d processes" % (args.mpi, n))
        print("# %12s %10s %8s %12s %12s %12s"
              % ("bytes", "count", "iters", "time_us", "algbw_GBps", "busbw_GBps"))
    for nbytes in sizes(args.min_size, args.max_size):
        count = nbytes // 4
        send = np.full(count, rank + 1, dtype=np.float32)
        recv = np.zeros(count, dtype=np.float32)
        comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
        ok = bool(np.all(recv == n * (n + 1) // 2))
        ok = comm.allreduce(ok, op=MPI.LAND)
        iters = max(1, min(200, args.budget // nbytes))
        warmup = max(1, min(args.warmup, iters))
        times = []
        for rep in range(-1, args.repeats):  # rep -1 is the warm-up
            calls = warmup if rep < 0 else iters
            comm.Barrier()
            t0 = MPI.Wtime()
            for _ in range(calls):
                comm.Allreduce([send, MPI.FLOAT], [recv, MPI.FLOAT], op=MPI.SUM)
            t = (MPI.Wtime() - t0) / calls
            t = comm.allreduce(t, op=MPI.MAX)
            if rep >= 0:
                times.append(t)
        if rank == 0:
            t = statistics.median(times)
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (n - 1) / n
            row = {"bytes": nbytes, "count": count, "iters": iters, "repeats": args.repeats,
                   "time_us": t * 1e6, "algbw_GBps": algbw, "busbw_GBps": busbw,
                   "correct": ok, "time_us_all": [x * 1e6 for x in times]}
            results.append(row)
            print("  %12d %10d %8d %12.1f %12.4f %12.4f%s"
                  % (nbytes, count, iters, row["time_us"], algbw, busbw,
                     "" if ok else "  WRONG RESULT"), flush=True)

    if rank == 0 and args.json:
        write_json(args.json, "allreduce", args, MPI, n, results)
    comm.Barrier()
    return 0 if all(r["correct"] for r in results) or rank != 0 else 1


if __name__ == "__main__":
    sys.exit(main())
