"""Per-call time of the calls a script makes many times with small data:
Barrier, the rooted collectives (Gather, Scatter, Reduce), point-to-point of
buffers (Send/Recv ping-pong, Sendrecv around a ring, Irecv + Isend + Waitall
around a ring) and the lowercase pickle API (send/recv, sendrecv, bcast, gather,
scatter, allgather, alltoall, allreduce of small Python objects), on
erdmampi, mpi4py+MPICH and gloo.

    python -m bench.smallcalls                      # all stacks, 2 ranks, 3 rounds
    python -m bench.smallcalls --np 2,4 --rounds 5 --json out.json --md out.md
    erdmarun -n 2 python -m bench.smallcalls --worker --stack erdmampi

The driver runs one job per stack and round, alternating the stacks (this
machine's speed drifts), and reports each call's median over the rounds and
the ratio to erdmampi.  In a job every call is warmed up, then timed over
``--iters`` calls (rank 0's mean per call; each call is a complete exchange,
so the ranks move in step).  Objects: a dict of an int, a 3-float list and a
short string (the kind of record scripts pass around).  Buffer calls:
``--bytes`` of float32 (default 4 KiB), root 0.  gloo (torch.distributed)
runs its counterparts: gather/scatter/reduce and send/recv, irecv + isend
on tensors, send/recv of objects, broadcast_object_list, gather_object,
scatter_object_list, all_gather_object; it has no Sendrecv, object
alltoall, allreduce or sendrecv ("-").  ``--set idioms`` times calls of
the same kinds written as programs often write them (the ``[array,
datatype]`` list made in the call, a new array every call, a Status,
``MPI.IN_PLACE``, ``bytes`` sent into a ``bytearray``), on the MPI stacks.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import open_stack  # noqa: E402

CALLS = ("Barrier", "Gather", "Scatter", "Reduce", "Send/Recv", "Sendrecv", "Isend/Irecv",
         "send/recv", "sendrecv", "bcast", "gather", "scatter", "allgather", "alltoall",
         "allreduce")
# the same kind of calls written as programs write them (--set idioms): the
# spec list made in the call, a new array every call, a Status, in place
IDIOMS = ("Send [a, T]", "Send [a, n, T]", "Send new array", "Recv Status",
          "Recv ANY_SOURCE", "Sendrecv_replace", "Allreduce new arrays", "Allreduce IN_PLACE",
          "Allreduce 1 float", "Bcast [a, T]", "Reduce new array", "Gather new array",
          "Allgather new array", "Isend [a, T]", "Send bytes")
ONE_WAY = ("Send/Recv", "send/recv", "Send [a, T]", "Send [a, n, T]", "Send new array",
           "Recv Status", "Recv ANY_SOURCE", "Send bytes")         # ping-pongs: half the round trip
RECORD = {"i": 1, "x": [1.0, 2.0, 3.0], "s": "hello"}


def mpi_calls(st, nbytes):
    import numpy as np
    c, MPI = st.comm, st.MPI
    r, n = st.rank, st.size
    cnt = max(1, nbytes // 4)
    s, big = np.ones(cnt, np.float32), np.zeros(cnt * n, np.float32)
    red = np.zeros(cnt, np.float32)
    peer, src = (r + 1) % n, (r - 1) % n
    recs = [RECORD] * n

    def pingpong():
        if r == 0:
            c.send(RECORD, 1, 3)
            c.recv(source=1, tag=4)
        elif r == 1:
            c.recv(source=0, tag=3)
            c.send(RECORD, 0, 4)

    def buf_pingpong():
        if r == 0:
            c.Send(s, 1, 5)
            c.Recv(red, 1, 6)
        elif r == 1:
            c.Recv(red, 0, 5)
            c.Send(s, 0, 6)

    def exchange():
        MPI.Request.Waitall([c.Irecv(red, src, 8), c.Isend(s, peer, 8)])
    def pp(send, recv):
        def f():
            if r == 0:
                send(1)
                recv(1)
            elif r == 1:
                recv(0)
                send(0)
        return f
    F = MPI.FLOAT
    ANY = MPI.ANY_SOURCE
    raw, rawin = s.tobytes(), bytearray(s.nbytes)
    one = np.zeros(1)
    idioms = {
        "Send [a, T]": pp(lambda d: c.Send([s, F], dest=d, tag=5),
                          lambda o: c.Recv([red, F], source=o, tag=5)),
        "Send [a, n, T]": pp(lambda d: c.Send([s, cnt, F], dest=d, tag=5),
                             lambda o: c.Recv([red, cnt, F], source=o, tag=5)),
        "Send new array": pp(lambda d: c.Send(np.full(cnt, 1.0, np.float32), dest=d, tag=5),
                             lambda o: c.Recv(red, source=o, tag=5)),
        "Recv Status": pp(lambda d: c.Send(s, dest=d, tag=5),
                          lambda o: c.Recv(red, source=o, tag=5, status=MPI.Status())),
        "Recv ANY_SOURCE": pp(lambda d: c.Send(s, dest=d, tag=5),
                              lambda o: c.Recv(red, source=ANY, tag=MPI.ANY_TAG)),
        "Sendrecv_replace": lambda: c.Sendrecv_replace(red, dest=peer, source=src),
        "Allreduce new arrays": lambda: c.Allreduce(np.full(cnt, 1.0, np.float32),
                                                    np.empty(cnt, np.float32), op=MPI.SUM),
        "Allreduce IN_PLACE": lambda: c.Allreduce(MPI.IN_PLACE, red, op=MPI.SUM),
        "Allreduce 1 float": lambda: c.Allreduce(np.array([1.0]), one, op=MPI.SUM),
        "Bcast [a, T]": lambda: c.Bcast([red, F], root=0),
        "Reduce new array": lambda: c.Reduce(np.full(cnt, 1.0, np.float32), red, op=MPI.SUM,
                                             root=0),
        "Gather new array": lambda: c.Gather(np.full(cnt, 1.0, np.float32), big, root=0),
        "Allgather new array": lambda: c.Allgather(np.full(cnt, 1.0, np.float32), big),
        "Isend [a, T]": lambda: MPI.Request.Waitall([c.Irecv([red, F], src, 8),
                                                     c.Isend([s, F], peer, 8)]),
        "Send bytes": pp(lambda d: c.Send(raw, dest=d, tag=5),
                         lambda o: c.Recv(rawin, source=o, tag=5)),
    }
    return {**idioms,
            "Barrier": c.Barrier,
            "Gather": lambda: c.Gather(s, big, 0), "Scatter": lambda: c.Scatter(big, s, 0),
            "Reduce": lambda: c.Reduce(s, red, MPI.SUM, 0), "Send/Recv": buf_pingpong,
            "Sendrecv": lambda: c.Sendrecv(s, peer, 7, red, src, 7),
            "Isend/Irecv": exchange, "send/recv": pingpong,
            "sendrecv": lambda: c.sendrecv(RECORD, peer, source=src),
            "bcast": lambda: c.bcast(RECORD, 0), "gather": lambda: c.gather(RECORD, 0),
            "scatter": lambda: c.scatter(recs if r == 0 else None, 0),
            "allgather": lambda: c.allgather(RECORD), "alltoall": lambda: c.alltoall(recs),
            "allreduce": lambda: c.allreduce(r)}


def gloo_calls(st, nbytes):
    import torch
    dist = st.dist
    r, n = st.rank, st.size
    cnt = max(1, nbytes // 4)
    s = torch.ones(cnt)
    parts = [torch.zeros(cnt) for _ in range(n)]
    t1 = torch.zeros(cnt)

    def pingpong():
        if r == 0:
            dist.send_object_list([RECORD], 1)
            dist.recv_object_list([None], 1)
        elif r == 1:
            o = [None]
            dist.recv_object_list(o, 0)
            dist.send_object_list(o, 0)

    def buf_pingpong():
        if r == 0:
            dist.send(s, 1)
            dist.recv(t1, 1)
        elif r == 1:
            dist.recv(t1, 0)
            dist.send(s, 0)

    def exchange():
        for w in (dist.irecv(t1, (r - 1) % n), dist.isend(s, (r + 1) % n)):
            w.wait()

    def bcast():
        o = [RECORD if r == 0 else None]
        dist.broadcast_object_list(o, 0)

    def gather():
        dist.gather_object(RECORD, [None] * n if r == 0 else None, 0)

    def scatter():
        dist.scatter_object_list([None], [RECORD] * n if r == 0 else None, 0)

    def allgather():
        dist.all_gather_object([None] * n, RECORD)
    return {"Barrier": dist.barrier,
            "Gather": lambda: dist.gather(s, parts if r == 0 else None, 0),
            "Scatter": lambda: dist.scatter(t1, parts if r == 0 else None, 0),
            "Reduce": lambda: dist.reduce(t1, 0), "Send/Recv": buf_pingpong,
            "Isend/Irecv": exchange, "send/recv": pingpong, "bcast": bcast,
            "gather": gather, "scatter": scatter, "allgather": allgather}


def _calls(which):
    return {"basic": CALLS, "idioms": IDIOMS, "all": CALLS + IDIOMS}[which]


def worker(args):
    st = open_stack(args.stack)
    calls = gloo_calls(st, args.bytes) if st.name == "gloo" else mpi_calls(st, args.bytes)
    out = {}
    for name in _calls(args.set):
        fn = calls.get(name)
        if fn is None:
            continue
        for _ in range(max(1, args.iters // 10)):
            fn()
        st.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        dt = (time.perf_counter() - t0) / args.iters
        if name in ONE_WAY:
            dt /= 2                                   # one way
        out[name] = dt * 1e6
        st.barrier()
    if st.rank == 0:
        doc = {"stack": st.name, "library": st.library(), "np": st.size, "bytes": args.bytes,
               "iters": args.iters, "us": out}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f)
        else:
            print(json.dumps(doc))
    st.close()
    return 0


def _launch(stack, n, json_out, args):
    from bench.run_all import check_stacks, launch_cmd
    ok, skipped = check_stacks([stack])
    if not ok:
        print("%s skipped: %s" % (stack, skipped[stack]), file=sys.stderr)
        return None
    cmd = launch_cmd(stack, n) + ["-m", "bench.smallcalls", "--worker", "--stack", stack,
                                  "--json", json_out, "--iters", str(args.iters),
                                  "--bytes", str(args.bytes), "--set", args.set]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=args.timeout)
    if p.returncode != 0 or not os.path.exists(json_out):
        print("%s -n %d failed (%s):\n%s" % (stack, n, p.returncode, p.stdout[-2000:]),
              file=sys.stderr)
        return None
    with open(json_out) as f:
        return json.load(f)


def table(results, stacks, nps, calls=CALLS):
    lines = []
    peers = [s for s in stacks if s != "erdmampi"] if "erdmampi" in stacks else []
    for n in nps:
        lines += ["", "**%d ranks** (µs per call, median of rounds; Send/Recv, send/recv: "
                  "one way)" % n, "",
                  "| " + " | ".join(["call"] + list(stacks) +
                                    ["%s / erdmampi" % s for s in peers]) + " |",
                  "|---|" + "---:|" * (len(stacks) + len(peers))]
        for call in calls:
            med = {}
            for s in stacks:
                xs = [d["us"][call] for d in results.get((s, n), []) if call in d["us"]]
                med[s] = statistics.median(xs) if xs else None
            cells = ["%.1f" % med[s] if med[s] is not None else "–" for s in stacks]
            e = med.get("erdmampi")
            ratios = ["%.2f" % (med[s] / e) if med[s] is not None and e else "–" for s in peers]
            lines.append("| " + " | ".join([call] + cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--worker", action="store_true", help="run one job's ranks (under a launcher)")
    p.add_argument("--stack", help="worker: erdmampi, mpi4py or gloo (default: detected)")
    p.add_argument("--stacks", default="erdmampi,mpi4py,gloo",
                   help="driver: stacks to run (default all; missing ones are skipped)")
    p.add_argument("--np", default="2", help="driver: rank counts (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="driver: rounds per stack (default 3)")
    p.add_argument("--iters", type=int, default=2000, help="timed calls per call (default 2000)")
    p.add_argument("--bytes", type=int, default=4096,
                   help="bytes of the buffer calls (default 4096)")
    p.add_argument("--set", choices=("basic", "idioms", "all"), default="basic",
                   help="basic: the calls above (default); idioms: calls written as programs "
                        "often write them (the [array, datatype] list made in the call, a new "
                        "array every call, a Status, MPI.IN_PLACE; MPI stacks only); all: both")
    p.add_argument("--timeout", type=float, default=300.0, help="driver: seconds per job")
    p.add_argument("--json", help="worker: this rank-0 JSON; driver: all results")
    p.add_argument("--md", help="driver: write the markdown table here too")
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    stacks = [s.strip() for s in args.stacks.split(",") if s.strip()]
    nps = [int(x) for x in args.np.split(",")]
    results, tmp = {}, "/tmp/bench-smallcalls-%d.json" % os.getpid()
    for rnd in range(args.rounds):
        for n in nps:
            order = stacks[rnd % len(stacks):] + stacks[:rnd % len(stacks)]
            for s in order:
                doc = _launch(s, n, tmp, args)
                if doc is not None:
                    results.setdefault((s, n), []).append(doc)
                    print("round %d  %-8s n=%d  %s" % (rnd, s, n, " ".join(
                        "%s %.1f" % (k, v) for k, v in doc["us"].items())), flush=True)
    if os.path.exists(tmp):
        os.unlink(tmp)
    ran = [s for s in stacks if any(k[0] == s for k in results)]
    md = table(results, ran, nps, _calls(args.set))
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"stacks": ran, "np": nps, "rounds": args.rounds,
                       "runs": [d for v in results.values() for d in v]}, f, indent=1)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    return 0 if "erdmampi" in ran else 1


if __name__ == "__main__":
    sys.exit(main())
