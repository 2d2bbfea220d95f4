"""bench.wan: one small matrix cell gives sane JSON rows and the markdown table, and
the time cap kills a run, reports it as capped and leaves nothing behind.
Needs root and the WAN bed's tools; skipped otherwise."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from erdmampi.testing import wan

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import wan as bw  # noqa: E402

_why = wan.bed_available() if os.geteuid() == 0 else "needs root"
needs_bed = pytest.mark.skipif(_why is not None, reason=_why or "")


def _bed_namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {ln.split()[0] for ln in out.splitlines()
            if ln.startswith("erdwan-%d-" % os.getpid())}


def _workload_pids():
    """pids of workload processes whose ancestor is this test process."""
    me, found = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            if b"erdmampi.testing.workload" not in cmd and b"store_server" not in cmd:
                continue
            pid = int(d.name)
            while pid > 1:         # walk up to see whether we started it
                st = Path("/proc/%d/stat" % pid).read_text()
                pid = int(st.rsplit(")", 1)[1].split()[1])
                if pid == me:
                    found.append(int(d.name))
                    break
        except (OSError, ValueError, IndexError):
            continue
    return found


_WORKLOAD = "import sys\nfrom erdmampi.testing.workload import main\nsys.exit(main())\n"


@pytest.mark.parametrize("n,op", [(2, "allreduce"), (3, "allreduce"), (2, "bcast")])
def test_workload_sends_gradients_from_a_file(n, op, tmp_path):
    # --data gradients: each rank sends its slice of the file; Allreduce of two
    # ranks and Bcast are checked exactly, of three within the rounding bound
    from harness import run_mpi
    path = bw.input_file("gradients", 4096 * 4, n)
    assert bw.input_file("gradients", 4096 * 4, n) == path       # made once per size
    res = run_mpi(n, _WORKLOAD, args=[
        "--stack", "erdmampi", "--op", op, "--count", "4096",
        "--iters", "2", "--input", path], timeout=60, env={"ERDMA_COMPRESS": "lossless"})
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    assert res.returncode == 0 and rec["ok"] and rec["bytes"] == 4096 * 4, res.stderr[-2000:]
    # a file too short for the ranks' slices is refused
    res = run_mpi(n, _WORKLOAD, args=["--stack", "erdmampi", "--count", str(1 << 20),
                                      "--input", path], timeout=60)
    assert res.returncode != 0 and "need float32 with at least" in res.stdout + res.stderr


def test_parse_stack_and_args():
    assert bw.parse_stack("erdmampi")["env"] == {"ERDMA_COMPRESS": "off"}
    assert bw.parse_stack("erdmampi-bbr+lossless")["env"] == {"ERDMA_COMPRESS": "lossless",
                                                              "ERDMA_CC": "bbr"}
    assert bw.parse_stack("mpich-cubic")["tcp_cc"] == "cubic"
    assert bw.parse_stack("gloo-bbr")["workload"] == "gloo"
    for bad in ("gloo", "mpich-fast", "erdmampi-xyz", "tcp-cubic", "gloo-bbr+lossless"):
        with pytest.raises(ValueError):
            bw.parse_stack(bad)
    a = bw.parse_args(["--quick", "--json", "/tmp/x.json"])
    assert a.sites == [2] and a.sizes == [1 << 20] and a.md == "/tmp/x.md"
    with pytest.raises(SystemExit):
        bw.parse_args(["--losses", "1.5"])
    ring = bw.parse_stack("erdmampi-ring")["env"]
    assert ring["ERDMA_COLL_ALLREDUCE"] == "sched_ring" and "ERDMA_CC" not in ring
    assert bw.parse_args(["--quick", "--queue-bdp", "0.5"]).queue_bdp == 0.5
    with pytest.raises(SystemExit):
        bw.parse_args(["--queue-bdp", "0"])


def test_evaluate_progress():
    lines = [json.dumps(d) for d in (
        {"event": "begin", "iter": 0, "warmup": True, "wall": 100.0},
        {"event": "iter", "rank": 0, "iter": 0, "warmup": True, "time": 0.1, "ok": True},
        {"event": "iter", "rank": 1, "iter": 0, "warmup": True, "time": 0.1, "ok": True},
        {"event": "begin", "iter": 1, "warmup": False, "wall": 101.0},
        {"event": "iter", "rank": 0, "iter": 1, "warmup": False, "time": 2.0, "ok": True},
        {"event": "iter", "rank": 1, "iter": 1, "warmup": False, "time": 2.5, "ok": True},
        {"event": "begin", "iter": 2, "warmup": False, "wall": 104.0})]
    r = bw.evaluate(["\n".join(lines)], 2, True, [-15, -15], 110.0)
    assert r["status"] == "capped" and r["times"] == [2.5] and r["time_lb"] == 6.0
    bad = lines[:4] + [json.dumps({"event": "iter", "rank": 1, "iter": 1, "warmup": False,
                                   "time": 2.0, "ok": False})]
    r = bw.evaluate(["\n".join(bad)], 2, False, [1, 1], 110.0)
    assert r["status"] == "error" and "wrong result" in r["error"]
    # a finished job whose rank-1 progress line was lost (hydra forwarding): the final
    # record's per-iteration maximum over ranks gives the time; without it, an error
    lost = lines[:5]
    fin = {"stack": "mpi4py", "times": [2.0], "times_max": [2.5], "ok": True}
    r = bw.evaluate(["\n".join(lost + [json.dumps(fin)])], 2, False, [0], 110.0)
    assert r["status"] == "ok" and r["times"] == [2.5]
    r = bw.evaluate(["\n".join(lost + [json.dumps(fin)])], 2, True, [-15], 110.0)
    assert r["status"] == "ok" and r["times"] == [2.5] and "did not exit" in r["note"]
    del fin["times_max"]
    r = bw.evaluate(["\n".join(lost + [json.dumps(fin)])], 2, False, [0], 110.0)
    assert r["status"] == "error" and "no timed iteration" in r["error"]


def _tcp_peer():
    """gloo when torch is installed (scripts/setup_bench.sh), else MPICH."""
    import importlib.util
    return "gloo-bbr" if importlib.util.find_spec("torch") else "mpich-bbr"


@needs_bed
@pytest.mark.slow
def test_small_cell(tmp_path):
    out = tmp_path / "w.json"
    peer = _tcp_peer()
    rc = bw.main(["--sites", "2", "--rates", "100mbit", "--rtts", "2", "--losses", "0,0.01",
                  "--sizes", "1MiB", "--colls", "allreduce", "--stacks", "erdmampi," + peer,
                  "--time-cap", "40", "--iters", "1", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0, doc["runs"]
    assert len(doc["runs"]) == 4 and len(doc["summary"]) == 2
    assert doc["meta"]["loadavg"] and doc["meta"]["cells"][0]["bed"]["rtt_ms"] == 2.0
    for row in doc["summary"]:
        assert row["bytes"] == 1 << 20 and row["rate_bps"] == 100_000_000
        for s in ("erdmampi", peer):
            v = row["stacks"][s]
            assert v["status"] == "ok", v
            # at least some progress, never faster than the link allows (+5% slack)
            assert 0.1 < v["busbw_mbps"] < 105 and 0 < v["util"] < 1.05
        assert row["ratios"]["bbr"]["vs"] == peer and row["ratios"]["cubic"] is None
    for run in doc["runs"]:
        # the payload really crossed the router: each direction >= 1 MiB
        assert run["link_up_bytes"] >= 2 << 20
    md = Path(str(out)[:-5] + ".md").read_text()
    assert f"| RTT | loss | erdmampi | {peer} |" in md and "| 2 ms | 1% |" in md
    assert not _bed_namespaces()


@needs_bed
@pytest.mark.slow
def test_time_cap_kills_and_cleans_up(tmp_path):
    from erdmampi.testing.wan import WanBed
    logs = []
    with WanBed(sites=2, rate="10mbit", delay_ms=10, cc="cubic") as bed:
        # 64 MiB at 10 Mbit/s takes ~55 s: the 1 s cap must end it
        rec = bw.run_one(bed, "erdmampi", "allreduce", 64 << 20, 1.0, 1, logs.append)
        assert rec["status"] == "capped" and rec["times"] == []
        assert rec["wall_s"] < 15
        assert not _workload_pids()
        tags = bed.tag
    assert rec["time_lb"] is None or rec["time_lb"] < 2
    assert "capped" in logs[0]
    cell = {"key": "k", "sites": 2, "rate_bps": 10_000_000, "rtt_ms": 20.0, "loss": 0.0,
            "stacks": ["erdmampi"]}
    rows = bw.summarize([dict(rec, cell="k")], [cell])
    assert rows[0]["stacks"]["erdmampi"]["status"] == "capped"
    assert bw._fmt_cell(rows[0]["stacks"]["erdmampi"]) in ("> cap",) or \
        "†" in bw._fmt_cell(rows[0]["stacks"]["erdmampi"])
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert tags not in left
    assert not _workload_pids()


def test_summary_bounds_and_ratios():
    cell = {"key": "c", "sites": 2, "rate_bps": 100_000_000, "rtt_ms": 100.0, "loss": 0.01,
            "stacks": ["erdmampi", "gloo-cubic", "mpich-cubic", "gloo-bbr"]}
    base = {"cell": "c", "coll": "allreduce", "bytes": 16 << 20, "link_up_bytes": 10 ** 7,
            "wall_s": 10.0}
    runs = [dict(base, stack="erdmampi", status="ok", times=[2.0, 2.2, 2.1], time_lb=None),
            dict(base, stack="gloo-cubic", status="capped", times=[], time_lb=80.0),
            dict(base, stack="mpich-cubic", status="capped", times=[30.0], time_lb=50.0),
            dict(base, stack="gloo-bbr", status="ok", times=[4.2], time_lb=None)]
    row = bw.summarize(runs, [cell])[0]
    st = row["stacks"]
    assert st["erdmampi"]["time_s"] == 2.1 and not st["erdmampi"]["lower_bound"]
    assert st["gloo-cubic"]["lower_bound"] and st["gloo-cubic"]["time_s"] == 80.0
    assert st["mpich-cubic"]["lower_bound"] and st["mpich-cubic"]["time_s"] == 40.0
    # busbw = bytes * 8 / t * 2(n-1)/n with n = 2; utilisation over 100 Mbit/s
    assert abs(st["gloo-bbr"]["busbw_mbps"] - (16 << 20) * 8 / 4.2 / 1e6) < 1e-9
    assert abs(st["gloo-bbr"]["util"] - st["gloo-bbr"]["busbw_mbps"] / 100) < 1e-9
    cub, bbr = row["ratios"]["cubic"], row["ratios"]["bbr"]
    assert cub["kind"] == ">=" and cub["vs"] == "mpich-cubic" and abs(cub["value"] - 40 / 2.1) < 1e-9
    assert bbr["kind"] == "=" and abs(bbr["value"] - 2.0) < 1e-9
    md = bw.markdown([row], {"stacks": cell["stacks"], "command": "x", "time": "t",
                             "elapsed_s": 1, "loadavg": [1.0], "time_cap": 90})
    assert "≥ 19×" in md and "| 100 ms | 1% |" in md and "< " in md


# -- bench.wan_soak ---------------------------------------------------------------------

from bench import wan_soak as ws  # noqa: E402


def test_soak_plan_and_expected():
    import numpy as np
    seen = set()
    for it in range(60):
        op, dtype, count, root = ws.plan(7, it, 3, 1024, 1 << 20)
        seen.add((op, dtype))
        assert 0 <= root < 3 and count >= 1
        nbytes = count * np.dtype(dtype).itemsize
        assert nbytes <= 1 << 20 and (op != "alltoall" or count % 3 == 0)
    assert len(seen) == 6          # every collective with both dtypes
    # the expected result of each collective, built from the same inputs by hand
    ins = [ws.inputs(7, 5, r, "float32", 12, 3) for r in range(3)]
    assert np.array_equal(ins[1], ws.inputs(7, 5, 1, "float32", 12, 3))   # deterministic
    assert not np.array_equal(ins[0], ins[1])
    assert np.array_equal(ws.expected(7, 5, 2, 3, "allreduce", "float32", 12, 0),
                          ins[0].astype(np.float64) + ins[1] + ins[2])
    assert np.array_equal(ws.expected(7, 5, 0, 3, "bcast", "float32", 12, 2), ins[2])
    assert np.array_equal(ws.expected(7, 5, 1, 3, "alltoall", "float32", 12, 0),
                          np.concatenate([i[4:8] for i in ins]))
    big = ws.inputs(7, 5, 0, "int64", 1000, 2)
    assert big.dtype == np.int64 and np.abs(big).max() > 1 << 30


def test_soak_verdict():
    fin = {"event": "final", "iters": 5, "bytes": 10, "mismatches": 0, "crc_disagree": 0}
    ok = [json.dumps(fin)] * 2
    assert ws.verdict([0, 0], False, ok)[0] == "ok"
    bad = [json.dumps(fin), json.dumps(dict(fin, mismatches=1))]
    assert ws.verdict([0, 0], False, bad)[0] == "mismatch"
    assert ws.verdict([0, 1], False, [ok[0], "Timeout (0:02:00)!\nThread ..."])[0] == "hang"
    assert ws.verdict([0, -9], True, ok)[0] == "hang"
    assert ws.verdict([0, 0], False, [ok[0], json.dumps(dict(fin, iters=4))])[0] == "error"
    assert ws.verdict([0, 1], False, [ok[0], "Traceback ..."])[0] == "error"


@needs_bed
@pytest.mark.slow
def test_soak_short(tmp_path):
    out = tmp_path / "soak.json"
    rc = ws.main(["--minutes", "0.2", "--loss", "0.03", "--rate", "100mbit", "--rtt", "10",
                  "--max-size", "1MiB", "--iter-timeout", "60", "--progress-every", "3",
                  "--json", str(out)])
    doc = json.loads(out.read_text())
    assert rc == 0, doc
    r = doc["result"]
    assert r["status"] == "ok" and r["mismatches"] == 0 and r["iters"] >= 6
    ranks = doc["ranks"]
    assert len(ranks) == 2 and ranks[0]["iters"] == ranks[1]["iters"]
    assert all(v > 0 for v in ranks[0]["counts"].values())
    assert ranks[0]["bytes"] == sum(ranks[0]["bytes_by_op"].values()) == r["bytes"]
    # the payload crossed the router: with 2 ranks an Allreduce of n bytes sends at
    # least n in all, a Bcast n, an Alltoall n (half from each site)
    assert sum(lb["up"] for lb in doc["link_bytes"]) >= r["bytes"]
    assert not _bed_namespaces()
