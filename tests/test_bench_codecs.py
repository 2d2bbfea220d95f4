"""bench.codecs on small data: every kind gets rows for our codecs with
plausible ratios and error figures, and the markdown table is written.
(No timings are asserted: the benchmark measures, the test checks its output.)"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import codecs  # noqa: E402


def test_small_run(tmp_path):
    out, md = tmp_path / "c.json", tmp_path / "c.md"
    codecs.main(["--size", "128KiB", "--repeat", "1", "--json", str(out), "--md", str(md)])
    doc = json.loads(out.read_text())
    rows = {(r["kind"], r["codec"]): r for r in doc["rows"]}
    for kind in ("gradients", "smooth", "sparse"):
        r = rows[(kind, "lossless")]
        assert r["lossless"] and r["nbytes"] == 128 << 10
        assert r["ratio"] > 1.05, r      # every kind compresses
        assert r["comp_GBps"] > 0 and r["decomp_GBps"] > 0
    assert rows[("sparse", "lossless")]["ratio"] > 20
    for kind in ("gradients", "smooth"):
        assert abs(rows[(kind, "bf16")]["ratio"] - 2) < 0.01
        assert rows[(kind, "int8")]["ratio"] > 3.5
        assert rows[(kind, "int8")]["rms_err"] < 0.02
    text = md.read_text()
    assert "| lossless" in text and "**sparse** (int64)" in text
