"""Smoke tests of the benchmark suite (bench/): tiny sizes, JSON shape, no timings."""
import json
import shutil
import subprocess
import sys

import pytest

from harness import REPO, erdmarun_cmd, rank_env

sys.path.insert(0, str(REPO))
from bench.collectives import busbw_factor, layout  # noqa: E402
from bench.common import format_size, parse_size  # noqa: E402
from bench.run_all import markdown, summarize  # noqa: E402

QUICK = ["--repeats", "2", "--warmup", "1", "--target-time", "0.01", "--quiet"]


def _erdmarun(n, module, *args, timeout=50, env=None):
    cmd = erdmarun_cmd() + ["-n", str(n), "--timeout", str(timeout - 5), sys.executable, "-m",
                            "bench." + module, "--stack", "erdmampi"] + list(args)
    env = rank_env({"PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_parse_size():
    assert parse_size("8") == 8
    assert parse_size("4K") == parse_size("4KiB") == 4096
    assert parse_size("64MiB") == 64 << 20
    assert format_size(4096) == "4 KiB" and format_size(8) == "8 B"
    with pytest.raises(ValueError):
        parse_size("lots")
    with pytest.raises(ValueError):
        parse_size("0")


def test_busbw_factors_are_nccl_tests():
    assert busbw_factor("allreduce", 4) == pytest.approx(1.5)
    assert busbw_factor("allgather", 4) == pytest.approx(0.75)
    assert busbw_factor("reduce_scatter", 2) == pytest.approx(0.5)
    assert busbw_factor("alltoall", 4) == pytest.approx(0.75)
    assert busbw_factor("bcast", 4) == 1.0
    with pytest.raises(ValueError):
        busbw_factor("scan", 2)
    # reported bytes: allgather counts the gathered output, reduce_scatter the input
    assert layout("allgather", 4096, 4) == (256, 1024)
    assert layout("reduce_scatter", 4096, 4) == (1024, 256)
    assert layout("bcast", 4096, 2) == (1024, 0)


def test_summary_ratio_against_better_peer():
    def doc(stack, t):
        return {"stack": stack, "nprocs": 2,
                "results": [{"op": "allreduce", "bytes": 1 << 20, "time_us": t, "correct": True}]}
    runs = [doc("erdmampi", 100.0), doc("mpi4py", 300.0), doc("gloo", 200.0),
            doc("erdmampi", 120.0), doc("mpi4py", 100.0), doc("gloo", 220.0)]
    (row,) = summarize(runs, ["erdmampi", "mpi4py", "gloo"])
    assert row["time_us"] == {"erdmampi": 110.0, "mpi4py": 200.0, "gloo": 210.0}
    assert row["best_peer"] == "mpi4py"
    assert row["ratio"] == pytest.approx(200.0 / 110.0)
    # busbw = bytes / time * 2(n-1)/n, n = 2
    assert row["bw_GBps"]["erdmampi"] == pytest.approx((1 << 20) / 110e-6 / 1e9)
    md = markdown([row], ["erdmampi", "mpi4py", "gloo"], {"rounds": 2})
    assert "| 1 MiB |" in md and "| MPICH | 1.82 |" in md


def test_pingpong_buffer_kinds(tmp_path):
    # two buffers (unchanged or rewritten before each send), 3 ranks (the
    # third only in the barriers), sizes that are not a multiple of 8
    for kind in ("two", "rewrite"):
        out = tmp_path / f"pp-{kind}.json"
        r = _erdmarun(3, "pingpong", "--min-size", "4", "--max-size", "12", "--buffers", kind,
                      "--json", str(out), *QUICK)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = json.loads(out.read_text())["results"]
        assert [row["bytes"] for row in rows] == [4, 8], rows
        assert all(row["latency_us"] > 0 for row in rows)


@pytest.mark.slow
def test_pingpong_json(tmp_path):
    out = tmp_path / "pp.json"
    r = _erdmarun(2, "pingpong", "--max-size", "64", "--json", str(out), *QUICK)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "pingpong" and doc["stack"] == "erdmampi"
    assert doc["nprocs"] == 2 and doc["library"].startswith("erdmampi")
    assert [row["bytes"] for row in doc["results"]] == [8, 16, 32, 64]
    for row in doc["results"]:
        assert row["op"] == "pingpong" and row["repeats"] == 2
        assert len(row["latency_us_all"]) == 2
        assert row["latency_us"] > 0 and row["bandwidth_GBps"] > 0


@pytest.mark.slow
def test_collectives_json(tmp_path):
    out = tmp_path / "coll.json"
    r = _erdmarun(2, "collectives", "--ops", "allreduce,alltoall", "--min-size", "4K",
                  "--max-size", "8K", "--json", str(out), *QUICK)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "collectives" and doc["nprocs"] == 2
    rows = [(row["op"], row["bytes"]) for row in doc["results"]]
    assert rows == [("allreduce", 4096), ("allreduce", 8192), ("alltoall", 4096),
                    ("alltoall", 8192)]
    for row in doc["results"]:
        assert row["correct"] is True
        assert row["busbw_GBps"] == pytest.approx(
            row["algbw_GBps"] * busbw_factor(row["op"], 2))
        assert len(row["time_us_all"]) == 2


@pytest.mark.parametrize("setting, want", [(None, None), ("64K", [65536, 65536]),
                                           ("0", [None, None])])
def test_collectives_records_the_cma_threshold(tmp_path, setting, want):
    """The JSON and the heading say from which block size each rank sent a
    collective's blocks by CMA (None: never), as start-up measured it
    (ERDMA_SHM_BULK_CMA unset: 16 KiB or never, per rank) or as set."""
    out = tmp_path / "coll.json"
    r = _erdmarun(2, "collectives", "--ops", "alltoall", "--min-size", "64K", "--max-size",
                  "64K", "--json", str(out), "--repeats", "1", "--warmup", "1",
                  "--target-time", "0.01",
                  env={} if setting is None else {"ERDMA_SHM_BULK_CMA": setting})
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())["settings"]["shm_bulk_cma_min"]
    if want is None:
        assert len(got) == 2 and all(v in (None, 16384) for v in got), got
    else:
        assert got == want
    assert "# shm_bulk_cma_min by rank: %s, %s" % tuple(got) in r.stdout, r.stdout


def test_collectives_page_offsets(tmp_path):
    """--page-offset places the buffers where asked (a copy 16 bytes ahead
    of its source modulo the page); every collective still checks out."""
    out = tmp_path / "coll.json"
    r = _erdmarun(2, "collectives", "--min-size", "64K", "--max-size", "64K",
                  "--timing", "each", "--page-offset", "0,16", "--json", str(out), *QUICK)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = json.loads(out.read_text())["results"]
    assert len(rows) == 5 and all(row["correct"] is True for row in rows)
    assert all(row["page_offset"] == [0, 16] for row in rows)
    bad = subprocess.run([sys.executable, "-m", "bench.collectives", "--page-offset", "4096"],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "0..4095" in bad.stderr


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="bench.memfloor builds a C program")
def test_memfloor_floors_at_the_size_asked(tmp_path):
    """bench.memfloor's floors move the bytes of the size asked, below 1 MiB
    and off whole MiB too (sizes used to be cut to whole MiB, so that a
    floor of 1.5 MiB ran at 1 MiB and one below 1 MiB failed), and check
    them; an odd size is refused."""
    out = tmp_path / "floor.jsonl"
    for size, want in (("64KiB", 65536), ("1536K", 1536 << 10)):
        r = subprocess.run([sys.executable, "-m", "bench.memfloor", "--size", size, "--rounds",
                            "1", "--iters", "3", "--warmup", "1", "--stacks", "",
                            "--floor", "memcpy/bounce/4k,memcpy/shm/4k",
                            "--json", str(out)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "failed" not in r.stderr + r.stdout, r.stdout + r.stderr
        rows = [json.loads(line) for line in out.read_text().splitlines()][-2:]
        assert [(x["remote"], x["size"], x["ok"]) for x in rows] == \
            [("bounce", want, True), ("shm", want, True)], rows
    bad = subprocess.run([sys.executable, "-m", "bench.memfloor", "--size", "65537"],
                         cwd=REPO, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "even number of bytes" in bad.stderr


def test_new_array_places_and_touches_as_asked():
    """A stack's buffer: NumPy's, or at the asked offset into a page of its
    own, touched, or fresh (--fresh: untouched pages) at that offset too."""
    from bench.common import new_array
    for fresh in (False, True):
        for off in (0, 16, 4080):
            a = new_array(1000, "float32", fresh, off)
            assert a.ctypes.data % 4096 == off and a.size == 1000 and not a.any()
    assert new_array(10, "uint8").dtype == "uint8"


def test_collectives_rejects_unknown_op():
    r = subprocess.run([sys.executable, "-m", "bench.collectives", "--ops", "allreduce,scan"],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "unknown collective 'scan'" in r.stderr


@pytest.mark.slow
def test_run_all_writes_json_and_table(tmp_path):
    cmd = [sys.executable, "-m", "bench.run_all", "--stacks", "erdmampi", "--np", "2",
           "--ops", "bcast", "--max-size", "4K", "--pp-max-size", "8", "--repeats", "1",
           "--target-time", "0.01", "--rounds", "2", "--timeout", "40", "--outdir", str(tmp_path)]
    env = rank_env({"PYTHONPATH": str(REPO)})
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=55)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["meta"]["rounds"] == 2 and doc["meta"]["failures"] == []
    assert len(doc["runs"]) == 4  # (pingpong, bcast) x 2 rounds
    assert [(row["op"], row["np"], row["bytes"]) for row in doc["summary"]] == \
        [("pingpong", 2, 8), ("bcast", 2, 4096)]
    for row in doc["summary"]:
        assert row["rounds"] == {"erdmampi": 2} and row["best_peer"] is None
    assert "### bcast float32" in (tmp_path / "results.md").read_text()
    # progress on stderr (a log, not a terminal): the first step and the end
    assert "run_all: [" in r.stderr and "] 0/4   0%: round 0:" in r.stderr, r.stderr
    assert "] 4/4 100%" in r.stderr, r.stderr


def test_smallcalls_driver_writes_every_call(tmp_path):
    """bench.smallcalls: one round on erdmampi (2 ranks), every call timed, a table."""
    out, md = tmp_path / "s.json", tmp_path / "s.md"
    cmd = [sys.executable, "-m", "bench.smallcalls", "--stacks", "erdmampi", "--rounds", "1",
           "--iters", "20", "--timeout", "60", "--json", str(out), "--md", str(md)]
    env = rank_env({"PYTHONPATH": str(REPO)})
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(out.read_text())
    assert doc["stacks"] == ["erdmampi"] and len(doc["runs"]) == 1
    from bench.smallcalls import CALLS
    us = doc["runs"][0]["us"]
    assert sorted(us) == sorted(CALLS) and all(v > 0 for v in us.values())
    assert "| allgather |" in md.read_text()
