"""DistributedDataParallel across two WAN sites: the erdma backend against gloo.

    python -m bench.torch_wan --quick                 # smoke run, about a minute
    python -m bench.torch_wan --losses 0,0.01 --reps 3 --steps 40 \\
        --json bench/results/torch_wan.json --md docs/torch_wan.md --png docs/torch_wan.png
    python -m bench.torch_wan --from-json bench/results/torch_wan.json --md docs/torch_wan.md

Trains the same model with DDP, one rank per site, on
``erdmampi.testing.wan.WanBed`` (two sites, ``--rate`` links, ``--rtt`` ms round
trip, one bed per ``--losses`` cell; the bed's ``delay_ms`` is the one-way
delay, so it gets ``rtt / 2``, and each cell measures the RTT with UDP echoes).
Within a cell the stacks take turns, the order rotating from one repetition
to the next (a shared machine's speed drifts: compare stacks within a cell).

Stacks:

* ``erdma``: ``dist.init_process_group("erdma")``, DDP's own allreduce of
  float32 gradient buckets, with ``ERDMA_COMPRESS=off`` (the uncompressed
  engine; BBR is its default congestion control between hosts);
* ``erdma+int8``: the same with ``erdmampi.torch.hooks.compress_hook`` in int8
  mode (error feedback; each rank all-gathers the others' encodings);
* ``gloo-bbr``, ``gloo-cubic``: torch's gloo backend with the sites' TCP
  congestion control set to BBR or CUBIC.

Workload (``--worker``, started by the benchmark in each site): an MLP
(``--dim`` inputs, two hidden layers of ``--hidden``, 10 classes; 1.32 M
float32 parameters, 5.3 MB of gradients per step by default) trained with
SGD + momentum on a generated classification task (labels from a fixed random
teacher network; no downloads).  Seeds are fixed: every stack starts from the
same weights and sees the same batches, so the uncompressed stacks follow the
same loss curve (for two ranks a sum is the same in any order) and the int8
curve shows what compression changes.  A step is forward, backward (DDP's
gradient communication overlaps it and ends inside it) and the optimizer
step; its time is the slower rank's.  The first ``--warmup`` (2) steps are left
out of the median (connections and congestion windows start there).

A run still going after ``--time-cap`` seconds (start-up included) is killed
and reported as capped, with the steps it finished; if none after the warm-up
did, with a lower bound (how long its unfinished step had run).
Speedup = the gloo stack's step time / the erdma stack's (> 1: erdma faster).
"""
import argparse
import itertools
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):  # run as a file: python bench/torch_wan.py
    sys.path.insert(0, ROOT)
from bench.common import git_head, parse_env_spec, write_between_markers  # noqa: E402

STACKS = ("erdma", "erdma+int8", "gloo-bbr", "gloo-cubic")
#: (erdma stack, gloo stack) pairs whose speedup the table shows
PAIRS = (("erdma", "gloo-bbr"), ("erdma", "gloo-cubic"), ("erdma+int8", "gloo-bbr"),
         ("erdma+int8", "gloo-cubic"))
MD_BEGIN, MD_END = "<!-- bench.torch_wan table begin -->", "<!-- bench.torch_wan table end -->"
_port = itertools.count(29600)


def log(text):
    print(text, file=sys.stderr, flush=True)


#: --variant STACK~NAME:K=V,...: an erdma stack with extra environment
VARIANTS = {}


def parse_variant(text):
    """'erdma[+int8]~NAME:K=V,K=V' -> registers that stack with the environment."""
    name, _, spec = text.partition(":")
    base, tilde, tag = name.partition("~")
    if base not in ("erdma", "erdma+int8") or not tilde or not tag or "," in tag:
        raise ValueError("a variant is named erdma~NAME or erdma+int8~NAME: %r" % text)
    env = parse_env_spec(name, spec)
    VARIANTS[name] = env
    return name


def parse_stack(name):
    """'erdma[+int8]', 'gloo-bbr', 'gloo-cubic', or a registered variant ->
    dict(backend, hook, tcp_cc, env)."""
    if name in VARIANTS:
        st = parse_stack(name.partition("~")[0])
        return dict(st, name=name, env={**st["env"], **VARIANTS[name]})
    if name in ("erdma", "erdma+int8"):
        return {"name": name, "backend": "erdma", "hook": "int8" if "+" in name else "none",
                "tcp_cc": None, "env": {"ERDMA_COMPRESS": "off"}}
    if name in ("gloo-bbr", "gloo-cubic"):
        return {"name": name, "backend": "gloo", "hook": "none",
                "tcp_cc": name.split("-")[1], "env": {}}
    raise ValueError("unknown stack %r (one of %s)" % (name, ", ".join(STACKS)))


# -- the training job (one process per site) ------------------------------------------

def _emit(rec):
    print(json.dumps(rec), flush=True)


def make_data(rank, world, n, dim, classes, seed):
    """Rank ``rank``'s shard of a classification set: Gaussian inputs, labels from a
    fixed random two-layer teacher (the same set for every stack)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(dim, 64, generator=g) / dim ** 0.5
    w2 = torch.randn(64, classes, generator=g) / 8.0
    x = torch.randn(n * world, dim, generator=g)
    y = (torch.tanh(x @ w1) @ w2 + 0.1 * torch.randn(n * world, classes, generator=g)).argmax(1)
    return x[rank * n:(rank + 1) * n].contiguous(), y[rank * n:(rank + 1) * n].contiguous()


def make_model(dim, hidden, classes, seed):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, classes))


def worker(a):
    """One rank of the DDP job: prints a JSON line per step (loss of this rank's batch
    before the update, step time), then the median step time after the warm-up."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    if a.backend == "erdma":
        import erdmampi.torch  # noqa: F401  (registers the backend and erdma://)
        dist.init_process_group("erdma", init_method="erdma://")
    else:
        dist.init_process_group(a.backend)          # env:// (RANK, MASTER_ADDR, ...)
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(rank, world, a.samples, a.dim, 10, a.seed)
    model = DDP(make_model(a.dim, a.hidden, 10, a.seed + 1))
    nparams = sum(p.numel() for p in model.parameters())
    state = None
    if a.hook != "none":
        from erdmampi.torch import hooks
        state = hooks.CompressionState(a.hook)
        model.register_comm_hook(state, hooks.compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    _emit({"event": "start", "rank": rank, "world": world, "backend": a.backend,
           "hook": a.hook, "params": nparams, "grad_bytes": 4 * nparams,
           "erdma_compress": os.environ.get("ERDMA_COMPRESS"), "wall": time.time()})
    times = []
    for step in range(a.steps):
        i = (step * a.batch) % (x.shape[0] - a.batch + 1)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[i:i + a.batch]), y[i:i + a.batch])
        loss.backward()                 # DDP's allreduce (or the hook) completes here
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        _emit({"event": "step", "rank": rank, "step": step, "loss": loss.item(), "time": dt,
               "wall": time.time()})
    timed = times[a.warmup:]
    with torch.no_grad():
        psum = float(sum(p.double().sum() for p in model.parameters()))
    done = {"event": "done", "rank": rank, "steps": len(times), "param_sum": psum,
            "median_step_s": statistics.median(timed) if timed else None}
    if state is not None:
        done.update(raw_bytes=state.raw_bytes, sent_bytes=state.sent_bytes)
    _emit(done)
    if rank == 0:
        print("%s hook=%s: %d params, median step %s s after %d warm-up steps, "
              "final loss %.5f" % (a.backend, a.hook, nparams,
                                   "%.3f" % done["median_step_s"] if timed else "-",
                                   a.warmup, loss.item()), file=sys.stderr, flush=True)
    dist.destroy_process_group()
    return 0


# -- one run --------------------------------------------------------------------------

def parse_output(text):
    """JSON lines of one rank -> (start, {step: rec}, done)."""
    start, steps, done = None, {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        ev = d.get("event")
        if ev == "start":
            start = d
        elif ev == "step":
            steps[d["step"]] = d
        elif ev == "done":
            done = d
    return start, steps, done


def evaluate(outputs, nranks, timed_out, rcs, t_kill, warmup):
    """A job's outputs -> run record: status ok / capped / error; per step (every
    rank finished) the slower rank's time and the ranks' mean loss; the median
    step time after the warm-up, or for a capped run a lower bound."""
    parsed = [parse_output(o) for o in outputs]
    rec = {"status": None, "step_times": [], "losses": [], "median_step_s": None,
           "lower_bound": False, "error": None}
    if len(parsed) != nranks:
        rec.update(status="error", error="%d outputs for %d ranks" % (len(parsed), nranks))
        return rec
    common = set.intersection(*(set(s) for _, s, _ in parsed)) if parsed else set()
    n = 0
    while n in common:
        n += 1
    rec["step_times"] = [max(p[1][i]["time"] for p in parsed) for i in range(n)]
    rec["losses"] = [statistics.fmean(p[1][i]["loss"] for p in parsed) for i in range(n)]
    starts = [p[0] for p in parsed]
    if starts[0] is not None:
        rec["params"] = starts[0]["params"]
        rec["erdma_compress"] = starts[0].get("erdma_compress")
    dones = [p[2] for p in parsed]
    if all(d is not None for d in dones):
        rec["param_sums"] = [d["param_sum"] for d in dones]
        if "sent_bytes" in dones[0]:
            rec["hook_bytes"] = {"raw": dones[0]["raw_bytes"], "sent": dones[0]["sent_bytes"]}
    timed = rec["step_times"][warmup:]
    if not timed_out:
        if any(rcs) or any(d is None for d in dones):
            tail = [ln for o in outputs for ln in o.splitlines() if ln.strip()][-8:]
            rec.update(status="error", error="exit codes %s: %s" % (
                rcs, " | ".join(tail)[-700:]))
            return rec
        rec["status"] = "ok"
        rec["median_step_s"] = statistics.median(timed) if timed else None
        return rec
    rec["status"] = "capped"
    # the unfinished step began when the slower rank finished the step before
    if n:
        began = max(p[1][n - 1]["wall"] for p in parsed)
    elif all(s is not None for s in starts):
        began = max(s["wall"] for s in starts)
    else:
        began = None
    lb = max(0.0, t_kill - began) if began is not None else None
    rec["unfinished_step_lb_s"] = lb
    if n >= warmup and lb is not None:
        # the median with the unfinished step's bound is a lower bound of the true one
        rec["median_step_s"] = statistics.median(timed + [lb])
        rec["lower_bound"] = True
    return rec


def run_one(bed, stack, a, cap, log):
    st = parse_stack(stack)
    argv = [sys.executable, "-m", "bench.torch_wan", "--worker", "--backend", st["backend"],
            "--hook", st["hook"], "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--hidden", str(a.hidden), "--dim", str(a.dim), "--batch", str(a.batch),
            "--lr", str(a.lr), "--seed", str(a.seed)]
    if st["tcp_cc"]:
        bed.set_cc(st["tcp_cc"])
    env = dict(st["env"])
    env["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                if os.environ.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        bed.link_stats(reset=True)
    except Exception:   # a diagnostic: never fail a run on it
        pass
    before = bed.link_bytes()
    load0 = os.getloadavg()[0]
    t0 = time.time()
    job = None
    try:
        if st["backend"] == "erdma":
            job = bed.erdmampi_job(argv, env=env)
        else:
            job = bed.torch_job(argv, env=env, port=next(_port))
    except Exception as e:
        rec = {"status": "error", "step_times": [], "losses": [], "median_step_s": None,
               "lower_bound": False, "error": "could not start: %s" % str(e)[:500]}
    if job is not None:
        rcs = job.wait(timeout=cap)
    t_kill = time.time()
    if job is not None:
        outs = job.outputs()
        rec = evaluate(outs, bed.sites, job.timed_out, rcs, t_kill, a.warmup)
        if rec["status"] != "ok":
            rec["output_tail"] = [o[-1500:] for o in outs]
    after = bed.link_bytes()
    rec.update(stack=stack, wall_s=round(t_kill - t0, 2), env=dict(st["env"]),
               tcp_cc=st["tcp_cc"], load=round((load0 + os.getloadavg()[0]) / 2, 2),
               link_up_bytes=sum(x["up"] - y["up"] for x, y in zip(after, before)))
    try:
        ls = bed.link_stats(reset=True)
        dirs = [d for s in ls.values() for d in s.values()]
        rec["delayline"] = {"late_p99_us_max": max(d.get("late_p99_us", 0) for d in dirs),
                            "drop_full": sum(d.get("drop_full", 0) for d in dirs),
                            "drop_tx": sum(d.get("drop_tx", 0) for d in dirs)}
    except Exception as e:
        rec["delayline"] = {"error": str(e)}
    m = rec["median_step_s"]
    log("  %-11s %-7s %s  %d steps, %.0f s%s" % (
        stack, rec["status"],
        ("%s%.3f s/step" % ("> " if rec["lower_bound"] else "", m)) if m is not None else
        (rec["error"] or "no timed step"), len(rec["step_times"]), rec["wall_s"],
        ", final loss %.4f" % rec["losses"][-1] if rec["losses"] else ""))
    return rec


# -- summary --------------------------------------------------------------------------

def summarize(runs, cells):
    """Per cell and stack: median over repetitions of each run's median step time."""
    rows = []
    for cell in cells:
        row = {"cell": cell["key"], "loss": cell["loss"], "rtt_ms": cell["rtt_ms"],
               "rate": cell["rate"], "rtt_measured_ms": cell.get("rtt_measured_ms"),
               "stacks": {}}
        for stack in cell["stacks"]:
            mine = [r for r in runs if r["cell"] == cell["key"] and r["stack"] == stack]
            if not mine:
                continue
            errs = [r for r in mine if r["status"] == "error"]
            if errs:
                row["stacks"][stack] = {"status": "error", "error": errs[0]["error"],
                                        "time_s": None, "lower_bound": False}
                continue
            vals = [r["median_step_s"] for r in mine]
            if any(v is None for v in vals):
                row["stacks"][stack] = {"status": "capped", "time_s": None,
                                        "lower_bound": True,
                                        "steps": [len(r["step_times"]) for r in mine]}
                continue
            bound = any(r["lower_bound"] for r in mine)
            row["stacks"][stack] = {
                "status": "capped" if bound else "ok", "time_s": statistics.median(vals),
                "lower_bound": bound, "reps": len(mine), "runs_s": vals,
                "steps": [len(r["step_times"]) for r in mine],
                "final_loss": statistics.median(r["losses"][-1] for r in mine
                                                if r["losses"]) if any(
                    r["losses"] for r in mine) else None}
        row["speedups"] = {"%s/%s" % (e, g): _speedup(row["stacks"], e, g) for e, g in PAIRS
                           if e in row["stacks"] and g in row["stacks"]}
        rows.append(row)
    return rows


def _speedup(stacks, erd, gloo):
    """gloo's step time / erd's: {"value", "kind": "=" | ">="} or None."""
    e, g = stacks.get(erd), stacks.get(gloo)
    if not e or not g or e.get("time_s") is None or e["lower_bound"] \
            or g.get("time_s") is None:
        return None
    return {"value": g["time_s"] / e["time_s"], "kind": ">=" if g["lower_bound"] else "="}


def _fmt_time(v):
    if v is None:
        return "–"
    if v["status"] == "error":
        return "**error**"
    if v.get("time_s") is None:
        return "> cap"
    s = "%.3g s" % v["time_s"]
    return ("> " + s + " †") if v["lower_bound"] else s


def _fmt_speedup(r):
    if r is None:
        return "–"
    return "%s%.2f×" % ("≥ " if r["kind"] == ">=" else "", r["value"])


def markdown(rows, meta):
    stacks = meta["stacks"]
    wl = meta["workload"]
    out = ["Generated by `%s` (%s, %.0f s; load average %s; git %s)." % (
        meta["command"], meta["time"], meta["elapsed_s"],
        " → ".join("%.1f" % x for x in meta["loadavg"]), meta.get("git", "?")), "",
        "2 sites, one rank each, %s links, %g ms RTT; DDP of an MLP with %s float32 "
        "parameters (%.1f MB of gradients per step), batch %d per rank, %d steps per run, "
        "%d run(s) per stack and cell. Step time: median over the steps after the "
        "first %d of each run, median over the runs. The uncompressed `erdma` stack runs "
        "with `ERDMA_COMPRESS=off`; `erdma+int8` is DDP with "
        "`erdmampi.torch.hooks.compress_hook` in int8 mode (error feedback). Speedup = "
        "the gloo stack's step time / the erdma stack's (> 1: erdma faster). † = runs "
        "killed at the %g s cap: a lower bound from the steps they finished and how "
        "long the unfinished one had run." % (
            meta["rate"], meta["rtt_ms"], "{:,}".format(wl["params"]) if wl.get("params")
            else "?", 4 * (wl.get("params") or 0) / 1e6, wl["batch"], wl["steps"],
            meta["reps"], wl["warmup"], meta["time_cap"]), ""]
    pairs = [p for p in PAIRS if p[0] in stacks and p[1] in stacks]
    head = ["loss", "RTT measured"] + stacks + ["%s ÷ %s" % (e, g) for e, g in pairs]
    out.append("| " + " | ".join(head) + " |")
    out.append("|---:|---:|" + "---:|" * (len(head) - 2))
    for r in rows:
        rtt = r.get("rtt_measured_ms")
        cells = ["%g%%" % (100 * r["loss"]), "%.1f ms" % rtt if rtt else "–"]
        cells += [_fmt_time(r["stacks"].get(s)) for s in stacks]
        cells += [_fmt_speedup(r["speedups"].get("%s/%s" % p)) for p in pairs]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("Final training loss (mean of the ranks' last batch losses, median over "
               "runs): " + "; ".join(
                   "%g%% loss: %s" % (100 * r["loss"], ", ".join(
                       "%s %.4f" % (s, v["final_loss"]) for s, v in r["stacks"].items()
                       if v.get("final_loss") is not None)) for r in rows) + ".")
    out.append("")
    errs = [(r, s, v) for r in rows for s, v in r["stacks"].items() if v["status"] == "error"]
    if errs:
        out.append("Errors: " + "; ".join("%s at %g%% loss: %s" % (s, 100 * r["loss"],
                                                                    v["error"])
                                          for r, s, v in errs))
        out.append("")
    if meta.get("bed_errors"):
        out.append("Cells whose bed failed: " + "; ".join(meta["bed_errors"]))
        out.append("")
    if meta.get("late_runs"):
        out.append("%d run(s) saw the delay line send frames more than 1 ms late (p99) or "
                   "drop on a full delay queue (see `delayline` in the JSON)."
                   % meta["late_runs"])
        out.append("")
    return "\n".join(out)


COLOR = {"erdma": "tab:red", "erdma+int8": "darkorange", "gloo-bbr": "tab:green",
         "gloo-cubic": "tab:blue"}
STYLE = {"erdma": "-", "erdma+int8": "-", "gloo-bbr": "--", "gloo-cubic": ":"}


def plot(runs, meta, path):
    """Loss curves per loss cell (columns): against the step (top) and against the
    training time, the sum of the step times (bottom); the first repetition of each
    stack.  None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cells = [c for c in meta["cells"] if any(r["cell"] == c["key"] for r in runs)]
    if not cells:
        return None
    fig, axes = plt.subplots(2, len(cells), figsize=(max(7.0, 5.2 * len(cells)), 6.4),
                             squeeze=False)
    for j, cell in enumerate(cells):
        top, bot = axes[0][j], axes[1][j]
        for stack in meta["stacks"]:
            mine = sorted((r for r in runs if r["cell"] == cell["key"] and
                           r["stack"] == stack and r["losses"]), key=lambda r: r["rep"])
            if not mine:
                continue
            r = mine[0]
            kw = dict(color=COLOR.get(stack, "grey"), ls=STYLE.get(stack, "-"), lw=1.4,
                      label=stack + (" (capped)" if r["status"] == "capped" else ""))
            top.plot(range(len(r["losses"])), r["losses"], **kw)
            # the loss of step i is that of the weights after steps 0..i-1
            t = [0.0] + list(itertools.accumulate(r["step_times"]))[:-1]
            bot.plot(t, r["losses"], **kw)
        title = "%g%% loss, %s, RTT %g ms" % (100 * cell["loss"], cell["rate"],
                                             cell["rtt_ms"])
        top.set_title(title, fontsize=9)
        top.set_xlabel("step", fontsize=8)
        bot.set_xlabel("training time, s (sum of step times)", fontsize=8)
        for ax in (top, bot):
            ax.set_ylabel("training loss", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, alpha=0.3)
        top.legend(fontsize=7)
    fig.suptitle("DDP across 2 sites: erdma (ERDMA_COMPRESS=off), erdma + int8 hook, gloo\n"
                 "(first run of each stack; batch loss averaged over the ranks)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# -- main -----------------------------------------------------------------------------

def parse_args(argv=None):
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="python -m bench.torch_wan", description=doc[0],
                                epilog="\n\n".join(doc[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--losses", default=None, help="loss per router crossing, one bed each "
                   "(default 0,0.01; --quick 0)")
    p.add_argument("--rate", default="100mbit", help="each site's link rate (100mbit)")
    p.add_argument("--rtt", type=float, default=50.0, help="round trip in ms (50)")
    p.add_argument("--stacks", default=",".join(STACKS), help="default %(default)s")
    p.add_argument("--variant", action="append", default=[], metavar="STACK~NAME:K=V,...",
                   help="one more stack: erdma or erdma+int8 with extra environment, e.g. "
                   "erdma+int8~cap:ERDMA_PACE_CAP=1.25 (name it in --stacks)")
    p.add_argument("--reps", type=int, default=None, help="runs per stack and cell (1)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run "
                   "(default 40; --quick 8)")
    p.add_argument("--warmup", type=int, default=2,
                   help="first steps left out of the median (default 2)")
    p.add_argument("--hidden", type=int, default=None,
                   help="hidden layer width (default 1024: 1.32 M parameters; --quick 512)")
    p.add_argument("--dim", type=int, default=256, help="input features (256)")
    p.add_argument("--batch", type=int, default=128, help="samples per rank and step (128)")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (0.05)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=8192, help="samples per rank (8192)")
    p.add_argument("--time-cap", type=float, default=None,
                   help="seconds per run, start-up included (default 120; --quick 60)")
    p.add_argument("--quick", action="store_true",
                   help="smoke preset: loss 0, 8 steps, hidden 512, 1 repetition")
    p.add_argument("--json", default=None, help="default bench/results/torch_wan-<date>.json")
    p.add_argument("--md", default=None, help="default: the JSON path with .md")
    p.add_argument("--png", default=None, help="default: the JSON path with .png")
    p.add_argument("--from-json", metavar="JSON",
                   help="run nothing: rewrite --md / --png from an earlier JSON")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="erdma", help=argparse.SUPPRESS)
    p.add_argument("--hook", default="none", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    q = a.quick
    for k, v in {"losses": "0" if q else "0,0.01", "reps": 1, "steps": 8 if q else 40,
                 "hidden": 512 if q else 1024, "time_cap": 60.0 if q else 120.0}.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.worker:
        return a
    try:
        a.losses = [float(x) for x in a.losses.split(",") if x.strip()]
        a.stacks = [s for s in a.stacks.split(",") if s]
        for v in a.variant:
            parse_variant(v)
        for s in a.stacks:
            parse_stack(s)
    except ValueError as e:
        p.error(str(e))
    if any(not 0 <= x < 1 for x in a.losses) or a.rtt < 0:
        p.error("0 <= loss < 1 and RTT >= 0")
    if a.reps < 1 or a.steps <= a.warmup or a.time_cap <= 0 or a.warmup < 0:
        p.error("--reps >= 1, --steps > --warmup >= 0 and --time-cap > 0")
    if len(set(a.stacks)) != len(a.stacks):
        p.error("a stack is listed twice")
    from erdmampi.testing.wan import parse_rate
    try:
        a.rate_bps = parse_rate(a.rate)
    except ValueError as e:
        p.error(str(e))
    if a.json is None and not a.from_json:
        a.json = os.path.join(HERE, "results", "torch_wan-%s.json"
                              % time.strftime("%Y%m%d-%H%M%S"))
    stem = (a.json or a.from_json)[:-5] if (a.json or a.from_json).endswith(".json") \
        else (a.json or a.from_json)
    a.md = a.md or stem + ".md"
    a.png = a.png or stem + ".png"
    return a


def write_outputs(a, meta, runs, final=True):
    rows = summarize(runs, meta["cells"])
    meta["late_runs"] = sum(1 for r in runs if r.get("delayline", {}).get("late_p99_us_max", 0)
                            > 1000 or r.get("delayline", {}).get("drop_full", 0))
    params = next((r["params"] for r in runs if r.get("params")), None)
    meta["workload"]["params"] = params
    doc = {"meta": meta, "summary": rows, "runs": runs}
    if a.json and not a.from_json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.json)
    if not final:
        return None, None
    md = markdown(rows, meta)
    write_between_markers(a.md, md, MD_BEGIN, MD_END)
    png = plot(runs, meta, a.png)
    return md, png


def main(argv=None):
    a = parse_args(argv)
    if a.worker:
        return worker(a)
    if a.from_json:
        with open(a.from_json) as f:
            doc = json.load(f)
        md, png = write_outputs(a, doc["meta"], doc["runs"])
        print(md)
        log("wrote %s%s" % (a.md, ", " + png if png else ""))
        return 0

    from erdmampi.testing.wan import WanBed, bed_available
    why = bed_available()
    if why:
        log("bench.torch_wan: the WAN bed is not available: %s" % why)
        return 2
    meta = {"command": "python -m bench.torch_wan " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": git_head(),
            "host_cpus": os.cpu_count(), "loadavg": [os.getloadavg()[0]],
            "rate": a.rate, "rate_bps": a.rate_bps, "rtt_ms": a.rtt, "time_cap": a.time_cap,
            "reps": a.reps, "stacks": a.stacks,
            "workload": {"steps": a.steps, "warmup": a.warmup, "dim": a.dim,
                         "hidden": a.hidden, "classes": 10, "batch": a.batch, "lr": a.lr,
                         "seed": a.seed, "samples": a.samples, "optimizer": "SGD momentum 0.9"},
            "note": "the erdma stacks run with ERDMA_COMPRESS=off (erdma+int8 compresses "
                    "in its DDP hook only)",
            "cells": [], "bed_errors": [], "elapsed_s": 0.0}
    log("bench.torch_wan: the uncompressed erdma stack runs with ERDMA_COMPRESS=off")
    runs = []
    t_start = time.time()
    from erdmampi.testing.progress import Progress
    bar = Progress(len(a.losses) * a.reps * len(a.stacks), "bench.torch_wan")
    for loss in a.losses:
        key = "2-%s-%g-%g" % (a.rate, a.rtt, loss)
        cell = {"key": key, "sites": 2, "rate": a.rate, "rate_bps": a.rate_bps,
                "rtt_ms": a.rtt, "loss": loss, "stacks": a.stacks,
                "load_start": os.getloadavg()[0]}
        meta["cells"].append(cell)
        log("cell: 2 sites, %s, RTT %g ms, loss %g%% (load %.1f)" % (
            a.rate, a.rtt, 100 * loss, cell["load_start"]))
        try:
            with WanBed(sites=2, rate=a.rate, delay_ms=a.rtt / 2, loss=loss,
                        cc="cubic") as bed:
                cell["bed"] = bed.config
                try:
                    rtts = bed.ping(0, 1, count=20)
                    cell["rtt_measured_ms"] = statistics.median(rtts) if rtts else None
                    log("  RTT measured: median %.1f ms over %d UDP echoes" % (
                        cell["rtt_measured_ms"], len(rtts)))
                except Exception as e:
                    log("  RTT measurement failed: %s" % e)
                for rep in range(a.reps):
                    k = (rep + len(meta["cells"]) - 1) % len(a.stacks)
                    for stack in a.stacks[k:] + a.stacks[:k]:
                        bar.step("%g%% loss, rep %d: %s" % (100 * loss, rep, stack))
                        rec = run_one(bed, stack, a, a.time_cap, log)
                        bar.advance()
                        rec.update(cell=key, rep=rep)
                        runs.append(rec)
                        meta["elapsed_s"] = round(time.time() - t_start, 1)
                        write_outputs(a, meta, runs, final=False)   # keep what we have
        except Exception as e:   # a bed that cannot be built: note it, go on
            log("  bed failed: %s" % e)
            meta["bed_errors"].append("%s: %s" % (key, str(e)[:300]))
        cell["load_end"] = os.getloadavg()[0]
    bar.close()
    meta["loadavg"].append(os.getloadavg()[0])
    meta["elapsed_s"] = round(time.time() - t_start, 1)
    md, png = write_outputs(a, meta, runs)
    print(md)
    log("wrote %s, %s%s" % (a.json, a.md, ", " + png if png else ""))
    bad = [r for r in runs if r["status"] == "error"]
    return 1 if bad or meta["bed_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
