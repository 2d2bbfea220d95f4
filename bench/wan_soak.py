"""Soak: an erdmampi job loops collectives over a lossy emulated WAN link and
checks every result exactly (a 30-minute soak at 3% loss must complete with
checksummed results).

    python -m bench.wan_soak --minutes 30 --loss 0.03 --rate 100mbit --rtt 20 \\
        --sites 2 --ranks-per-site 1 --json bench/results/wan_soak.json

Needs root (``erdmampi.testing.wan.WanBed``).  One bed, one job.  Each rank
loops Allreduce (SUM), Bcast (root rotating over the ranks) and Alltoall over
float32 and int64 buffers of 1 KiB to 16 MiB (log-uniform, with the two ends
drawn often) until the time is up.  The schedule and every rank's input are
drawn from ``numpy.random.default_rng((seed, iteration, rank))``, so each rank
computes the expected result of every collective itself, from all ranks'
inputs, without the network (float32 inputs are integers small enough that
every sum is exact).  After each collective every rank

* compares its result with the expected one element by element,
* takes a CRC-32 of the result,

and one small Allreduce (MAX) of ``[mismatches, stop, crc, -crc]`` makes all
ranks agree to stop (time up or a mismatch anywhere) and checks that the
results of Allreduce and Bcast, which must be equal on every rank, have the
same CRC everywhere.

Hangs: every iteration runs under ``faulthandler.dump_traceback_later
(--iter-timeout, exit=True)`` (the rank prints its threads' tracebacks and
exits 1), ``ERDMA_TIMEOUT`` (``--erdma-timeout``, default 30 s) declares a
silent peer dead, and the driver kills the job if it outlives the duration by
more than the iteration timeout plus start-up.  The driver exits 0 only if
every rank exited 0, ran the same number of iterations and counted no
mismatch.

The JSON has the configuration, the verdict, per rank the iterations, payload
bytes (each collective's buffer per rank), mismatches, CRC disagreements, the
longest iteration (and what it was), per collective counts, a SHA-256 over all
results of that rank, rank 0's progress lines (every ``--progress-every``
seconds) and the bed's counters (bytes through the router, delay lines).
"""
import argparse
import faulthandler
import json
import math
import os
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):  # run as a file: python bench/wan_soak.py
    sys.path.insert(0, ROOT)

KIB, MIB = 1 << 10, 1 << 20
OPS = ("allreduce", "bcast", "alltoall")
DTYPES = ("float32", "int64")


# -- the worker (one rank) ----------------------------------------------------------

def plan(seed, it, size, min_bytes, max_bytes):
    """The iteration's (op, dtype, elements, root), the same on every rank."""
    import numpy as np
    rng = np.random.default_rng((seed, it, 1 << 20))
    op = OPS[it % len(OPS)]
    dtype = DTYPES[(it // len(OPS)) % len(DTYPES)]
    u = rng.random()
    if u < 0.125:
        nbytes = max_bytes
    elif u < 0.25:
        nbytes = min_bytes
    else:
        lo, hi = math.log(min_bytes), math.log(max_bytes)
        nbytes = int(math.exp(lo + (hi - lo) * rng.random()))
    item = np.dtype(dtype).itemsize
    unit = item * (size if op == "alltoall" else 1)
    count = max(1, nbytes // unit) * unit // item
    root = int(rng.integers(size))
    return op, dtype, count, root


def inputs(seed, it, rank, dtype, count, size):
    """Rank ``rank``'s send buffer of iteration ``it``: random integers, small
    enough for float32 that any sum over ``size`` ranks is exact."""
    import numpy as np
    rng = np.random.default_rng((seed, it, rank))
    if dtype == "float32":
        lim = (1 << 24) // size // 2
        return rng.integers(-lim, lim, count, dtype=np.int32).astype(np.float32)
    return rng.integers(-(1 << 40), 1 << 40, count, dtype=np.int64)


def expected(seed, it, rank, size, op, dtype, count, root):
    import numpy as np
    if op == "allreduce":
        acc = inputs(seed, it, 0, dtype, count, size)
        for r in range(1, size):
            acc = acc + inputs(seed, it, r, dtype, count, size)
        return acc
    if op == "bcast":
        return inputs(seed, it, root, dtype, count, size)
    blk = count // size     # alltoall: block `rank` of every rank, in rank order
    return np.concatenate([inputs(seed, it, r, dtype, count, size)[rank * blk:(rank + 1) * blk]
                           for r in range(size)])


def worker(a):
    import hashlib
    import numpy as np
    from erdmampi import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    counts = {op: 0 for op in OPS}
    st = {"rank": rank, "size": size, "iters": 0, "bytes": 0, "mismatches": 0,
          "crc_disagree": 0, "max_iter_s": 0.0, "max_iter": None, "max_coll_s": 0.0,
          "counts": counts, "bytes_by_op": {op: 0 for op in OPS}}
    digest = hashlib.sha256()
    ctl = np.zeros(4, dtype=np.int64)
    ctl_out = np.zeros(4, dtype=np.int64)
    comm.Barrier()
    t_start = time.monotonic()
    t_last = t_start
    it = 0
    while True:
        t0 = time.monotonic()
        faulthandler.dump_traceback_later(a.iter_timeout, exit=True)
        op, dtype, count, root = plan(a.seed, it, size, a.min_bytes, a.max_bytes)
        x = inputs(a.seed, it, rank, dtype, count, size)
        want = expected(a.seed, it, rank, size, op, dtype, count, root)
        out = np.full(count, -7, dtype=x.dtype)      # never a valid result by accident
        tc = time.monotonic()
        if op == "allreduce":
            comm.Allreduce(x, out, op=MPI.SUM)
        elif op == "bcast":
            if rank == root:
                out[...] = x
            comm.Bcast(out, root=root)
        else:
            comm.Alltoall(x, out)
        t_coll = time.monotonic() - tc
        bad = int(np.count_nonzero(out != want))
        crc = zlib.crc32(out.view(np.uint8))
        digest.update(out.tobytes())
        if bad:
            print(json.dumps({"event": "mismatch", "rank": rank, "iter": it, "op": op,
                              "dtype": dtype, "bytes": int(x.nbytes), "root": root,
                              "wrong_elements": bad}), flush=True)
        stop = int(time.monotonic() - t_start >= a.seconds)
        same = op != "alltoall"               # results equal on every rank
        ctl[:] = (bad, stop, crc if same else 0, -crc if same else 0)
        comm.Allreduce(ctl, ctl_out, op=MPI.MAX)
        faulthandler.cancel_dump_traceback_later()
        dt = time.monotonic() - t0
        st["iters"] += 1
        st["bytes"] += int(x.nbytes)
        st["bytes_by_op"][op] += int(x.nbytes)
        counts[op] += 1
        st["mismatches"] += int(bad > 0)
        if same and ctl_out[2] != -ctl_out[3]:
            st["crc_disagree"] += 1
            print(json.dumps({"event": "crc_disagree", "rank": rank, "iter": it, "op": op}),
                  flush=True)
        st["max_coll_s"] = max(st["max_coll_s"], t_coll)
        if dt > st["max_iter_s"]:
            st["max_iter_s"] = dt
            st["max_iter"] = {"iter": it, "op": op, "dtype": dtype, "bytes": int(x.nbytes),
                              "coll_s": t_coll}
        it += 1
        now = time.monotonic()
        if rank == 0 and now - t_last >= a.progress_every:
            t_last = now
            print(json.dumps({"event": "progress", "elapsed_s": round(now - t_start, 1),
                              "iters": st["iters"], "bytes": st["bytes"],
                              "max_iter_s": round(st["max_iter_s"], 3)}), flush=True)
        if ctl_out[0] or ctl_out[1] or st["crc_disagree"]:
            break
    st["elapsed_s"] = time.monotonic() - t_start
    st["sha256"] = digest.hexdigest()
    st["stopped_on_error"] = bool(ctl_out[0]) or bool(st["crc_disagree"])
    print(json.dumps(dict(st, event="final")), flush=True)
    return 0 if not st["stopped_on_error"] and not st["mismatches"] else 1


# -- the driver ---------------------------------------------------------------------

def parse_lines(text):
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def verdict(rcs, timed_out, outputs):
    """(status, reason, finals): 'ok' only if every rank exited 0 with a final record,
    all ranks ran the same iterations and nobody saw a mismatch."""
    recs = [parse_lines(o) for o in outputs]
    finals = [next((d for d in r if d.get("event") == "final"), None) for r in recs]
    hangs = [i for i, o in enumerate(outputs) if "Timeout (" in o]
    if timed_out:
        return "hang", "job killed by the driver's deadline", finals
    if hangs:
        return "hang", "iteration timeout on rank(s) %s" % hangs, finals
    if any(f is None for f in finals) or any(rcs):
        return "error", "exit codes %s" % rcs, finals
    if any(f["mismatches"] or f["crc_disagree"] for f in finals):
        return "mismatch", "wrong results (see mismatch lines)", finals
    if len({f["iters"] for f in finals}) != 1:
        return "error", "ranks ran different iteration counts", finals
    return "ok", "", finals


def parse_args(argv=None):
    from bench.common import parse_size
    ap = argparse.ArgumentParser(prog="python -m bench.wan_soak",
                                 description="Loop checked erdmampi collectives over a "
                                             "lossy emulated WAN link (needs root).")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--loss", type=float, default=0.03, help="per router crossing (fraction)")
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--rtt", type=float, default=20.0, help="round-trip time in ms")
    ap.add_argument("--sites", type=int, default=2)
    ap.add_argument("--ranks-per-site", type=int, default=1)
    ap.add_argument("--min-size", default="1KiB")
    ap.add_argument("--max-size", default="16MiB")
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--iter-timeout", type=float, default=120.0,
                    help="seconds one iteration may take before the rank exits (hang)")
    ap.add_argument("--erdma-timeout", type=float, default=30.0,
                    help="ERDMA_TIMEOUT: seconds of silence before a peer counts as dead")
    ap.add_argument("--compress", default="off", help="ERDMA_COMPRESS (default off)")
    ap.add_argument("--progress-every", type=float, default=60.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not 0 <= a.loss < 1:
        ap.error("--loss is a fraction in [0, 1)")
    if a.minutes <= 0 or a.iter_timeout <= 0:
        ap.error("--minutes and --iter-timeout must be positive")
    a.min_bytes, a.max_bytes = parse_size(a.min_size), parse_size(a.max_size)
    if a.min_bytes > a.max_bytes:
        ap.error("--min-size is larger than --max-size")
    if a.seconds is None:
        a.seconds = a.minutes * 60.0
    return a


def _log(msg):
    print(time.strftime("%H:%M:%S ") + msg, file=sys.stderr, flush=True)


def drive(a):
    import subprocess
    from erdmampi.testing import wan
    why = wan.bed_available() if os.geteuid() == 0 else "needs root"
    if why:
        _log("cannot build a WAN bed: %s" % why)
        return 2
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        git = ""
    argv = [sys.executable, "-m", "bench.wan_soak", "--worker", "--seconds", str(a.seconds),
            "--seed", str(a.seed), "--min-size", str(a.min_bytes), "--max-size",
            str(a.max_bytes), "--iter-timeout", str(a.iter_timeout),
            "--progress-every", str(a.progress_every)]
    env = {"ERDMA_TIMEOUT": "%g" % a.erdma_timeout, "ERDMA_COMPRESS": a.compress,
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH"))
                                         if p)}
    doc = {"meta": {"command": "python -m bench.wan_soak " + " ".join(sys.argv[1:]),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": git,
                    "loadavg_start": list(os.getloadavg()),
                    "config": {"minutes": a.minutes, "loss": a.loss, "rate": a.rate,
                               "rtt_ms": a.rtt, "sites": a.sites,
                               "ranks_per_site": a.ranks_per_site, "min_bytes": a.min_bytes,
                               "max_bytes": a.max_bytes, "seed": a.seed,
                               "iter_timeout_s": a.iter_timeout, "env": env}}}
    deadline = a.seconds + a.iter_timeout + 180.0
    t0 = time.monotonic()
    with wan.WanBed(sites=a.sites, rate=a.rate, delay_ms=a.rtt / 2, loss=a.loss) as bed:
        doc["meta"]["bed"] = bed.config
        doc["meta"]["ping_ms"] = sorted(bed.ping(0, 1 % a.sites, count=10)) if a.sites > 1 else []
        before = bed.link_bytes()
        bed.link_stats(reset=True)
        _log("bed up (%s, RTT %g ms, loss %g); job of %d rank(s) for %g s"
             % (a.rate, a.rtt, a.loss, a.sites * a.ranks_per_site, a.seconds))
        job = bed.erdmampi_job(argv, ranks_per_site=a.ranks_per_site, env=env)
        seen = 0
        while time.monotonic() - t0 < deadline and any(p.poll() is None for p in job.procs):
            time.sleep(min(5.0, max(0.5, a.seconds / 20)))
            text = job.outputs()[0]
            for d in parse_lines(text[seen:text.rfind("\n") + 1]):
                if d.get("event") == "progress":
                    _log("%(elapsed_s)7.0f s  %(iters)6d iterations  %(bytes)14d bytes  "
                         "longest %(max_iter_s).2f s" % d)
                elif d.get("event") in ("mismatch", "crc_disagree"):
                    _log("!! %s" % json.dumps(d))
            seen = text.rfind("\n") + 1
        rcs = job.wait(timeout=max(1.0, deadline - (time.monotonic() - t0)))
        outputs = job.outputs()
        after = bed.link_bytes()
        doc["link_bytes"] = [{k: after[i][k] - before[i].get(k, 0) for k in after[i]}
                             for i in range(len(after))]
        doc["delayline"] = bed.link_stats()
    status, reason, finals = verdict(rcs, job.timed_out, outputs)
    doc["wall_s"] = time.monotonic() - t0
    doc["meta"]["loadavg_end"] = list(os.getloadavg())
    doc["result"] = {"status": status, "reason": reason, "exit_codes": rcs,
                     "iters": finals[0]["iters"] if finals[0] else None,
                     "bytes": finals[0]["bytes"] if finals[0] else None,
                     "mismatches": sum(f["mismatches"] for f in finals if f),
                     "longest_iter_s": max((f["max_iter_s"] for f in finals if f), default=None)}
    doc["ranks"] = finals
    doc["progress"] = [d for d in parse_lines(outputs[0]) if d.get("event") == "progress"]
    doc["errors"] = [d for o in outputs for d in parse_lines(o)
                     if d.get("event") in ("mismatch", "crc_disagree")]
    if status != "ok":
        doc["output_tails"] = [o[-4000:] for o in outputs]
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    r = doc["result"]
    _log("%s%s: %s iterations, %s payload bytes per rank, %d mismatches, longest iteration "
         "%s s, exit codes %s" % (status, " (%s)" % reason if reason else "", r["iters"],
                                  r["bytes"], r["mismatches"],
                                  "%.2f" % r["longest_iter_s"] if r["longest_iter_s"] else "?",
                                  rcs))
    if status != "ok":
        for i, o in enumerate(outputs):
            _log("--- rank %d (rc %s) ---\n%s" % (i, rcs[i] if i < len(rcs) else "?", o[-2000:]))
    return 0 if status == "ok" else 1


def main(argv=None):
    a = parse_args(argv)
    return worker(a) if a.worker else drive(a)


if __name__ == "__main__":
    sys.exit(main())
