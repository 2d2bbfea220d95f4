"""OSU-style ping-pong between ranks 0 and 1 (latency and bandwidth).

Written against the mpi4py API; the MPI module is chosen at run time:

    erdmarun -n 2 python bench/pingpong.py --mpi erdmampi
    mpiexec  -n 2 python bench/pingpong.py --mpi mpi4py

For each message size, rank 0 sends the buffer to rank 1, which sends it back
(Send/Recv of a numpy uint8 array). After warm-up round trips, the timed
round trips are repeated --repeats times; the reported one-way latency is the
median over repeats of (time of the repeat) / (2 * round trips), and the
bandwidth is size / latency (10^9 bytes per second). Other ranks only wait.
Rank 0 prints a table and, with --json, writes the results.
"""
import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import time

KIB, MIB = 1 << 10, 1 << 20


def parse_size(text):
    """'8', '4K', '4KiB', '64M', '64MiB' -> bytes."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": KIB, "M": MIB, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mpi", choices=["erdmampi", "mpi4py"],
                   default=os.environ.get("BENCH_MPI", "erdmampi"),
                   help="MPI module to import (default: $BENCH_MPI or erdmampi)")
    p.add_argument("--min-size", type=parse_size, default=8, help="smallest message (default 8)")
    p.add_argument("--max-size", type=parse_size, default=64 * MIB,
                   help="largest message (default 64MiB)")
    p.add_argument("--repeats", type=int, default=5, help="timed repetitions per size (default 5)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed round trips per size, scaled down for large sizes (default 10)")
    p.add_argument("--budget", type=parse_size, default=32 * MIB,
                   help="bytes moved one way per repetition; sets round trips per size "
                        "(1 to 1000; default 32MiB)")
    p.add_argument("--json", metavar="PATH", help="write results as JSON (rank 0)")
    return p.parse_args(argv)


def sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 2


def main(argv=None):
    args = parse_args(argv)
    MPI = importlib.import_module(args.mpi + ".MPI")
    import numpy as np

    comm = MPI.COMM_WORLD
    rank, nprocs = comm.Get_rank(), comm.Get_size()
    if nprocs < 2:
        if rank == 0:
            print("pingpong needs at least 2 processes", file=sys.stderr)
        return 2

    results = []
    if rank == 0:
        print("# pingpong (%s), %d processes, ranks 0 <-> 1" % (args.mpi, nprocs))
        print("# %12s %8s %14s %14s" % ("bytes", "iters", "latency_us", "bandwidth_GBps"))
    for size in sizes(args.min_size, args.max_size):
        buf = np.zeros(size, dtype=np.uint8)
        iters = max(1, min(1000, args.budget // size))
        warmup = max(1, min(args.warmup, iters))
        times = []
        for rep in range(-1, args.repeats):  # rep -1 is the warm-up
            n = warmup if rep < 0 else iters
            comm.Barrier()
            t0 = MPI.Wtime()
            if rank == 0:
                for _ in range(n):
                    comm.Send([buf, MPI.BYTE], dest=1, tag=1)
                    comm.Recv([buf, MPI.BYTE], source=1, tag=1)
            elif rank == 1:
                for _ in range(n):
                    comm.Recv([buf, MPI.BYTE], source=0, tag=1)
                    comm.Send([buf, MPI.BYTE], dest=0, tag=1)
            t1 = MPI.Wtime()
            if rep >= 0:
                times.append((t1 - t0) / (2 * n))
        if rank == 0:
            lat = statistics.median(times)
            row = {"bytes": size, "iters": iters, "repeats": args.repeats,
                   "latency_us": lat * 1e6, "bandwidth_GBps": size / lat / 1e9,
                   "latency_us_all": [t * 1e6 for t in times]}
            results.append(row)
            print("  %12d %8d %14.2f %14.4f"
                  % (size, iters, row["latency_us"], row["bandwidth_GBps"]), flush=True)

    if rank == 0 and args.json:
        write_json(args.json, "pingpong", args, MPI, nprocs, results)
    comm.Barrier()
    return 0


def library_version(MPI):
    try:
        return MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # a library without Get_library_version
        return getattr(MPI, "__name__", "?")


def write_json(path, name, args, MPI, nprocs, results):
    doc = {"benchmark": name, "mpi": args.mpi, "library": library_version(MPI),
           "nprocs": nprocs, "host": platform.node(), "python": platform.python_version(),
           "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": vars(args),
           "results": results}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
