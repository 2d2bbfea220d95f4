"""Run the ping-pong and Allreduce benchmarks on erdmampi and on mpi4py+MPICH.

erdmampi runs under erdmarun, mpi4py (Debian MPICH) under mpiexec. The stacks
alternate within one command (A B, then B A, ...) because this machine's speed
drifts over time; compare the ratios, not the absolute numbers across runs.

    python bench/run_all.py [--rounds 2] [--np 4] [--max-size 64MiB] [--quick]

The per-size median over rounds is printed for each stack together with the
ratio erdmampi / mpi4py. Every run's JSON and a summary JSON go to --outdir
(default bench/results/<time>/).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from pingpong import parse_size  # noqa: E402

STACKS = ("erdmampi", "mpi4py")
# benchmark -> (metric columns, the one whose ratio is printed first)
METRICS = {
    "pingpong": ("latency_us", "bandwidth_GBps"),
    "allreduce": ("time_us", "busbw_GBps"),
}


def find_launcher(stack):
    bindir = os.path.dirname(sys.executable)
    if stack == "erdmampi":
        names = ["erdmarun"]
    else:  # prefer MPICH's own name in case another MPI owns "mpiexec"
        names = ["mpiexec.mpich", "mpiexec.hydra", "mpiexec"]
    for name in names:
        cand = os.path.join(bindir, name)
        path = cand if os.access(cand, os.X_OK) else shutil.which(name)
        if path:
            return path
    sys.exit("run_all: %s not found (run scripts/setup.sh)" % " / ".join(names))


def run_one(stack, bench, nprocs, extra, outdir, tag, timeout):
    out = os.path.join(outdir, "%s-%s-%s.json" % (bench, stack, tag))
    cmd = [find_launcher(stack), "-n", str(nprocs), sys.executable,
           os.path.join(HERE, bench + ".py"), "--mpi", stack, "--json", out] + extra
    print("$ " + " ".join(cmd), flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, timeout=timeout)
    if proc.returncode != 0:
        sys.exit("run_all: %s on %s failed with exit code %d" % (bench, stack, proc.returncode))
    print("  (%.1f s)" % (time.time() - t0), flush=True)
    with open(out) as f:
        return json.load(f)


def summarize(bench, runs):
    """runs: stack -> list of JSON docs -> {stack: {bytes: {metric: median}}}"""
    table = {}
    for stack, docs in runs.items():
        per = {}
        for doc in docs:
            for row in doc["results"]:
                for m in METRICS[bench]:
                    per.setdefault(row["bytes"], {}).setdefault(m, []).append(row[m])
        table[stack] = {b: {m: statistics.median(v) for m, v in ms.items()}
                        for b, ms in per.items()}
    return table


LABELS = {"latency_us": "lat_us", "bandwidth_GBps": "bw_GBps",
          "time_us": "time_us", "busbw_GBps": "busbw_GBps"}


def print_table(bench, nprocs, table):
    m1, m2 = METRICS[bench]
    stacks = [s for s in STACKS if s in table]
    both = len(stacks) == 2
    print("\n## %s, %d processes (median over rounds)" % (bench, nprocs))
    cols = ["%s %s" % (s, LABELS[m]) for s in stacks for m in (m1, m2)]
    if both:
        cols += ["ratio " + LABELS[m1], "ratio " + LABELS[m2]]
    print("%12s" % "bytes" + "".join(" %19s" % c for c in cols))
    for b in sorted(set().union(*(table[s].keys() for s in stacks))):
        vals = [table[s].get(b, {}).get(m, float("nan")) for s in stacks for m in (m1, m2)]
        if both and b in table["erdmampi"] and b in table["mpi4py"]:
            e, m = table["erdmampi"][b], table["mpi4py"][b]
            vals += [e[m1] / m[m1], e[m2] / m[m2]]
        print("%12d" % b + "".join(" %19.4g" % v for v in vals))
    if both:
        print("(ratio = erdmampi / mpi4py; for %s lower is better, for %s higher is better)"
              % (LABELS[m1], LABELS[m2]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stacks", default=",".join(STACKS),
                   help="comma-separated subset of %s (default both)" % ",".join(STACKS))
    p.add_argument("--bench", default="pingpong,allreduce", help="default pingpong,allreduce")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    p.add_argument("--np", type=int, default=max(2, min(4, os.cpu_count() or 2)),
                   help="processes for allreduce (default min(4, cores), at least 2); "
                        "pingpong always uses 2")
    p.add_argument("--max-size", help="passed to both benchmarks")
    p.add_argument("--repeats", type=int, help="passed to both benchmarks")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: up to 1MiB, 3 repeats, 1 round")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    p.add_argument("--outdir", default=os.path.join(HERE, "results", time.strftime("%Y%m%d-%H%M%S")))
    args = p.parse_args(argv)

    stacks = [s for s in args.stacks.split(",") if s]
    benches = [b for b in args.bench.split(",") if b]
    for s in stacks:
        if s not in STACKS:
            p.error("unknown stack %r" % s)
    for b in benches:
        if b not in METRICS:
            p.error("unknown benchmark %r" % b)
    extra = []
    if args.quick:
        args.rounds = 1
        extra += ["--max-size", "1MiB", "--repeats", "3"]
    if args.max_size:
        extra += ["--max-size", str(parse_size(args.max_size))]
    if args.repeats:
        extra += ["--repeats", str(args.repeats)]
    os.makedirs(args.outdir, exist_ok=True)

    summary = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "args": vars(args), "results": {}}
    for bench in benches:
        nprocs = 2 if bench == "pingpong" else args.np
        runs = {s: [] for s in stacks}
        for rnd in range(args.rounds):
            order = stacks if rnd % 2 == 0 else stacks[::-1]
            for stack in order:
                runs[stack].append(run_one(stack, bench, nprocs, extra, args.outdir,
                                           "r%d" % rnd, args.timeout))
        table = summarize(bench, runs)
        print_table(bench, nprocs, table)
        summary["results"][bench] = {
            "nprocs": nprocs,
            "libraries": {s: runs[s][0]["library"] for s in stacks},
            "median": {s: {str(b): v for b, v in t.items()} for s, t in table.items()},
        }
        if len(stacks) == 2:
            m1, m2 = METRICS[bench]
            summary["results"][bench]["ratio_erdmampi_over_mpi4py"] = {
                str(b): {m: table["erdmampi"][b][m] / table["mpi4py"][b][m] for m in (m1, m2)}
                for b in table["erdmampi"] if b in table["mpi4py"]}
    path = os.path.join(args.outdir, "summary.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print("\nwrote %s" % path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
