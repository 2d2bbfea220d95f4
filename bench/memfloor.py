"""The physical floor of a two-rank Alltoall on this host, next to the real one.

Builds ``bench/memfloor.c`` (a standalone C program: two processes pinned to
CPUs 0 and 1 move exactly an Alltoall's bytes with memcpy, ``rep movsb`` or
non-temporal stores, from shared pages or with process_vm_readv, on 4 KiB or
transparent huge pages) and runs its configurations alternated, round by
round, with the real ``Alltoall`` of erdmampi and of mpi4py+MPICH (and gloo's
``all_to_all_single`` if asked), all timed the same way: 200 calls, each
between two barriers, best and median per call.  The load average is noted
next to each figure::

    python -m bench.memfloor --rounds 3
    python -m bench.memfloor --floor nt256/shm/thp,memcpy/cma/4k --stacks erdmampi,mpi4py

Under a launcher (``--child``) it is the real-Alltoall loop itself.
"""
import argparse
import json
import os
import shutil
import subprocess
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "bench", "memfloor.c")
if __package__ in (None, ""):  # run as a file: python bench/memfloor.py
    sys.path.insert(0, ROOT)
from bench.common import parse_size  # noqa: E402

FLOOR_DEFAULT = ("memcpy/shm/4k,memcpy/shm/thp,movsb/shm/4k,movsb/shm/thp,"
                 "nt256/shm/4k,nt256/shm/thp,nt512/shm/thp,"
                 "memcpy/cma/4k,memcpy/cma/thp,nt256/cma/thp,nt256/cma1m/thp")


def build(outdir):
    exe = os.path.join(outdir, "memfloor")
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("memfloor: no C compiler (apt-get install gcc)")
    subprocess.run([cc, "-O2", "-Wall", "-o", exe, SRC], check=True)
    return exe


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_busy(dt=0.5):
    """Fraction of the host's CPU time busy over the next dt seconds."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = sample()
    time.sleep(dt)
    t1, i1 = sample()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(limit, most):
    """Wait up to `most` seconds for the CPUs to be busier than `limit` no
    more; -> the last busy fraction seen."""
    end = time.time() + most
    while True:
        b = cpu_busy()
        if b <= limit or time.time() > end:
            return b


def thp_kb():
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


# -- the real Alltoall, one rank (under erdmarun / mpiexec / gloorun) ---------

def child(args):
    import numpy as np
    stack = args.stack
    if stack == "gloo":
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        sbuf = torch.arange(args.size // 4, dtype=torch.float32) + rank
        rbuf = torch.empty_like(sbuf)

        def call():
            dist.all_to_all_single(rbuf, sbuf)

        def barrier():
            dist.barrier()
        expect = None
    else:
        if stack == "erdmampi":
            from erdmampi import MPI
        else:
            from mpi4py import MPI
        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        n = args.size // 4
        sbuf = np.arange(n, dtype=np.float32) + np.float32(rank * n)
        rbuf = np.empty_like(sbuf)

        def call():
            comm.Alltoall(sbuf, rbuf)

        def barrier():
            comm.Barrier()
        blk = n // size
        expect = np.concatenate([np.arange(blk * rank, blk * (rank + 1), dtype=np.float32)
                                 + np.float32(p * n) for p in range(size)])
    kb = thp_kb()
    for _ in range(args.warmup):
        call()
    times = []
    for _ in range(args.iters):
        barrier()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):  # back to back, as bench.collectives times them
        call()
    loop = (time.perf_counter() - t0) / args.iters
    ok = True if expect is None else bool(np.array_equal(rbuf, expect))
    if rank == 0:
        times.sort()
        print(json.dumps({"kind": "real", "stack": args.tag or stack, "size": args.size, "np": size,
                          "thp_kb": kb, "ok": ok,
                          "best_us": round(times[0] * 1e6, 1),
                          "p25_us": round(times[len(times) // 4] * 1e6, 1),
                          "median_us": round(statistics.median(times) * 1e6, 1),
                          "p90_us": round(times[len(times) * 9 // 10] * 1e6, 1),
                          "loop_us": round(loop * 1e6, 1), "iters": args.iters}), flush=True)
    if stack == "gloo":
        dist.destroy_process_group()
    elif not ok:
        raise SystemExit("rank %d: wrong Alltoall result" % rank)


def launch(spec, args):
    """spec: a stack, or erdmampi:ROOT for the engine built in another tree."""
    stack, _, root = spec.partition(":")
    bindir = os.path.dirname(sys.executable)
    py = [sys.executable]
    me = ["-m", "bench.memfloor", "--child", "--stack", stack, "--size", str(args.size),
          "--iters", str(args.iters), "--warmup", str(args.warmup), "--tag", spec]
    if stack == "erdmampi":
        cmd = [os.path.join(bindir, "erdmarun"), "-n", "2"] + py + me
    elif stack == "mpi4py":
        cmd = [shutil.which("mpiexec.mpich") or "mpiexec", "-n", "2"] + py + me
    else:
        cmd = py + ["-m", "bench.gloorun", "-n", "2", "--"] + py + me
    return cmd, root or ROOT


def run_one(cmd, root=ROOT, timeout=300, quiet=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    busy = wait_quiet(quiet, 60) if quiet is not None else None
    la = loadavg()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    rows = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode or not rows:
        sys.stderr.write("memfloor: %s failed (rc %s)\n%s%s" % (" ".join(cmd), p.returncode,
                                                               p.stdout[-2000:], p.stderr[-2000:]))
        return []
    for r in rows:
        r["load"] = la
        if busy is not None:
            r["busy_before"] = round(busy, 3)
    return rows


def label(r):
    if r["kind"] == "real":
        return "real %s" % r["stack"]
    if r["kind"] == "pvr":
        return "pvr %s %s" % (r["mode"], r["pages"])
    return "floor %s/%s/%s" % (r["copy"], r["remote"], r["pages"])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stack", default="erdmampi", help=argparse.SUPPRESS)
    ap.add_argument("--tag", default="", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=parse_size, default=16 << 20,
                    help="bytes per rank, e.g. 1048576 or 1MiB (default 16 MiB)")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--floor", default=FLOOR_DEFAULT,
                    help="COPY/REMOTE/PAGES,... (copy: memcpy movsb nt128 nt256 nt512; "
                         "remote: shm, cma (cma1m, cmaN: in 1 MiB or N KiB pieces), "
                         "bounce[N] (through a shared ring of 64 or N KiB chunks), "
                         "cmab[N] (CMA into a cached buffer, then the copy); "
                         "pages: 4k thp; '' for none)")
    ap.add_argument("--stacks", default="erdmampi,mpi4py",
                    help="real Alltoalls to alternate with: erdmampi, mpi4py, gloo, "
                         "erdmampi:ROOT (the engine built in tree ROOT)")
    ap.add_argument("--pvr", action="store_true", help="also the process_vm_readv page costs")
    ap.add_argument("--json", help="append every row to this JSON-lines file")
    ap.add_argument("--quiet", type=float, metavar="FRACTION",
                    help="before each run wait (up to 60 s) until the CPUs were at most this "
                         "busy over half a second (e.g. 0.1); the host is shared")
    args = ap.parse_args(argv)
    if args.size % 2:
        ap.error("--size: an even number of bytes (each rank's two blocks)")
    if args.child:
        return child(args)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(tmp)
        jobs = []
        for spec in filter(None, args.floor.split(",")):
            copy, remote, pages = spec.split("/")
            jobs.append(([exe, "a2a", copy, remote, pages, str(args.size),
                          str(args.iters), str(args.warmup)], ROOT))
        for s in filter(None, args.stacks.split(",")):
            jobs.append(launch(s, args))
        if args.pvr:
            jobs += [([exe, "pvr", "4k"], ROOT), ([exe, "pvr", "thp"], ROOT)]
        rows = []
        for rnd in range(args.rounds):
            order = jobs if rnd % 2 == 0 else jobs[::-1]
            for cmd, root in order:
                for r in run_one(cmd, root, quiet=args.quiet):
                    r["round"] = rnd
                    rows.append(r)
                    print("r%d %-28s best %8.1f  median %8.1f us%s  load %.2f%s%s" % (
                        rnd, label(r), r["best_us"], r["median_us"],
                        "  loop %.1f" % r["loop_us"] if "loop_us" in r else "", r["load"],
                        "  busy %.2f" % r["busy_before"] if "busy_before" in r else "",
                        "" if r.get("ok", True) else "  WRONG"), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                for r in rows:
                    f.write(json.dumps(r) + "\n")
        print("\nover rounds (us per call): best; medians over the rounds of: best, p25, "
              "median, back-to-back loop; load %.2f-%.2f"
              % (min(r["load"] for r in rows), max(r["load"] for r in rows)))
        for lab in dict.fromkeys(label(r) for r in rows):
            sel = [r for r in rows if label(r) == lab]

            def med(k):
                v = [r[k] for r in sel if k in r]
                return "%8.1f" % statistics.median(v) if v else "       -"
            print("%-30s %8.1f %s %s %s %s" % (lab, min(r["best_us"] for r in sel),
                                                med("best_us"), med("p25_us"),
                                                med("median_us"), med("loop_us")))


if __name__ == "__main__":
    sys.exit(main())
