"""bench.torch_wan: the run record of a DDP job (steps every rank finished, capped
runs as lower bounds), the speedups, and a --quick run in the WAN bed: step times for
every stack, the same initial model everywhere, the uncompressed erdma and gloo runs
ending at the same loss.  The bed run needs root, the bed's tools and torch."""
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from erdmampi.testing import wan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import torch_wan as tw  # noqa: E402

_why = wan.bed_available() if os.geteuid() == 0 else "needs root"
if _why is None and importlib.util.find_spec("torch") is None:
    _why = "torch is not installed (scripts/setup_bench.sh)"
needs_bed = pytest.mark.skipif(_why is not None, reason=_why or "")


def _out(rank, steps, t0=100.0, dt=1.0, done=True):
    lines = [{"event": "start", "rank": rank, "params": 10, "wall": t0,
              "erdma_compress": "off"}]
    lines += [{"event": "step", "rank": rank, "step": i, "loss": 2.0 - 0.1 * i + rank,
               "time": dt * (i + 1) if i < 2 else dt + 0.1 * rank, "wall": t0 + dt * (i + 1)}
              for i in range(steps)]
    if done:
        lines.append({"event": "done", "rank": rank, "steps": steps, "param_sum": 1.5})
    return "\n".join(json.dumps(d) for d in lines)


def test_parse_stack_and_args():
    assert tw.parse_stack("erdma")["env"] == {"ERDMA_COMPRESS": "off"}
    assert tw.parse_stack("erdma+int8")["hook"] == "int8"
    assert tw.parse_stack("gloo-cubic")["tcp_cc"] == "cubic"
    for bad in ("gloo", "gloo-bbr+int8", "erdma+bf16", "mpich-bbr"):
        with pytest.raises(ValueError):
            tw.parse_stack(bad)
    a = tw.parse_args(["--quick", "--json", "/tmp/x.json"])
    assert a.losses == [0.0] and a.md == "/tmp/x.md" and a.png == "/tmp/x.png"
    assert tw.parse_args(["--json", "/tmp/x.json"]).losses == [0.0, 0.01]
    with pytest.raises(SystemExit):
        tw.parse_args(["--steps", "2", "--warmup", "2"])


def test_evaluate_ok_and_capped():
    r = tw.evaluate([_out(0, 6), _out(1, 6)], 2, False, [0, 0], 200.0, 2)
    assert r["status"] == "ok" and len(r["step_times"]) == 6
    assert r["step_times"][3] == pytest.approx(1.1)          # the slower rank's
    assert r["losses"][0] == pytest.approx(2.5)              # the ranks' mean
    assert r["median_step_s"] == pytest.approx(1.1) and r["erdma_compress"] == "off"
    # killed at the cap: rank 1 finished 4 steps, rank 0 five; step 4 began at 104
    r = tw.evaluate([_out(0, 5, done=False), _out(1, 4, done=False)], 2, True, [-15, -15],
                    110.0, 2)
    assert r["status"] == "capped" and len(r["step_times"]) == 4 and r["lower_bound"]
    assert r["unfinished_step_lb_s"] == pytest.approx(6.0)
    assert r["median_step_s"] == pytest.approx(1.1)          # median(1.1, 1.1, 6.0)
    # not even the warm-up done: no step time at all
    r = tw.evaluate([_out(0, 1, done=False), _out(1, 1, done=False)], 2, True, [-15, -15],
                    150.0, 2)
    assert r["status"] == "capped" and r["median_step_s"] is None
    r = tw.evaluate([_out(0, 6), _out(1, 3, done=False)], 2, False, [0, 1], 200.0, 2)
    assert r["status"] == "error"


def test_summary_speedups_and_markdown():
    cell = {"key": "c", "loss": 0.01, "rtt_ms": 50.0, "rate": "100mbit",
            "rtt_measured_ms": 50.4, "stacks": list(tw.STACKS)}
    base = {"cell": "c", "rep": 0, "losses": [2.3, 2.0], "step_times": [1.0, 1.0]}
    runs = [dict(base, stack="erdma", status="ok", median_step_s=1.0, lower_bound=False),
            dict(base, stack="erdma+int8", status="ok", median_step_s=0.25,
                 lower_bound=False),
            dict(base, stack="gloo-bbr", status="ok", median_step_s=1.5, lower_bound=False),
            dict(base, stack="gloo-cubic", status="capped", median_step_s=12.0,
                 lower_bound=True)]
    row = tw.summarize(runs, [cell])[0]
    sp = row["speedups"]
    assert sp["erdma/gloo-bbr"] == {"value": 1.5, "kind": "="}
    assert sp["erdma+int8/gloo-bbr"]["value"] == pytest.approx(6.0)
    assert sp["erdma/gloo-cubic"] == {"value": 12.0, "kind": ">="}
    meta = {"stacks": list(tw.STACKS), "command": "x", "time": "t", "elapsed_s": 1,
            "loadavg": [1.0], "time_cap": 90, "rate": "100mbit", "rtt_ms": 50.0, "reps": 1,
            "workload": {"params": 10, "batch": 4, "steps": 2, "warmup": 2}}
    md = tw.markdown([row], meta)
    assert "ERDMA_COMPRESS=off" in md and "| 1% | 50.4 ms | 1 s | 0.25 s | 1.5 s |" in md
    assert "> 12 s †" in md and "≥ 12.00×" in md and "6.00×" in md


@needs_bed
@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "t.json"
    rc = tw.main(["--quick", "--steps", "6", "--json", str(out), "--png", str(tmp_path / "t.png")])
    doc = json.loads(out.read_text())
    assert rc == 0, [(r["stack"], r.get("error")) for r in doc["runs"]]
    cell = doc["meta"]["cells"][0]
    assert cell["bed"]["rtt_ms"] == 50.0 and 49 < cell["rtt_measured_ms"] < 60
    runs = {r["stack"]: r for r in doc["runs"]}
    assert set(runs) == set(tw.STACKS)
    for r in runs.values():
        assert r["status"] == "ok" and len(r["step_times"]) == 6 and r["median_step_s"] > 0
        # the gradients crossed the router (int8: about a quarter of 1.6 MB per step)
        assert r["link_up_bytes"] > 6 * 300_000
    assert runs["erdma"]["erdma_compress"] == "off"
    # one initial model and the same first batch: the same first loss everywhere
    first = {s: r["losses"][0] for s, r in runs.items()}
    assert max(first.values()) - min(first.values()) < 1e-6, first
    # uncompressed erdma and gloo train the same model the same way
    for g in ("gloo-bbr", "gloo-cubic"):
        assert runs["erdma"]["losses"][-1] == pytest.approx(runs[g]["losses"][-1], rel=1e-4)
        assert runs["erdma"]["param_sums"][0] == pytest.approx(runs[g]["param_sums"][0],
                                                               rel=1e-5, abs=1e-4)
    assert runs["erdma+int8"]["hook_bytes"]["sent"] < runs["erdma+int8"]["hook_bytes"]["raw"] / 3
    md = Path(str(out)[:-5] + ".md").read_text()
    assert "erdma ÷ gloo-bbr" in md and "ERDMA_COMPRESS=off" in md
