"""Every fuzz target runs for a few seconds over its regression corpus
(fuzz/README.md): the libFuzzer harnesses fuzz/c/fuzz_<target>.c, built by
fuzz/build.sh with ASan and UBSan, and the atheris harnesses
fuzz/py/fuzz_<target>.py.  A crash, a leak, a sanitizer report, an input that
takes longer than PER_INPUT_TIMEOUT or memory beyond RSS_LIMIT_MB fails the
target and prints the input.  Targets are found by file name.

ERDMA_FUZZ_SECONDS=N runs each target N seconds (default: ~90 s shared among
all targets, 3..10 s each)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO

FUZZ = REPO / "fuzz"
BUILD = Path(os.environ.get("ERDMA_FUZZ_BUILD", REPO / "build" / "fuzz"))
C_TARGETS = sorted(p.stem[len("fuzz_"):] for p in (FUZZ / "c").glob("fuzz_*.c"))
PY_TARGETS = sorted(p.stem[len("fuzz_"):] for p in (FUZZ / "py").glob("fuzz_*.py"))
PER_INPUT_TIMEOUT = 10  # seconds; slower is a finding (bounded time)
RSS_LIMIT_MB = 2048


def _seconds():
    env = os.environ.get("ERDMA_FUZZ_SECONDS")
    if env:
        return max(1, int(float(env)))
    n = max(1, len(C_TARGETS) + len(PY_TARGETS))
    return max(3, min(10, 90 // n))


def _why_no_libfuzzer():
    """None when clang links -fsanitize=fuzzer programs here, else why not."""
    cc = os.environ.get("CC", "clang")
    if not shutil.which(cc):
        return f"{cc} is not installed (apt-get install clang libclang-rt-14-dev)"
    probe = BUILD / "probe"
    BUILD.mkdir(parents=True, exist_ok=True)
    src = BUILD / "probe.c"
    src.write_text("#include <stddef.h>\n#include <stdint.h>\n"
                   "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n)"
                   " { (void)d; (void)n; return 0; }\n")
    p = subprocess.run([cc, "-fsanitize=fuzzer", "-o", str(probe), str(src)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return (f"{cc} cannot link libFuzzer programs (apt-get install libclang-rt-14-dev): "
                + p.stderr.strip()[-300:])
    return None


def _why_no_atheris():
    try:
        import atheris  # noqa: F401
    except ImportError:
        return "atheris is not installed (pip install atheris)"
    return None


def _run(argv, target, tmp_path):
    """Run one fuzzer over fuzz/corpus/<target>/ (read-only: new inputs go to
    a scratch directory); fail with the input it stopped on, if any."""
    corpus = FUZZ / "corpus" / target
    scratch = tmp_path / "new"
    art = tmp_path / "artifacts"
    scratch.mkdir()
    art.mkdir()
    secs = _seconds()
    args = argv + [f"-max_total_time={secs}", f"-timeout={PER_INPUT_TIMEOUT}",
                   f"-rss_limit_mb={RSS_LIMIT_MB}", f"-artifact_prefix={art}/",
                   "-print_final_stats=1", str(scratch)]
    if corpus.is_dir():
        args.append(str(corpus))
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    p = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env,
                       timeout=secs + 180)
    out = p.stdout + p.stderr
    found = sorted(art.iterdir())
    if p.returncode != 0 or found:
        shown = []
        for f in found:
            data = f.read_bytes()
            shown.append(f"{f.name} ({len(data)} bytes): {data[:512].hex()}"
                         + ("..." if len(data) > 512 else ""))
            keep = REPO / "build" / "fuzz-findings" / target
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(f, keep / f.name)
        pytest.fail(f"fuzz target {target} failed (rc {p.returncode}); input(s), kept under "
                    f"build/fuzz-findings/{target}/ (fix, then add to fuzz/corpus/{target}/):\n"
                    + "\n".join(shown or ["(no input saved)"]) + "\n--- output tail ---\n"
                    + out[-6000:])
    assert "Done" in out and "stat::number_of_executed_units" in out, out[-3000:]
    runs = int(out.split("stat::number_of_executed_units:")[1].split()[0])
    assert runs > 0, out[-3000:]


@pytest.mark.parametrize("target", C_TARGETS)
def test_c_fuzz_target(target, tmp_path):
    why = _why_no_libfuzzer()
    if why:
        pytest.skip(why)
    b = subprocess.run(["bash", str(FUZZ / "build.sh"), f"fuzz_{target}"], capture_output=True,
                       text=True, cwd=REPO, env=dict(os.environ, ERDMA_FUZZ_BUILD=str(BUILD)),
                       timeout=600)
    assert b.returncode == 0, b.stdout + b.stderr
    _run([str(BUILD / f"fuzz_{target}")], target, tmp_path)


@pytest.mark.parametrize("target", PY_TARGETS)
def test_py_fuzz_target(target, tmp_path):
    why = _why_no_atheris()
    if why:
        pytest.skip(why)
    _run([sys.executable, str(FUZZ / "py" / f"fuzz_{target}.py")], target, tmp_path)


def test_targets_have_a_corpus_and_unique_names():
    # a target's corpus directory is named after it: C and Python names must not meet
    assert not set(C_TARGETS) & set(PY_TARGETS), set(C_TARGETS) & set(PY_TARGETS)
    for t in C_TARGETS + PY_TARGETS:
        d = FUZZ / "corpus" / t
        assert d.is_dir() and any(d.iterdir()), f"fuzz/corpus/{t}/ is missing or empty"
