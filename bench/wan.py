"""erdmampi against gloo and MPICH over emulated wide-area links.

    python -m bench.wan --quick                      # smoke run, ~30 s here
    python -m bench.wan --sites 2 --rates 100mbit --rtts 20,100 --losses 0,0.01 \\
        --sizes 16MiB --colls allreduce --time-cap 90
    python -m bench.wan --from-json bench/results/wan.json --md docs/wan_results.md

Runs ``erdmampi.testing.workload`` (exact float32 inputs, every rank checks its
result) on ``erdmampi.testing.wan.WanBed`` for the matrix sites x rate x RTT x
loss x collective x size x stack.  One bed is built per (sites, rate, RTT,
loss) cell and every run of that cell happens inside it; within a cell the
stacks take turns, the order rotating from one (size, collective, repetition)
to the next, because a shared machine's speed drifts: compare stacks within a
cell, not across runs.

Stacks: ``erdmampi`` (the engine's default congestion control; ``erdmampi-bbr``
or ``erdmampi-cubic`` set ERDMA_CC; ``erdmampi-ring`` forces the ring allreduce
and the chained bcast that two hosts used before ``collectives/wan.py``;
``erdmampi+MODE`` sets ERDMA_COMPRESS=MODE,
otherwise ERDMA_COMPRESS=off: the workload's default data are small integers,
which compress far better than real data; ``--data gradients`` sends the
float32 gradients of ``bench/codec_data.py`` instead, for runs that measure
compression), ``gloo-cubic``, ``gloo-bbr``,
``mpich-cubic``, ``mpich-bbr`` (the TCP congestion control of the sites).

A run that exceeds ``--time-cap`` seconds (start-up included) is killed and
reported as capped: with the iterations that finished (checked on every rank)
if any, else with a lower bound on the time (how long the unfinished
iteration had been running).  A wrong result is an error, never a number.

Throughput follows nccl-tests: algbw = payload bytes / time, busbw = algbw x
2(n-1)/n for Allreduce (x 1 for Bcast); utilisation = busbw / bottleneck rate
(what each site's uplink must carry at least, per second, over its rate).
Ratios are erdmampi's busbw over the best TCP baseline's with the same
congestion control (> 1: erdmampi faster).
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
if __package__ in (None, ""):  # run as a file: python bench/wan.py
    sys.path.insert(0, ROOT)
from bench.common import (MIB, format_size, git_head, parse_env_spec, parse_size,  # noqa: E402
                          write_between_markers)

BASE_STACKS = ("erdmampi", "gloo-cubic", "gloo-bbr", "mpich-cubic", "mpich-bbr")
TCP_CCS = ("cubic", "bbr")
COLLS = ("allreduce", "bcast")
MD_BEGIN, MD_END = "<!-- bench.wan table begin -->", "<!-- bench.wan table end -->"
WARMUP_BYTES = 256 << 10          # warm-up iteration: connections up, rendezvous path used
_port = itertools.count(29500)


# -- stacks ---------------------------------------------------------------------------

#: --variant NAME:K=V,...: erdmampi stacks with extra environment (NAME starts with
#: "erdmampi~"); the key ROOT=DIR runs the erdmampi of another tree (its build)
VARIANTS = {}


def parse_variant(text):
    """'erdmampi~NAME:K=V,K=V' -> (name, env); registers the stack."""
    name, _, spec = text.partition(":")
    if not name.startswith("erdmampi~") or len(name) <= len("erdmampi~") or "," in name:
        raise ValueError("a variant is named erdmampi~NAME: %r" % text)
    env = parse_env_spec(name, spec)
    VARIANTS[name] = env
    return name, env


def parse_stack(name):
    """'erdmampi[-CC][+COMPRESS]', 'gloo-CC', 'mpich-CC' -> dict(kind, cc, env)."""
    if name in VARIANTS:
        env = {"ERDMA_COMPRESS": "off"}
        env.update(VARIANTS[name])
        root = env.pop("ROOT", None)
        return {"name": name, "kind": "erdmampi", "workload": "erdmampi", "tcp_cc": None,
                "env": env, "root": root}
    base, _, compress = name.partition("+")
    kind, _, cc = base.partition("-")
    if kind == "erdmampi":
        if cc and cc not in ("cubic", "bbr", "bbr2", "reno", "ring"):
            raise ValueError("erdmampi congestion control must be cubic, bbr, bbr2 or reno "
                             "(or erdmampi-ring): %r" % name)
        env = {"ERDMA_COMPRESS": compress or "off"}
        if cc == "ring":     # the algorithms before collectives/wan.py (two hosts)
            env.update(ERDMA_COLL_ALLREDUCE="sched_ring", ERDMA_COLL_BCAST="sched_chain")
        elif cc:
            env["ERDMA_CC"] = cc
        return {"name": name, "kind": kind, "workload": "erdmampi", "tcp_cc": None, "env": env}
    if kind in ("gloo", "mpich"):
        if cc not in TCP_CCS or compress:
            raise ValueError("%s needs a TCP congestion control, %s-cubic or %s-bbr: %r"
                             % (kind, kind, kind, name))
        return {"name": name, "kind": kind, "workload": "gloo" if kind == "gloo" else "mpi4py",
                "tcp_cc": cc, "env": {}}
    raise ValueError("unknown stack %r (erdmampi[-CC][+MODE], gloo-cubic, gloo-bbr, "
                     "mpich-cubic, mpich-bbr)" % name)


def busbw_factor(coll, n):
    return 2.0 * (n - 1) / n if coll == "allreduce" else 1.0


# -- one run --------------------------------------------------------------------------

def parse_progress(text):
    """Progress lines of the workload -> (begins {iter: (warmup, wall)},
    iters {iter: {rank: (warmup, time, ok)}}, final record or None)."""
    begins, iters, final = {}, {}, None
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        ev = d.get("event")
        if ev == "begin":
            begins[d["iter"]] = (d["warmup"], d["wall"])
        elif ev == "iter":
            iters.setdefault(d["iter"], {})[d["rank"]] = (d["warmup"], d["time"], d["ok"])
        elif "times" in d and "ok" in d:
            final = d
    return begins, iters, final


def evaluate(outputs, nranks, timed_out, rcs, t_kill):
    """Turn a job's outputs into a run record: status ok / capped / error, the times
    of the timed iterations every rank finished (max over ranks), and for a capped
    run without any, a lower bound on the time of the unfinished one."""
    text = "\n".join(outputs)
    begins, iters, final = parse_progress(text)
    rec = {"status": None, "times": [], "time_lb": None, "error": None}
    wrong = [i for i, rs in iters.items() if any(not ok for _, _, ok in rs.values())]
    if wrong or (final is not None and not final["ok"]):
        rec["status"] = "error"
        rec["error"] = "wrong result (iterations %s)" % (sorted(wrong) or "?")
        return rec
    done = sorted(i for i, rs in iters.items()
                  if len(rs) == nranks and not next(iter(rs.values()))[0])
    rec["times"] = [max(t for _, t, _ in iters[i].values()) for i in done]
    if not timed_out and (any(rcs) or final is None):
        rec["status"] = "error"
        tail = [ln for ln in text.splitlines() if ln.strip()][-6:]
        rec["error"] = "exit codes %s: %s" % (rcs, " | ".join(tail)[-600:])
        return rec
    if final is not None and final.get("times_max"):
        rec["times"] = list(final["times_max"])
        if timed_out:
            # every iteration finished and was checked, then the job did not exit
            # before the cap (MPICH/UCX now and then hangs in MPI_Finalize under loss)
            rec["status"] = "ok"
            rec["note"] = "finished its iterations, then did not exit: killed at the cap"
            return rec
    if not timed_out and not rec["times"]:
        # the job ended well but not every rank reported a timed iteration: its output
        # was cut or garbled, so no time can be given
        rec["status"] = "error"
        rec["error"] = "no timed iteration reported by all %d ranks" % nranks
        return rec
    if not timed_out:
        rec["status"] = "ok"
        return rec
    rec["status"] = "capped"
    unfinished = [i for i, (warm, _) in begins.items() if not warm and i not in done]
    if unfinished:
        rec["time_lb"] = max(0.0, t_kill - begins[min(unfinished)][1])
    return rec


_inputs = {}


def input_file(data, nbytes, ranks):
    """The workload's ``--input`` file for ``--data gradients`` (None for the
    default small integers): ``ranks`` gradient sets of ``nbytes`` each, made
    once per size in a temporary folder every site of the bed can read."""
    if data == "ints":
        return None
    key = (data, nbytes, ranks)
    if key not in _inputs:
        import tempfile
        import numpy as np
        from bench.codec_data import gradients
        d = tempfile.mkdtemp(prefix="bench-wan-")
        path = os.path.join(d, "%s-%d-%d.npy" % key)
        np.save(path, gradients(nbytes * ranks, seed=0))
        os.chmod(d, 0o755)
        _inputs[key] = path
    return _inputs[key]


def run_one(bed, stack, coll, nbytes, cap, iters, log, data="ints"):
    """One job of ``stack`` on ``bed``: -> run record (see :func:`evaluate`)."""
    st = parse_stack(stack)
    count = nbytes // 4
    argv = [sys.executable, "-m", "erdmampi.testing.workload", "--stack", st["workload"],
            "--op", coll, "--count", str(count), "--iters", str(iters), "--warmup", "1",
            "--warmup-count", str(min(count, WARMUP_BYTES // 4)),
            "--max-seconds", "%.1f" % (cap / 4), "--progress"]
    path = input_file(data, nbytes, bed.sites)
    if path:
        argv += ["--input", path]
    if st["tcp_cc"]:
        bed.set_cc(st["tcp_cc"])
    env = dict(st["env"])
    env["PYTHONPATH"] = (st.get("root") or ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                if os.environ.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    try:
        bed.link_stats(reset=True)
    except Exception:   # counters are a diagnostic: never fail a run on them
        pass
    before = bed.link_bytes()
    load0 = os.getloadavg()[0]
    t0 = time.time()
    try:
        if st["kind"] == "erdmampi":
            job = bed.erdmampi_job(argv, env=env)
        elif st["kind"] == "gloo":
            job = bed.torch_job(argv, env=env, port=next(_port))
        else:
            job = bed.mpich_job(argv, env=env)
    except Exception as e:   # e.g. the rendezvous store did not start: this run fails
        job = None
        rec = {"status": "error", "times": [], "time_lb": None,
               "error": "could not start: %s" % str(e)[:500]}
    if job is not None:
        rcs = job.wait(timeout=cap)
    t_kill = time.time()
    if job is not None:
        outs = job.outputs()
        rec = evaluate(outs, bed.sites, job.timed_out, rcs, t_kill)
        if rec["status"] != "ok":     # for diagnosis: the end of each process's output
            rec["output_tail"] = [o[-1500:] for o in outs]
    after = bed.link_bytes()
    rec.update(stack=stack, coll=coll, bytes=nbytes, data=data, wall_s=round(t_kill - t0, 2),
               load=round((load0 + os.getloadavg()[0]) / 2, 2),
               env={k: v for k, v in st["env"].items()},
               link_up_bytes=sum(a["up"] - b["up"] for a, b in zip(after, before)))
    try:
        ls = bed.link_stats(reset=True)
        dirs = [d for s in ls.values() for d in s.values()]
        rec["delayline"] = {"late_p99_us_max": max(d.get("late_p99_us", 0) for d in dirs),
                            "late_max_us": max(d.get("late_max_us", 0) for d in dirs),
                            "drop_full": sum(d.get("drop_full", 0) for d in dirs),
                            "drop_tx": sum(d.get("drop_tx", 0) for d in dirs)}
    except Exception as e:
        rec["delayline"] = {"error": str(e)}
    t = rec["times"]
    log("  %-16s %-9s %8s  %-6s %s" % (
        stack, coll, format_size(nbytes), rec["status"],
        ("%.3f s (%s)" % (statistics.median(t), ", ".join("%.2f" % x for x in t))) if t else
        (("> %.1f s" % rec["time_lb"]) if rec["time_lb"] is not None else
         (rec["error"] or "no timed iteration finished")))
        + ("  (%s)" % rec["note"] if rec.get("note") else ""))
    return rec


# -- summary --------------------------------------------------------------------------

def summarize(runs, cells):
    """Rows per (cell, coll, size): per stack the time (median over repetitions of
    each run's median), whether it is a lower bound, busbw, utilisation; ratios."""
    rows = []
    for cell in cells:
        key = cell["key"]
        rs = [r for r in runs if r["cell"] == key]
        for coll, nbytes in sorted({(r["coll"], r["bytes"]) for r in rs},
                                   key=lambda x: (COLLS.index(x[0]) if x[0] in COLLS else 9,
                                                  x[1])):
            row = {"cell": key, "sites": cell["sites"], "rate_bps": cell["rate_bps"],
                   "rtt_ms": cell["rtt_ms"], "loss": cell["loss"], "coll": coll,
                   "bytes": nbytes, "stacks": {}}
            n = cell["sites"]
            for stack in cell["stacks"]:
                mine = [r for r in rs if r["coll"] == coll and r["bytes"] == nbytes
                        and r["stack"] == stack]
                if not mine:
                    continue
                if any(r["status"] == "error" for r in mine):
                    row["stacks"][stack] = {"status": "error",
                                            "error": next(r["error"] for r in mine
                                                          if r["status"] == "error")}
                    continue
                vals, bound = [], False
                for r in mine:
                    if r["times"]:
                        ts = list(r["times"])
                        if r["status"] == "capped" and r["time_lb"] is not None:
                            # the unfinished iteration took at least time_lb: the median
                            # with it is a lower bound of the run's true median
                            ts.append(r["time_lb"])
                            bound = True
                        vals.append(statistics.median(ts))
                    elif r["time_lb"] is not None:
                        vals.append(r["time_lb"])
                        bound = True
                    else:
                        vals.append(None)
                if any(v is None for v in vals):
                    row["stacks"][stack] = {"status": "capped", "time_s": None,
                                            "lower_bound": True, "link_mbps_run": statistics.median(
                                                r["link_up_bytes"] * 8 / n / r["wall_s"] / 1e6
                                                for r in mine)}
                    continue
                t = statistics.median(vals)
                alg = nbytes * 8 / t / 1e6 if t > 0 else None
                bus = alg * busbw_factor(coll, n) if alg is not None else None
                row["stacks"][stack] = {
                    "status": "capped" if bound else "ok", "time_s": t, "lower_bound": bound,
                    "algbw_mbps": alg, "busbw_mbps": bus,
                    "util": bus * 1e6 / cell["rate_bps"] if bus and cell["rate_bps"] else None,
                    "reps": len(mine),
                    # what each site sent into the router per second of the whole run
                    # (start-up included; headers and retransmissions too): for capped
                    # runs, a rough measure of how far they got
                    "link_mbps_run": statistics.median(
                        r["link_up_bytes"] * 8 / n / r["wall_s"] / 1e6 for r in mine)}
            # per erdmampi variant; "ratios" is the first one listed (the headline)
            row["ratios_by_stack"] = {
                s: {cc: _ratio(row["stacks"], cc, s) for cc in TCP_CCS}
                for s in cell["stacks"] if s.startswith("erdmampi") and s in row["stacks"]}
            first = next(iter(row["ratios_by_stack"].values()), {cc: None for cc in TCP_CCS})
            row["ratios"] = first
            rows.append(row)
    return rows


def _ratio(stacks, cc, erd_name):
    """erdmampi stack ``erd_name`` over the best TCP stack with ``cc``:
    {"value", "kind": "=" | ">=" | "<=", "vs"} or None."""
    erd = stacks.get(erd_name)
    peers = {k: v for k, v in stacks.items() if k.endswith("-" + cc)
             and not k.startswith("erdmampi")}
    if erd is None or erd.get("time_s") is None or not peers:
        return None
    if any(v["status"] == "error" or v.get("time_s") is None for v in peers.values()):
        return None
    best = min(peers, key=lambda k: peers[k]["time_s"])
    value = peers[best]["time_s"] / erd["time_s"]
    # the best peer's time is exact unless it is itself a bound (a bounded peer
    # above an exact one cannot be the fastest)
    peer_lb, erd_lb = peers[best]["lower_bound"], erd["lower_bound"]
    if peer_lb and erd_lb:
        return None
    kind = ">=" if peer_lb else "<=" if erd_lb else "="
    return {"value": value, "kind": kind, "vs": best}


def _fmt_rate(bps):
    if bps is None:
        return "unshaped"
    for unit, s in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= s:
            return ("%g " % (bps / s)) + unit
    return "%d bit/s" % bps


def _fmt_cell(v):
    if v is None:
        return "–"
    if v["status"] == "error":
        return "**error**"
    if v.get("time_s") is None:
        return "> cap"
    mbps = "%.3g" % v["busbw_mbps"]
    util = " (%.0f%%)" % (100 * v["util"]) if v.get("util") is not None else ""
    return ("< " + mbps + util + " †") if v["lower_bound"] else mbps + util


def _fmt_ratio(r):
    if r is None:
        return "–"
    sign = {"=": "", ">=": "≥ ", "<=": "≤ "}[r["kind"]]
    return "%s%.2g×" % (sign, r["value"]) if r["value"] < 10 else "%s%.0f×" % (sign, r["value"])


def markdown(rows, meta):
    stacks = meta["stacks"]
    out = ["Generated by `%s` (%s, %.0f s; load average %s; git %s)." % (
        meta["command"], meta["time"], meta["elapsed_s"],
        " → ".join("%.1f" % x for x in meta["loadavg"]), meta.get("git", "?")), "",
        "Each stack's cell: bus bandwidth in Mbit/s (payload, nccl-tests busbw) and in "
        "brackets the link utilisation (busbw / bottleneck rate). † = the run hit the "
        "time cap of %g s: an upper bound from how long the unfinished iteration had "
        "run. \"> cap\": no timed iteration started before the cap. ×cubic / ×bbr: "
        "erdmampi (each erdmampi stack where several ran) over the best TCP stack with "
        "that congestion control (> 1: erdmampi "
        "faster; ≥ / ≤ where a side is a bound)." % meta["time_cap"]
        + (" Data: float32 gradients (bench/codec_data.py)."
           if meta.get("data") == "gradients" else ""), ""]
    groups = []
    for r in rows:
        g = (r["sites"], r["rate_bps"], r["coll"], r["bytes"])
        if g not in groups:
            groups.append(g)
    for sites, rate, coll, nbytes in groups:
        out.append("**%s %s, %d sites, %s links**" % (coll.capitalize(), format_size(nbytes),
                                                      sites, _fmt_rate(rate)))
        out.append("")
        erds = [s for s in stacks if s.startswith("erdmampi")]
        ccs = [cc for cc in TCP_CCS if any(s.endswith("-" + cc) and not
                                            s.startswith("erdmampi") for s in stacks)]
        rcols = [(e, cc) for e in erds for cc in ccs]
        head = ["RTT", "loss"] + stacks + [
            ("×" + cc) if len(erds) == 1 else "%s ×%s" % (e, cc) for e, cc in rcols]
        out.append("| " + " | ".join(head) + " |")
        out.append("|---:|---:|" + "---:|" * (len(head) - 2))
        for r in rows:
            if (r["sites"], r["rate_bps"], r["coll"], r["bytes"]) != (sites, rate, coll, nbytes):
                continue
            cells = ["%g ms" % r["rtt_ms"], "%g%%" % (100 * r["loss"])]
            cells += [_fmt_cell(r["stacks"].get(s)) for s in stacks]
            cells += [_fmt_ratio(r.get("ratios_by_stack", {}).get(e, {}).get(cc))
                      for e, cc in rcols]
            out.append("| " + " | ".join(cells) + " |")
        out.append("")
        capped = ["%s %.2g (%g ms, %g%%)" % (s, v["link_mbps_run"], r["rtt_ms"], 100 * r["loss"])
                  for r in rows
                  if (r["sites"], r["rate_bps"], r["coll"], r["bytes"]) == (sites, rate, coll,
                                                                            nbytes)
                  for s, v in r["stacks"].items()
                  if v["status"] == "capped" and v.get("link_mbps_run") is not None]
        if capped:
            out.append("Capped runs, Mbit/s that each site sent into the router over the "
                       "whole run (start-up, headers and retransmissions included): "
                       + "; ".join(capped) + ".")
            out.append("")
    errs = [(r, s, v) for r in rows for s, v in r["stacks"].items() if v["status"] == "error"]
    if errs:
        out.append("Errors:")
        out.append("")
        for r, s, v in errs:
            out.append("- %s, %s %s, RTT %g ms, loss %g%%: %s" % (
                s, r["coll"], format_size(r["bytes"]), r["rtt_ms"], 100 * r["loss"], v["error"]))
        out.append("")
    if meta.get("bed_errors"):
        out.append("Cells whose bed failed: " + "; ".join(meta["bed_errors"]))
        out.append("")
    late = meta.get("late_runs", 0)
    if late:
        out.append("%d run(s) saw the delay line send frames more than 1 ms late (p99) or "
                   "drop on a full delay queue: the emulation fell behind there (see "
                   "`delayline` in the JSON)." % late)
        out.append("")
    return "\n".join(out)


def write_markdown(path, text, section=None):
    """Write ``text``; if ``path`` exists and holds the begin/end markers (with
    ``: SECTION`` before the ``-->`` when ``section`` is given), replace only what is
    between them (a hand-written page around generated tables)."""
    begin, end = MD_BEGIN, MD_END
    if section:
        begin, end = (m.replace(" -->", ": %s -->" % section) for m in (begin, end))
    write_between_markers(path, text, begin, end, required=bool(section))


COLOR = {"erdmampi": "tab:red", "erdmampi-bbr": "darkorange", "erdmampi-cubic": "firebrick",
         "erdmampi-ring": "lightcoral", "gloo-cubic": "tab:green", "gloo-bbr": "yellowgreen",
         "mpich-cubic": "tab:blue", "mpich-bbr": "lightskyblue"}


def plot(rows, meta, path):
    """Grouped bars of busbw per (RTT, loss), one panel per (sites, rate, coll, size);
    hatched bars are upper bounds (capped runs). None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    stacks = meta["stacks"]
    groups = []
    for r in rows:
        g = (r["sites"], r["rate_bps"], r["coll"], r["bytes"])
        if g not in groups:
            groups.append(g)
    if not groups:
        return None
    ncol = min(2, len(groups))
    nrow = (len(groups) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 3.2 * nrow), squeeze=False)
    width = 0.8 / max(1, len(stacks))
    for ax, g in zip(axes.flat, groups):
        ax.set_yscale("log")
        rs = [r for r in rows if (r["sites"], r["rate_bps"], r["coll"], r["bytes"]) == g]
        for j, s in enumerate(stacks):
            for i, r in enumerate(rs):
                v = r["stacks"].get(s)
                if not v or v.get("busbw_mbps") is None:
                    if v:
                        ax.text(i + (j - len(stacks) / 2 + 0.5) * width, 0, "x" if
                                v["status"] == "error" else "?", ha="center", va="bottom",
                                fontsize=7, color=COLOR.get(s, "grey"))
                    continue
                ax.bar(i + (j - len(stacks) / 2 + 0.5) * width, v["busbw_mbps"], width,
                       color=COLOR.get(s, "grey"), hatch="//" if v["lower_bound"] else None,
                       edgecolor="white" if v["lower_bound"] else None,
                       label=s if i == 0 else None)
        vals = [v["busbw_mbps"] for r in rs for v in r["stacks"].values()
                if v.get("busbw_mbps")]
        if g[1]:
            ax.axhline(g[1] / 1e6, color="k", lw=0.8, ls="--")
            vals.append(g[1] / 1e6)
        if vals:
            ax.set_ylim(min(vals) / 2, max(vals) * 1.5)
        ax.set_xticks(range(len(rs)))
        ax.set_xticklabels(["%g ms\n%g%%" % (r["rtt_ms"], 100 * r["loss"]) for r in rs],
                           fontsize=7)
        ax.set_ylabel("busbw Mbit/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_title("%s %s, %d sites, %s (dashed: link rate)" % (
            g[2], format_size(g[3]), g[0], _fmt_rate(g[1])), fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    per_row = 3 if ncol == 1 else 6
    fig.legend(handles, labels, loc="upper center", ncol=min(per_row, len(labels)),
               fontsize=8, frameon=False)
    rows_of_legend = (len(labels) + per_row - 1) // per_row
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.07 * rows_of_legend) / nrow))
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


# -- main -----------------------------------------------------------------------------

def _floats(text):
    return [float(x) for x in str(text).split(",") if x.strip()]


def parse_args(argv=None):
    doc = __doc__.split("\n\n")
    p = argparse.ArgumentParser(prog="python -m bench.wan", description=doc[0],
                                epilog="\n\n".join(doc[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sites", default=None, help="site counts (default 2,4)")
    p.add_argument("--rates", default=None, help="bottleneck rates (default 100mbit,1gbit)")
    p.add_argument("--rtts", default=None, help="round-trip times in ms (default 1,20,100)")
    p.add_argument("--losses", default=None,
                   help="loss per router crossing (default 0,0.001,0.01,0.03)")
    p.add_argument("--sizes", default=None, help="payload sizes (default 1MiB,16MiB,256MiB)")
    p.add_argument("--colls", default=None, help="collectives (default allreduce,bcast)")
    p.add_argument("--stacks", default=None,
                   help="default %s; also erdmampi-bbr, erdmampi-cubic, erdmampi+MODE "
                        "(ERDMA_COMPRESS=MODE), erdmampi-ring (the ring allreduce and "
                        "chained bcast, as before the two-host algorithms)"
                        % ",".join(BASE_STACKS))
    p.add_argument("--variant", action="append", default=[], metavar="erdmampi~NAME:K=V,...",
                   help="an erdmampi stack with extra environment variables, for A/B runs "
                        "in one bed (list it in --stacks); ROOT=DIR runs another tree's "
                        "build; repeatable")
    p.add_argument("--time-cap", type=float, default=None,
                   help="seconds per run, start-up included, before it is killed "
                        "(default 60; --quick 30)")
    p.add_argument("--queue-bdp", type=float, default=None,
                   help="bottleneck queue (each tbf) in bandwidth-delay products of the "
                        "cell (default: the bed's, 1 BDP, at least 128 KiB)")
    p.add_argument("--reps", type=int, default=None,
                   help="runs per stack, size and collective in each cell (default 1)")
    p.add_argument("--iters", type=int, default=3,
                   help="timed iterations per run at most (default 3; a run stops "
                        "early once they took a quarter of the cap)")
    p.add_argument("--data", choices=("ints", "gradients"), default="ints",
                   help="the vectors: small integers (default; exact, highly compressible) "
                        "or float32 gradients of a small MLP (bench/codec_data.py), "
                        "for runs that measure compression")
    p.add_argument("--quick", action="store_true",
                   help="smoke preset: 2 sites, 100mbit, RTT 2,20 ms, loss 0,0.01, 1MiB "
                        "allreduce, erdmampi,gloo-bbr,mpich-bbr, cap 30 s")
    p.add_argument("--json", default=None, help="default bench/results/wan-<date>.json")
    p.add_argument("--md", default=None, help="default: the JSON path with .md")
    p.add_argument("--png", default=None, help="default: the JSON path with .png")
    p.add_argument("--md-section", default=None, metavar="NAME",
                   help="replace only the block between '%s' and '%s' in --md, with "
                        "': NAME' before the '-->' (several generated tables in one page)"
                   % (MD_BEGIN, MD_END))
    p.add_argument("--from-json", metavar="JSON",
                   help="run nothing: rewrite --md / --png from an earlier JSON")
    a = p.parse_args(argv)
    q = a.quick
    defaults = {"sites": "2" if q else "2,4", "rates": "100mbit" if q else "100mbit,1gbit",
                "rtts": "2,20" if q else "1,20,100", "losses": "0,0.01" if q else
                "0,0.001,0.01,0.03", "sizes": "1MiB" if q else "1MiB,16MiB,256MiB",
                "colls": "allreduce" if q else "allreduce,bcast",
                "stacks": "erdmampi,gloo-bbr,mpich-bbr" if q else ",".join(BASE_STACKS),
                "time_cap": 30.0 if q else 60.0, "reps": 1}
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    try:
        a.sites = [int(x) for x in a.sites.split(",") if x]
        a.rates = [x for x in a.rates.split(",") if x]
        a.rtts = _floats(a.rtts)
        a.losses = _floats(a.losses)
        a.sizes = [parse_size(x) for x in a.sizes.split(",") if x]
        a.colls = [x for x in a.colls.split(",") if x]
        for v in a.variant:
            parse_variant(v)
        a.stacks = [x for x in a.stacks.split(",") if x]
        for s in a.stacks:
            parse_stack(s)
    except ValueError as e:
        p.error(str(e))
    from erdmampi.testing.wan import parse_rate
    try:
        a.rate_bps = [parse_rate(r) for r in a.rates]
    except ValueError as e:
        p.error(str(e))
    for c in a.colls:
        if c not in COLLS:
            p.error("unknown collective %r (allreduce, bcast)" % c)
    if any(s < 2 for s in a.sites) or any(x < 0 for x in a.rtts) or \
            any(not 0 <= x < 1 for x in a.losses):
        p.error("sites >= 2, RTT >= 0 and 0 <= loss < 1")
    if a.queue_bdp is not None and a.queue_bdp <= 0:
        p.error("--queue-bdp must be positive")
    if a.time_cap <= 0 or a.reps < 1 or a.iters < 1:
        p.error("--time-cap, --reps and --iters must be positive")
    if len(set(a.stacks)) != len(a.stacks):
        p.error("a stack is listed twice")
    if a.json is None:
        a.json = os.path.join(HERE, "results", "wan-%s.json" % time.strftime("%Y%m%d-%H%M%S"))
    stem = a.json[:-5] if a.json.endswith(".json") else a.json
    a.md = a.md or stem + ".md"
    a.png = a.png or stem + ".png"
    return a


def write_outputs(a, meta, runs, log):
    rows = summarize(runs, meta["cells"])
    meta["late_runs"] = sum(1 for r in runs if r.get("delayline", {}).get("late_p99_us_max", 0)
                            > 1000 or r.get("delayline", {}).get("drop_full", 0))
    doc = {"meta": meta, "summary": rows, "runs": runs}
    if a.json and not a.from_json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.json)
    md = markdown(rows, meta)
    write_markdown(a.md, md, a.md_section)
    png = plot(rows, meta, a.png)
    return md, png


def main(argv=None):
    a = parse_args(argv)

    def log(text):
        print(text, flush=True)

    if a.from_json:
        with open(a.from_json) as f:
            doc = json.load(f)
        md, png = write_outputs(a, doc["meta"], doc["runs"], log)
        log(md)
        log("wrote %s%s" % (a.md, ", " + png if png else ""))
        return 0

    from erdmampi.testing.wan import WanBed, bed_available
    why = bed_available()
    if why:
        log("bench.wan: the WAN bed is not available: %s" % why)
        return 2
    meta = {"command": "python -m bench.wan " + " ".join(
                argv if argv is not None else sys.argv[1:]),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": git_head(),
            "host_cpus": os.cpu_count(), "loadavg": [os.getloadavg()[0]],
            "time_cap": a.time_cap, "reps": a.reps, "iters": a.iters, "stacks": a.stacks,
            "data": a.data, "warmup_bytes": WARMUP_BYTES, "cells": [], "bed_errors": [],
            "elapsed_s": 0.0}
    runs = []
    t_start = time.time()
    rot = itertools.count()
    from erdmampi.testing.progress import Progress
    cells = list(itertools.product(a.sites, zip(a.rates, a.rate_bps), a.rtts, a.losses))
    bar = Progress(len(cells) * a.reps * len(a.colls) * len(a.sizes) * len(a.stacks), "bench.wan")
    for sites, (rate, rate_bps), rtt, loss in cells:
        key = "%d-%s-%g-%g" % (sites, rate, rtt, loss)
        cell = {"key": key, "sites": sites, "rate": rate, "rate_bps": rate_bps, "rtt_ms": rtt,
                "loss": loss, "stacks": a.stacks, "load_start": os.getloadavg()[0]}
        meta["cells"].append(cell)
        log("cell: %d sites, %s, RTT %g ms, loss %g%% (load %.1f)" % (
            sites, rate, rtt, 100 * loss, cell["load_start"]))
        try:
            qb = None
            if a.queue_bdp is not None and rate_bps:
                qb = max(128 << 10, int(rate_bps / 8 * rtt / 1000 * a.queue_bdp))
            with WanBed(sites=sites, rate=rate, delay_ms=rtt / 2, loss=loss,
                        queue_bytes=qb, cc="cubic") as bed:
                cell["bed"] = bed.config
                for rep, coll, nbytes in itertools.product(range(a.reps), a.colls, a.sizes):
                    k = next(rot) % len(a.stacks)
                    for stack in a.stacks[k:] + a.stacks[:k]:
                        bar.step("%s: %s %d bytes on %s" % (key, coll, nbytes, stack))
                        rec = run_one(bed, stack, coll, nbytes, a.time_cap, a.iters, log,
                                      a.data)
                        bar.advance()
                        rec.update(cell=key, rep=rep)
                        runs.append(rec)
                        meta["elapsed_s"] = round(time.time() - t_start, 1)
                        write_outputs(a, meta, runs, log)   # keep what we have
        except Exception as e:   # a bed that cannot be built: note it, go on
            log("  bed failed: %s" % e)
            meta["bed_errors"].append("%s: %s" % (key, str(e)[:300]))
        cell["load_end"] = os.getloadavg()[0]
    bar.close()
    meta["loadavg"].append(os.getloadavg()[0])
    meta["elapsed_s"] = round(time.time() - t_start, 1)
    md, png = write_outputs(a, meta, runs, log)
    log("\n" + md)
    log("wrote %s, %s%s" % (a.json, a.md, ", " + png if png else ""))
    bad = [r for r in runs if r["status"] == "error"]
    return 1 if bad or meta["bed_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
