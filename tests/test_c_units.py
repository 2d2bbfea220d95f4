"""The engine's C unit tests (tests/c/test_<component>.c, docs/contributing.md
"C unit tests"): each file is a program built with the engine sources it
names, with AddressSanitizer and UBSan, into build/ctests/test_<component>;
every TEST() in it is one pytest test here (the names come from running the
program with --list).  A C test is run alone: `build/ctests/test_match
rank_lost ...` does the same by hand.

A file names what it needs besides itself in comment lines among its first
20 lines (paths relative to the repository root), as fuzz/c/ harnesses do:
    // test-sources: ext/src/erdma_reduce.c
    // test-cflags: -DSOMETHING
A program is rebuilt only when it, a source it names, a header under
ext/src, ext/include or tests/c, or this file is newer than it.  The
compiler is $CC (default cc); without one the tests are skipped."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from harness import REPO

CDIR = REPO / "tests" / "c"
BUILD = REPO / "build" / "ctests"
CC = os.environ.get("CC", "cc")
CFLAGS = ["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-g", "-O1",
          "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
          "-fno-omit-frame-pointer", "-Iext/include", "-Iext/src"]
PKGS = ["libngtcp2", "libngtcp2_crypto_gnutls", "gnutls"]
ENV = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
           UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
FILES = sorted(CDIR.glob("test_*.c"))


def _header_lines(src, key):
    out = []
    for line in src.read_text().splitlines()[:20]:
        m = re.match(rf"//\s*{key}:(.*)", line)
        if m:
            out += m.group(1).split()
    return out


def _pkg_config(flag):
    if not shutil.which("pkg-config"):
        return []
    p = subprocess.run(["pkg-config", flag] + PKGS, capture_output=True, text=True)
    return p.stdout.split() if p.returncode == 0 else []


def _why_no_compiler():
    if not shutil.which(CC):
        return f"no C compiler ({CC} not found)"
    BUILD.mkdir(parents=True, exist_ok=True)
    src = BUILD / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    p = subprocess.run([CC] + CFLAGS + ["-o", str(BUILD / f"probe.{os.getpid()}"), str(src)],
                       capture_output=True, text=True, cwd=REPO)
    (BUILD / f"probe.{os.getpid()}").unlink(missing_ok=True)
    if p.returncode != 0:
        return f"{CC} cannot build sanitized programs here: " + p.stderr.strip()[-300:]
    return None


def _stale(src, bin_):
    if not bin_.exists():
        return True
    deps = [src, Path(__file__)] + [REPO / s for s in _header_lines(src, "test-sources")]
    for d in ("ext/src", "ext/include", "tests/c"):
        deps += (REPO / d).glob("*.h")
    t = bin_.stat().st_mtime
    return any(not d.exists() or d.stat().st_mtime > t for d in deps)


def _build_all():
    """{file stem: None (built) or the compiler's complaint}; stale programs
    are compiled in parallel, each to a temporary name then renamed."""
    BUILD.mkdir(parents=True, exist_ok=True)
    cflags, libs = _pkg_config("--cflags"), _pkg_config("--libs")
    jobs, result = {}, {}
    for src in FILES:
        bin_ = BUILD / src.stem
        if not _stale(src, bin_):
            result[src.stem] = None
            continue
        tmp = BUILD / f"{src.stem}.tmp.{os.getpid()}"
        cmd = ([CC] + CFLAGS + cflags + _header_lines(src, "test-cflags") + ["-o", str(tmp)]
               + [str(src.relative_to(REPO))] + _header_lines(src, "test-sources")
               + libs + ["-lpthread", "-lm"])
        jobs[src.stem] = (subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True), tmp, bin_, cmd)
    for stem, (p, tmp, bin_, cmd) in jobs.items():
        out, _ = p.communicate()
        if p.returncode == 0:
            os.replace(tmp, bin_)
            result[stem] = None
        else:
            tmp.unlink(missing_ok=True)
            result[stem] = " ".join(cmd) + "\n" + out
    return result


def _params():
    why = _why_no_compiler() if FILES else None
    if why:
        return [pytest.param(f.stem, None, marks=pytest.mark.skip(reason=why), id=f.stem)
                for f in FILES], {}
    built = _build_all()
    out = []
    for f in FILES:
        if built[f.stem] is not None:  # the build failure is the test's failure
            out.append(pytest.param(f.stem, None, id=f"{f.stem}-build"))
            continue
        p = subprocess.run([str(BUILD / f.stem), "--list"], capture_output=True, text=True,
                           env=ENV, timeout=60)
        names = p.stdout.split() if p.returncode == 0 else []
        if not names:
            out.append(pytest.param(f.stem, None, id=f"{f.stem}-list"))
        out += [pytest.param(f.stem, n, id=f"{f.stem}:{n}") for n in names]
    return out, built


_PARAMS, _BUILT = _params()


@pytest.mark.parametrize("program,name", _PARAMS)
def test_c_unit(program, name):
    err = _BUILT.get(program)
    assert err is None, f"building tests/c/{program}.c failed:\n{err[-6000:]}"
    assert name is not None, f"build/ctests/{program} --list printed no tests"
    p = subprocess.run([str(BUILD / program), name], capture_output=True, text=True, env=ENV,
                       timeout=60, cwd=REPO)
    assert p.returncode == 0, (f"C test {program}:{name} failed (rc {p.returncode}); rerun: "
                               f"build/ctests/{program} {name}\n{(p.stdout + p.stderr)[-6000:]}")


def test_c_units_exist():
    assert FILES, "no tests/c/test_*.c"
