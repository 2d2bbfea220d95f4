"""Run the benchmark suite on erdmampi, mpi4py+MPICH and torch.distributed gloo,
alternating the stacks, and write a JSON file, a markdown table and a PNG plot.

    python -m bench.run_all                 # everything: 2 and 4 ranks, 2 rounds
    python -m bench.run_all --quick         # smoke run, about 2 minutes
    python -m bench.run_all --np 2 --max-size 64MiB --stacks erdmampi,mpi4py

erdmampi runs under erdmarun, mpi4py (Debian MPICH) under mpiexec.mpich and
gloo under ``python -m bench.gloorun``. Each job (ping-pong with 2 ranks; the
collectives with each --np; with --group op one job per collective) runs once
per stack per round, the stacks in turn, and the order rotates every round
(A B C, B C A, C A B, ...), because a shared machine's speed drifts by about 2x
over hours: compare ratios from one run, not absolute numbers across runs.
A stack whose module is missing (torch, mpi4py) is skipped with a note.

Per size, each stack's value is the median over rounds of its per-run median
time; ratio = (best peer's time) / (erdmampi's time), so > 1 means erdmampi is
faster and the ratio of bandwidths is the same number. Outputs go to --outdir
(default bench/results/<date-time>/): results.json (every run and the
summary), results.md (tables) and bandwidth.png (bus bandwidth against size).
"""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):  # run as a file: python bench/run_all.py
    sys.path.insert(0, ROOT)
from bench.collectives import OPS, busbw_factor, parse_ops  # noqa: E402
from bench.common import MIB, STACKS, format_size, parse_size  # noqa: E402

LABEL = {"erdmampi": "erdmampi", "mpi4py": "MPICH", "gloo": "gloo"}
COLOR = {"erdmampi": "tab:red", "mpi4py": "tab:blue", "gloo": "tab:green"}


# -- launching ---------------------------------------------------------------

def _which(names):
    bindir = os.path.dirname(sys.executable)
    for name in names:
        cand = os.path.join(bindir, name)
        if os.access(cand, os.X_OK):
            return cand
        path = shutil.which(name)
        if path:
            return path
    return None


def check_stacks(stacks):
    """-> (usable stacks, {stack: why it is skipped})."""
    ok, skipped = [], {}
    for s in stacks:
        if s == "erdmampi":
            if not _which(["erdmarun"]):
                skipped[s] = "erdmarun not found (run scripts/setup.sh)"
            elif importlib.util.find_spec("erdmampi") is None:
                skipped[s] = "erdmampi is not installed (run scripts/setup.sh)"
        elif s == "mpi4py":
            if importlib.util.find_spec("mpi4py") is None:
                skipped[s] = "mpi4py is not installed (run scripts/setup.sh)"
            elif not _which(["mpiexec.mpich", "mpiexec.hydra", "mpiexec"]):
                skipped[s] = "mpiexec.mpich not found (apt-get install mpich)"
        elif s == "gloo":
            if importlib.util.find_spec("torch") is None:
                skipped[s] = ("torch is not installed: gloo skipped "
                              "(bash scripts/setup_bench.sh installs torch==2.13.0, CPU)")
        if s not in skipped:
            ok.append(s)
    return ok, skipped


def launch_cmd(stack, nprocs):
    py = [sys.executable]
    if stack == "erdmampi":
        return [_which(["erdmarun"]), "-n", str(nprocs)] + py
    if stack == "mpi4py":  # MPICH's own name first, in case another MPI owns mpiexec
        return [_which(["mpiexec.mpich", "mpiexec.hydra", "mpiexec"]), "-n", str(nprocs)] + py
    return py + ["-m", "bench.gloorun", "-n", str(nprocs), "--"] + py


def run_job(stack, job, outdir, tag, timeout, log):
    """Run one job on one stack; -> its JSON document, or None on failure."""
    out = os.path.join(outdir, "runs", "%s-np%d-%s-%s.json" % (job["name"], job["np"], stack, tag))
    cmd = (launch_cmd(stack, job["np"]) + ["-m", "bench." + job["module"], "--stack", stack,
                                           "--json", out] + job["args"])
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    log("$ " + " ".join(cmd))
    t0 = time.time()
    with open(os.path.join(outdir, "runs", "log.txt"), "a") as logf:
        logf.write("$ %s\n" % " ".join(cmd))
        logf.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)  # the job's own process group
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            rc = "timeout after %g s" % timeout
    dt = time.time() - t0
    if rc != 0 or not os.path.exists(out):
        log("  FAILED (%s, %.1f s); see %s" % (rc, dt, os.path.join(outdir, "runs", "log.txt")))
        return None
    log("  %.1f s" % dt)
    with open(out) as f:
        return json.load(f)


def build_jobs(args):
    jobs = []
    common = ["--repeats", str(args.repeats), "--target-time", str(args.target_time)]
    if "pingpong" in args.bench:
        jobs.append({"name": "pingpong", "module": "pingpong", "np": 2,
                     "args": common + ["--max-size", str(args.pp_max_size),
                                       "--budget", str(args.pp_budget)]})
    if "collectives" in args.bench:
        groups = [[o] for o in args.ops] if args.group == "op" else [args.ops]
        for n in args.np:
            for ops in groups:
                jobs.append({"name": "-".join(ops) if args.group == "op" else "collectives",
                             "module": "collectives", "np": n,
                             "args": common + ["--ops", ",".join(ops),
                                               "--min-size", str(args.min_size),
                                               "--max-size", str(args.max_size_for(n)),
                                               "--budget", str(args.budget)]})
    return jobs


# -- summary -------------------------------------------------------------------

def summarize(runs, stacks):
    """runs: list of JSON documents -> rows sorted by (op, np, bytes), each
    {op, np, bytes, time_us: {stack: median over rounds}, bw_GBps: {...},
    correct: {...}, rounds: {...}, time_us_rounds: {stack: [per round]}, best_peer,
    ratio}. bw is busbw (ping-pong: size/latency)."""
    acc = {}
    for doc in runs:
        for r in doc["results"]:
            key = (r["op"], doc["nprocs"], r["bytes"])
            t = r["latency_us"] if r["op"] == "pingpong" else r["time_us"]
            cell = acc.setdefault(key, {}).setdefault(doc["stack"], {"t": [], "ok": True})
            cell["t"].append(t)
            cell["ok"] = cell["ok"] and r.get("correct", True)
    order = {op: i for i, op in enumerate(("pingpong",) + OPS)}
    rows = []
    for (op, n, nbytes), per in sorted(acc.items(), key=lambda kv: (order[kv[0][0]],) + kv[0][1:]):
        factor = 1.0 if op == "pingpong" else busbw_factor(op, n)
        row = {"op": op, "np": n, "bytes": nbytes, "time_us": {}, "bw_GBps": {}, "correct": {},
               "rounds": {}, "time_us_rounds": {}}
        for s in stacks:
            if s in per:
                t = statistics.median(per[s]["t"])
                row["time_us"][s] = t
                row["bw_GBps"][s] = nbytes / (t * 1e-6) / 1e9 * factor
                row["correct"][s] = per[s]["ok"]
                row["rounds"][s] = len(per[s]["t"])
                row["time_us_rounds"][s] = per[s]["t"]
        peers = [s for s in row["time_us"] if s != "erdmampi"]
        row["best_peer"] = min(peers, key=lambda s: row["time_us"][s]) if peers else None
        if row["best_peer"] and "erdmampi" in row["time_us"]:
            row["ratio"] = row["time_us"][row["best_peer"]] / row["time_us"]["erdmampi"]
        else:
            row["ratio"] = None
        rows.append(row)
    return rows


def _fmt_time(us):
    if us is None:
        return "–"
    if us >= 1000:
        return "%.3g ms" % (us / 1000)
    return "%.3g µs" % us


def _fmt_bw(x):
    return "–" if x is None else ("%.3g" % x)


def markdown(rows, stacks, meta):
    out = []
    groups = {}
    for r in rows:
        groups.setdefault((r["op"], r["np"]), []).append(r)
    for (op, n), rs in groups.items():
        title = "ping-pong (one-way latency, bandwidth)" if op == "pingpong" else \
            "%s float32 (time per call, busbw)" % op
        out.append("### %s, %d ranks\n" % (title, n))
        bw = "GB/s" if op == "pingpong" else "busbw GB/s"
        head = ["size"] + ["%s time" % LABEL[s] for s in stacks] + \
            ["%s %s" % (LABEL[s], bw) for s in stacks] + ["best peer", "ratio"]
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---:|" * len(head))
        for r in rs:
            cells = [format_size(r["bytes"])]
            cells += [_fmt_time(r["time_us"].get(s)) + ("" if r["correct"].get(s, True)
                                                       else " WRONG") for s in stacks]
            cells += [_fmt_bw(r["bw_GBps"].get(s)) for s in stacks]
            cells += [LABEL.get(r["best_peer"], "–"),
                      "–" if r["ratio"] is None else "%.2f" % r["ratio"]]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    head = ("Ratio = best peer's time / erdmampi's time (= erdmampi's bandwidth / the best "
            "peer's): > 1 means erdmampi is faster. Medians over %d round(s), stacks "
            "alternated." % meta["rounds"])
    if meta.get("skipped"):
        head += " Skipped: " + "; ".join("%s: %s" % kv for kv in meta["skipped"].items()) + "."
    summary = headline(rows, stacks)
    return head + "\n\n" + (summary + "\n" if summary else "") + "\n".join(out)


HEADLINE_SIZES = {"pingpong": (8, 64 * 1024, MIB, 64 * MIB),
                  "collective": (4096, MIB, 16 * MIB, 64 * MIB, 256 * MIB)}


def headline(rows, stacks):
    """A compact table: the ratio at a few sizes for every (op, ranks)."""
    out = []
    for kind in ("pingpong", "collective"):
        want = HEADLINE_SIZES[kind]
        rs = [r for r in rows if (r["op"] == "pingpong") == (kind == "pingpong")]
        have = [b for b in want if any(r["bytes"] == b for r in rs)]
        if not have:
            continue
        head = ["" if kind == "collective" else "ping-pong", "ranks"] + \
            [format_size(b) for b in have]
        out.append("| " + " | ".join(head) + " |")
        out.append("|---|" + "---:|" * (len(head) - 1))
        keys = []
        for r in rs:
            if (r["op"], r["np"]) not in keys:
                keys.append((r["op"], r["np"]))
        for op, n in keys:
            cells = ["latency" if op == "pingpong" else op, str(n)]
            for b in have:
                r = next((x for x in rs if x["op"] == op and x["np"] == n and x["bytes"] == b),
                         None)
                if r is None or r["ratio"] is None:
                    cells.append("–")
                else:
                    cells.append("%.2f (%s)" % (r["ratio"], LABEL[r["best_peer"]]))
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
    if not out:
        return ""
    return ("Ratio erdmampi : best peer (in brackets) at selected sizes, > 1 = erdmampi "
            "faster:\n\n" + "\n".join(out))


def plot(rows, stacks, path):
    """Bandwidth against size, one panel per (op, ranks); None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    panels = []
    for r in rows:
        k = (r["op"], r["np"])
        if k not in panels:
            panels.append(k)
    if not panels:
        return None
    nps = sorted({n for _, n in panels})
    ops = [op for op in ("pingpong",) + OPS if any(p[0] == op for p in panels)]
    fig, axes = plt.subplots(len(nps), len(ops), figsize=(3.1 * len(ops), 2.6 * len(nps)),
                             squeeze=False, sharex=False)
    for i, n in enumerate(nps):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            rs = [r for r in rows if r["op"] == op and r["np"] == n]
            if not rs:
                ax.axis("off")
                continue
            for s in stacks:
                pts = [(r["bytes"], r["bw_GBps"][s]) for r in rs if s in r["bw_GBps"]]
                if pts:
                    ax.plot(*zip(*pts), marker=".", color=COLOR[s], label=LABEL[s], lw=1.2)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title("%s, %d ranks" % ("ping-pong" if op == "pingpong" else op, n),
                         fontsize=9)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="major", alpha=0.3)
            if j == 0 or not axes[i][j - 1].has_data():
                ax.set_ylabel("GB/s (busbw; ping-pong: size/latency)", fontsize=7)
            if i == len(nps) - 1:
                ax.set_xlabel("bytes", fontsize=7)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=72)
    plt.close(fig)
    return path


# -- main ----------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.run_all",
                                description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stacks", default=",".join(STACKS),
                   help="comma-separated subset of %s (default all)" % ",".join(STACKS))
    p.add_argument("--bench", default="pingpong,collectives",
                   help="pingpong and/or collectives (default both)")
    p.add_argument("--ops", type=parse_ops, default=list(OPS),
                   help="collectives (default %s)" % ",".join(OPS))
    p.add_argument("--np", default="2,4",
                   help="rank counts for the collectives (default 2,4); ping-pong uses 2")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (default 2)")
    p.add_argument("--min-size", type=parse_size, default=None,
                   help="smallest collective size (default 4KiB)")
    p.add_argument("--max-size", type=parse_size, default=None,
                   help="largest collective size (default 256MiB)")
    p.add_argument("--max-size-4", type=parse_size, default=None, metavar="SIZE",
                   help="largest collective size with more than 2 ranks (default --max-size)")
    p.add_argument("--pp-max-size", type=parse_size, default=None,
                   help="largest ping-pong message (default 64MiB)")
    p.add_argument("--repeats", type=int, default=None, help="timed repetitions (default 5)")
    p.add_argument("--target-time", type=float, default=None,
                   help="about this many seconds per repetition at most (default 0.25)")
    p.add_argument("--budget", type=parse_size, default=None,
                   help="collective bytes per repetition (default 64MiB)")
    p.add_argument("--group", choices=("job", "op"), default=None,
                   help="one launch per rank count (job) or per collective (op; tighter "
                        "alternation, more start-up time); default op, job with --quick")
    p.add_argument("--quick", action="store_true",
                   help="smoke run (~2 min): 1 round, ping-pong to 1MiB, collectives "
                        "4KiB-1MiB, 3 short repetitions")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per launch (default 1800)")
    p.add_argument("--from-json", metavar="RESULTS_JSON",
                   help="run nothing: rewrite results.md and bandwidth.png next to an "
                        "existing results.json")
    p.add_argument("--outdir", default=None,
                   help="output folder (default bench/results/<date-time>/)")
    args = p.parse_args(argv)

    q = args.quick
    defaults = {"min_size": 4096, "max_size": (1 if q else 256) * MIB,
                "pp_max_size": (1 if q else 64) * MIB, "repeats": 3 if q else 5,
                "target_time": 0.05 if q else 0.25, "budget": (4 if q else 64) * MIB,
                "group": "job" if q else "op", "rounds": 1 if q else args.rounds}
    for k, v in defaults.items():
        if getattr(args, k) is None or (q and k == "rounds"):
            setattr(args, k, v)
    args.pp_budget = (4 if q else 32) * MIB
    if args.max_size_4 is None:
        args.max_size_4 = args.max_size
    args.max_size_for = lambda n: args.max_size if n <= 2 else args.max_size_4
    args.stacks = [s for s in args.stacks.split(",") if s]
    args.bench = [b for b in args.bench.split(",") if b]
    try:
        args.np = [int(x) for x in str(args.np).split(",") if x]
    except ValueError:
        p.error("--np takes comma-separated integers")
    for s in args.stacks:
        if s not in STACKS:
            p.error("unknown stack %r (choose from %s)" % (s, ",".join(STACKS)))
    for b in args.bench:
        if b not in ("pingpong", "collectives"):
            p.error("unknown benchmark %r (pingpong, collectives)" % b)
    if any(n < 1 for n in args.np) or args.rounds < 1 or args.repeats < 1:
        p.error("--np, --rounds and --repeats must be positive")
    if args.outdir is None:
        args.outdir = os.path.join(HERE, "results", time.strftime("%Y%m%d-%H%M%S"))
    return args


def write_outputs(outdir, meta, rows, runs, log):
    stacks = meta["stacks"]
    md = markdown(rows, stacks, meta)
    json_path = os.path.join(outdir, "results.json")
    if runs is not None:
        with open(json_path, "w") as f:
            json.dump({"meta": meta, "summary": rows, "runs": runs}, f, indent=1)
    md_path = os.path.join(outdir, "results.md")
    with open(md_path, "w") as f:
        f.write(md + "\n")
    png = plot(rows, stacks, os.path.join(outdir, "bandwidth.png"))
    log("\n" + md)
    log("libraries: " + "; ".join("%s = %s" % kv for kv in meta["libraries"].items()))
    log("wrote %s, %s%s (%.0f s)" % (json_path, md_path, ", " + png if png else
                                    " (no plot: matplotlib missing)", meta["elapsed_s"]))


def main(argv=None):
    args = parse_args(argv)

    def log(text):
        print(text, flush=True)

    if args.from_json:
        with open(args.from_json) as f:
            doc = json.load(f)
        rows = summarize(doc["runs"], doc["meta"]["stacks"])
        write_outputs(os.path.dirname(os.path.abspath(args.from_json)), doc["meta"], rows,
                      None, log)
        return 0

    stacks, skipped = check_stacks(args.stacks)
    for s, why in skipped.items():
        log("note: %s skipped: %s" % (s, why))
    if not stacks:
        log("run_all: no stack to run")
        return 2
    os.makedirs(os.path.join(args.outdir, "runs"), exist_ok=True)
    jobs = build_jobs(args)
    t_start = time.time()
    runs, failures = [], []
    from erdmampi.testing.progress import Progress
    bar = Progress(args.rounds * len(jobs) * len(stacks), "run_all")
    for rnd in range(args.rounds):
        k = rnd % len(stacks)
        order = stacks[k:] + stacks[:k]
        for job in jobs:
            for stack in order:
                bar.step("round %d: %s np=%d on %s" % (rnd, job["name"], job["np"], stack))
                doc = run_job(stack, job, args.outdir, "r%d" % rnd, args.timeout, log)
                bar.advance()
                if doc is None:
                    failures.append({"stack": stack, "job": job["name"], "np": job["np"],
                                     "round": rnd})
                else:
                    doc["round"] = rnd
                    runs.append(doc)

    bar.close()
    rows = summarize(runs, stacks)
    libraries = {}
    for doc in runs:
        libraries.setdefault(doc["stack"], doc["library"])
    meta = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "rounds": args.rounds,
            "elapsed_s": round(time.time() - t_start, 1), "stacks": stacks, "skipped": skipped,
            "libraries": libraries, "failures": failures,
            "args": {k: v for k, v in vars(args).items() if not callable(v)}}
    write_outputs(args.outdir, meta, rows, runs, log)
    if failures:
        log("FAILED runs: " + ", ".join("%(stack)s %(job)s np=%(np)d round %(round)d" % f
                                        for f in failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
