"""mpi4py's own test suite against erdmampi, beside mpi4py + MPICH.

The suite is the ``test/`` folder of the mpi4py sdist on PyPI, downloaded at
run time into a cache (``ERDMA_SUITE_CACHE``, default
``~/.cache/erdmampi``) and never copied into this repository.  Every test
module runs once per rank count under each implementation (alternated):
erdmampi under ``erdmarun`` with ``mpi4py`` aliased to it (``driver.py``),
the reference under MPICH's ``mpiexec``.  A test passes when it passes on
every rank.

    python -m tests.upstream.suite [--ranks 1,2,3] [--impl erdmampi,mpi4py]
        [--modules test_comm,test_p2p_buf] [--timeout 180]
        [--json results.json] [--table table.md]

The table gives, per module and rank count, the tests each implementation
passed, failed and skipped, crashes and timeouts, and the share of the
reference's passes that erdmampi also passes.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from harness import erdmarun_cmd, rank_env  # noqa: E402

VERSION = "4.1.2"
DRIVER = HERE / "driver.py"


def fetch(version=VERSION):
    """Path of the sdist's ``test/`` folder, downloading it on first use."""
    cache = Path(os.environ.get("ERDMA_SUITE_CACHE",
                                Path.home() / ".cache" / "erdmampi"))
    testdir = cache / f"mpi4py-{version}" / "test"
    if (testdir / "main.py").is_file():
        return testdir
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"mpi4py=={version}", "-d", tmp],
                       check=True)
        tarball = next(Path(tmp).glob("mpi4py-*.tar.gz"))
        with tarfile.open(tarball) as tf:
            members = [m for m in tf.getmembers()
                       if m.name.startswith(f"mpi4py-{version}/test/") and
                       (m.isfile() or m.isdir())]
            tf.extractall(cache, members=members)
    return testdir


def modules(testdir):
    return sorted(p.stem for p in testdir.glob("test_*.py"))


def _mpiexec():
    return shutil.which("mpiexec.mpich") or shutil.which("mpiexec")


def launch(impl, nprocs, module, testdir, outdir, timeout, extra=()):
    """Run one module; returns (returncode, timed_out, seconds)."""
    args = [str(DRIVER), "--impl", impl, "--out", str(outdir), "--testdir", str(testdir),
            *extra, module]
    # MPI4PY_TEST_SPAWN=0: the suite's own switch for an MPI that cannot
    # spawn processes (neither run here may); set for both implementations
    env = rank_env({"PYTHONDONTWRITEBYTECODE": "1", "MPI4PY_TEST_SPAWN": "0"})
    if impl == "erdmampi":
        cmd = erdmarun_cmd() + ["-n", str(nprocs), "--timeout", str(timeout),
                                sys.executable] + args
    else:
        cmd = [_mpiexec(), "-n", str(nprocs), sys.executable] + args
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    timed_out = False
    try:
        rc = proc.wait(timeout + 20)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        rc = proc.wait()
    if impl == "erdmampi" and rc == 124:
        timed_out = True
    return rc, timed_out, time.monotonic() - t0


def classify(outdir, nprocs, rc, timed_out):
    """Per-test outcome across ranks: pass, fail, skip, crash or timeout."""
    per_rank = []
    for r in range(nprocs):
        seen = {}
        for rec in _records(outdir, r):
            if rec["outcome"] == "start":
                seen.setdefault(rec["test"], None)
            elif seen.get(rec["test"]) in (None, "pass", "skip", "xfail"):
                seen[rec["test"]] = rec["outcome"]
        per_rank.append(seen)
    died = "timeout" if timed_out else "crash"
    tests = {}
    for seen in per_rank:
        for t in seen:
            tests.setdefault(t, [])
    details = {}
    for t in tests:
        outs = [seen.get(t, "missing") for seen in per_rank]
        if any(o in ("fail", "error") for o in outs):
            res = "fail"
        elif any(o is None for o in outs):
            res = died
        elif all(o == "pass" for o in outs):
            res = "pass"
        elif all(o in ("skip", "xfail", "pass") for o in outs):
            res = "skip"
        else:   # a rank never got there: the module died before
            res = died if rc != 0 else "fail"
        tests[t] = res
    if timed_out or rc < 0 or rc > 128:
        # the run died (a signal, or killed at its time limit): one entry for
        # the death itself, whatever test it fell between
        tests["<module>"] = died
    elif not tests and rc != 0:
        tests["<module>"] = "fail"
    return tests


def _records(outdir, rank):
    """The JSON records rank ``rank`` wrote (a line cut by a crash is skipped)."""
    path = Path(outdir) / f"rank{rank}.jsonl"
    if not path.exists():
        return
    for line in path.read_text().splitlines():
        try:
            yield json.loads(line)
        except ValueError:
            continue


def _read_detail(outdir, nprocs):
    out = {}
    for r in range(nprocs):
        for rec in _records(outdir, r):
            if rec.get("detail") and rec["outcome"] in ("fail", "error"):
                out.setdefault(rec["test"], rec["detail"])
    return out


def run_matrix(ranks, impls, mods, timeout, testdir, log=print, details=False, save=None):
    """Run every (rank count, module, implementation); ``save(results)`` is
    called after each run so that an interrupted matrix keeps what it did."""
    results = {}
    for n in ranks:
        for mod in mods:
            for impl in impls:
                with tempfile.TemporaryDirectory(prefix="erdma-suite-") as out:
                    rc, to, secs = launch(impl, n, mod, testdir, out, timeout)
                    tests = classify(out, n, rc, to)
                    entry = {"rc": rc, "timed_out": to, "seconds": round(secs, 1),
                             "tests": tests}
                    if details:
                        entry["details"] = _read_detail(out, n)
                results.setdefault(impl, {}).setdefault(str(n), {})[mod] = entry
                counts = _counts(tests)
                log(f"[suite] {impl:8s} n={n} {mod:24s} {secs:6.1f}s rc={rc} "
                    + " ".join(f"{k}={v}" for k, v in counts.items() if v))
                if save is not None:
                    save(results)
    return results


def _counts(tests):
    c = {k: 0 for k in ("pass", "fail", "skip", "crash", "timeout")}
    for res in tests.values():
        c[res] += 1
    return c


def compare(results, n, mod, impl="erdmampi", ref="mpi4py"):
    """(reference passes, of those passed by impl)."""
    mine = results.get(impl, {}).get(str(n), {}).get(mod, {}).get("tests", {})
    theirs = results.get(ref, {}).get(str(n), {}).get(mod, {}).get("tests", {})
    want = {t for t, r in theirs.items() if r == "pass"}
    got = {t for t in want if mine.get(t) == "pass"}
    return len(want), len(got)


def table(results, command):
    lines = [f"Produced by: `{command}`", ""]
    ranks = sorted({n for impl in results.values() for n in impl}, key=int)
    for n in ranks:
        mods = sorted({m for impl in results.values() for m in impl.get(n, {})})
        lines += [f"### {n} rank{'s' if n != '1' else ''}", "",
                  "| module | MPICH passes | erdmampi passes of those | share | "
                  "MPICH pass/fail/skip | erdmampi pass/fail/skip | crash | timeout |",
                  "|---|---:|---:|---:|---|---|---:|---:|"]
        tw = tg = tcrash = tto = 0
        for mod in mods:
            want, got = compare(results, n, mod)
            mine = results.get("erdmampi", {}).get(n, {}).get(mod)
            ref = results.get("mpi4py", {}).get(n, {}).get(mod)
            c = _counts(mine["tests"]) if mine else _counts({})
            rc_ = _counts(ref["tests"]) if ref else None
            refcol = (f"{rc_['pass']}/{rc_['fail']}/{rc_['skip']}"
                      + (f" ({rc_['timeout']} timeout)" if rc_["timeout"] else "")
                      if rc_ else "–")
            share = f"{100.0 * got / want:.1f}%" if want else "–"
            lines.append(f"| {mod} | {want} | {got} | {share} | {refcol} | "
                         f"{c['pass']}/{c['fail']}/{c['skip']} | {c['crash']} | {c['timeout']} |")
            tw, tg = tw + want, tg + got
            tcrash, tto = tcrash + c["crash"], tto + c["timeout"]
        share = f"{100.0 * tg / tw:.1f}%" if tw else "–"
        lines += [f"| **all** | {tw} | {tg} | {share} | | | {tcrash} | {tto} |", ""]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--ranks", default="1,2,3")
    ap.add_argument("--impl", default="erdmampi,mpi4py")
    ap.add_argument("--modules", default="", help="comma-separated; default all")
    ap.add_argument("--exclude", default="", help="comma-separated modules to leave out")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per module run")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--table", default="", help="write the markdown table here")
    ap.add_argument("--details", action="store_true", help="keep failure tracebacks in the JSON")
    ap.add_argument("--version", default=VERSION, help="mpi4py sdist version")
    ap.add_argument("--merge", default="",
                    help="comma-separated JSON files of earlier runs: table of their "
                         "union, running nothing")
    ap.add_argument("--write-floor", default="",
                    help="write erdmampi's pass count per module at the first rank "
                         "count here (the CI floor, tests/upstream/floor_2.json)")
    opts = ap.parse_args(argv)
    command = "python -m tests.upstream.suite " + " ".join(argv if argv is not None else sys.argv[1:])
    if opts.merge:
        results = {}
        for path in opts.merge.split(","):
            for impl, by_n in json.loads(Path(path).read_text()).items():
                for n, mods in by_n.items():
                    results.setdefault(impl, {}).setdefault(n, {}).update(mods)
        text = table(results, command.strip())
        if opts.table:
            Path(opts.table).write_text(text + "\n")
        print(text)
        return
    testdir = fetch(opts.version)
    mods = opts.modules.split(",") if opts.modules else modules(testdir)
    mods = [m for m in mods if m not in set(opts.exclude.split(","))]
    ranks = [int(x) for x in opts.ranks.split(",")]
    impls = opts.impl.split(",")
    save = None
    if opts.json:
        def save(res):
            Path(opts.json).write_text(json.dumps(res, indent=1, sort_keys=True))
    results = run_matrix(ranks, impls, mods, opts.timeout, testdir, details=opts.details,
                         save=save)
    if opts.write_floor:
        mine = results.get("erdmampi", {}).get(str(ranks[0]), {})
        floor = {m: _counts(r["tests"])["pass"] for m, r in mine.items()}
        Path(opts.write_floor).write_text(json.dumps(floor, indent=1, sort_keys=True) + "\n")
    if opts.json:
        Path(opts.json).write_text(json.dumps(results, indent=1, sort_keys=True))
    text = table(results, command.strip())
    if opts.table:
        Path(opts.table).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
