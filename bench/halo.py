"""Halo exchange with subarray datatypes: the stencil pattern, per exchange.

Each rank owns an N x N float64 block with a one-cell halo ((N+2) x (N+2)
array) and swaps its four edges with its neighbours on a periodic ring of
ranks: the north/south rows (contiguous) and the east/west columns
(strided), each described by ``Create_subarray`` and moved by ``Sendrecv``
of ``[array, 1, type]``, as stencil codes written for mpi4py do.  Data is
random (incompressible).  Runs on erdmampi and mpi4py+MPICH, alternated;
gloo has no derived datatypes and is not run.

    python -m bench.halo                       # 2 ranks, N = 64,256,1024,4096, 3 rounds
    python -m bench.halo --sizes 256,2048 --rounds 5 --json out.json --md out.md
    erdmarun -n 2 python -m bench.halo --worker --stack erdmampi

Reported: the median over rounds of the per-exchange time (slowest rank's
mean over the timed exchanges), and mpi4py+MPICH / erdmampi (above 1:
erdmampi is faster).  Every exchange's halos are checked once per job.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import open_stack, time_calls  # noqa: E402

STACKS = ("erdmampi", "mpi4py")


def halo_types(MPI, n):
    """Subarray types of the (n+2)^2 array: the four edges sent and the four
    halos received (north, south, west, east)."""
    full = [n + 2, n + 2]

    def sub(sizes, starts):
        return MPI.DOUBLE.Create_subarray(full, sizes, starts).Commit()
    send = [sub([1, n], [1, 1]), sub([1, n], [n, 1]), sub([n, 1], [1, 1]), sub([n, 1], [1, n])]
    recv = [sub([1, n], [0, 1]), sub([1, n], [n + 1, 1]), sub([n, 1], [1, 0]), sub([n, 1], [1, n + 1])]
    return send, recv


def worker(args):
    import numpy as np
    st = open_stack(args.stack)
    MPI, comm = st.MPI, st.comm
    r, size = st.rank, st.size
    up, down = (r - 1) % size, (r + 1) % size
    out = {}
    for n in [int(x) for x in args.sizes.split(",")]:
        a = np.random.default_rng(r).random((n + 2, n + 2))
        send, recv = halo_types(MPI, n)

        def exchange():
            # north edge to the rank above, its south edge into our north halo, ...
            comm.Sendrecv([a, 1, send[0]], up, 1, [a, 1, recv[1]], down, 1)
            comm.Sendrecv([a, 1, send[1]], down, 2, [a, 1, recv[0]], up, 2)
            comm.Sendrecv([a, 1, send[2]], up, 3, [a, 1, recv[3]], down, 3)
            comm.Sendrecv([a, 1, send[3]], down, 4, [a, 1, recv[2]], up, 4)

        exchange()
        ref = [np.random.default_rng(p).random((n + 2, n + 2)) for p in (up, down)]
        ok = (np.array_equal(a[n + 1, 1:n + 1], ref[1][1, 1:n + 1]) and
              np.array_equal(a[0, 1:n + 1], ref[0][n, 1:n + 1]) and
              np.array_equal(a[1:n + 1, n + 1], ref[1][1:n + 1, 1]) and
              np.array_equal(a[1:n + 1, 0], ref[0][1:n + 1, n]))
        if not ok:
            raise SystemExit(f"rank {r}: wrong halo after the exchange (N={n})")
        med, _, calls = time_calls(st, exchange, args.iters, max(2, args.iters // 20), 3)
        out[str(n)] = {"us": med * 1e6, "calls": calls}
        for t in send + recv:
            t.Free()
    if r == 0:
        doc = {"stack": st.name, "library": st.library(), "np": size, "us": out}
        with open(args.json, "w") as f:
            json.dump(doc, f)
    st.close()
    return 0


def _launch(stack, n, json_out, args):
    from bench.run_all import check_stacks, launch_cmd
    ok, skipped = check_stacks([stack])
    if not ok:
        print(f"{stack} skipped: {skipped[stack]}", file=sys.stderr)
        return None
    cmd = launch_cmd(stack, n) + ["-m", "bench.halo", "--worker", "--stack", stack,
                                  "--json", json_out, "--iters", str(args.iters),
                                  "--sizes", args.sizes]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if os.path.exists(json_out):
        os.unlink(json_out)
    p = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=args.timeout)
    if p.returncode != 0 or not os.path.exists(json_out):
        print(f"{stack} -n {n} failed ({p.returncode}):\n{p.stdout[-2000:]}", file=sys.stderr)
        return None
    with open(json_out) as f:
        return json.load(f)


def table(results, stacks, sizes, nprocs):
    lines = [f"**{nprocs} ranks, one host** (µs per exchange of 4 halos, median of rounds; "
             "float64, random data)", "",
             "| N | " + " | ".join(stacks) + " | mpi4py / erdmampi |",
             "|---:|" + "---:|" * (len(stacks) + 1)]
    for n in sizes:
        med = {}
        for s in stacks:
            xs = [d["us"][str(n)]["us"] for d in results.get(s, []) if str(n) in d["us"]]
            med[s] = statistics.median(xs) if xs else None
        e, m = med.get("erdmampi"), med.get("mpi4py")
        ratio = f"{m / e:.2f}" if e and m else "–"
        cells = [f"{med[s]:.1f}" if med[s] is not None else "–" for s in stacks]
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1], allow_abbrev=False)
    p.add_argument("--worker", action="store_true", help="run one job's ranks (under a launcher)")
    p.add_argument("--stack", help="worker: erdmampi or mpi4py")
    p.add_argument("--stacks", default=",".join(STACKS), help="driver: stacks to run")
    p.add_argument("--np", type=int, default=2, help="driver: ranks (default 2)")
    p.add_argument("--sizes", default="64,256,1024,4096", help="block edges N")
    p.add_argument("--rounds", type=int, default=3, help="driver: rounds per stack")
    p.add_argument("--iters", type=int, default=400, help="most timed exchanges per size")
    p.add_argument("--timeout", type=float, default=600.0, help="driver: seconds per job")
    p.add_argument("--json", help="worker: rank 0's JSON; driver: all results")
    p.add_argument("--md", help="driver: write the markdown table here too")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    stacks = [s for s in args.stacks.split(",") if s]
    results, tmp = {}, f"/tmp/bench-halo-{os.getpid()}.json"
    for rnd in range(args.rounds):
        for s in stacks[rnd % len(stacks):] + stacks[:rnd % len(stacks)]:
            doc = _launch(s, args.np, tmp, args)
            if doc is not None:
                results.setdefault(s, []).append(doc)
    sizes = [int(x) for x in args.sizes.split(",")]
    text = table(results, stacks, sizes, args.np)
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
