"""Differential tests: the same rank script under erdmampi and under mpi4py+MPICH.

Each ``tests/scripts/diff_*.py`` script records canonical lines ``rank key value``
(see ``diff_util.py``); it is run with ``erdmarun -n N`` and with MPICH's
``mpiexec -n N`` (``ERDMA_REFERENCE=mpi4py``), and every key must have the same
value under both.  A failure lists the differing keys.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from harness import run_mpi

SCRIPTS = Path(__file__).resolve().parent / "scripts"

try:
    import mpi4py  # noqa: F401
    from mpi4py import MPI as _REF  # noqa: F401
    HAVE_MPI4PY = True
except Exception:  # noqa: BLE001  (not installed, or no MPI library)
    HAVE_MPI4PY = False

MPIEXEC = shutil.which("mpiexec.mpich") or shutil.which("mpiexec")
needs_ref = pytest.mark.skipif(not HAVE_MPI4PY or MPIEXEC is None,
                               reason="mpi4py (with MPICH's mpiexec) is not available")
pytestmark = pytest.mark.slow

# Keys whose values legitimately differ between the two libraries: the
# implementation's identity, not its behaviour.
LEGIT_DIFFERENT = {
    "module.library_version",    # "MPICH Version: 4.0.2 ..." vs "erdmampi ..."
    "module.vendor",             # mpi4py.get_vendor(): ("MPICH", ...) vs ("erdmampi", ...)
    "module.processor_name",     # both the host name in practice, but not promised
    "attr.world.UNIVERSE_SIZE",  # launcher-dependent: hydra without -usize gives None,
                                 # erdmarun gives the job size (both allowed by MPI 4.0 11.10.1)
}


def _parse(lines):
    got = {}
    for line in lines:
        if not line.strip():
            continue
        rank, key, value = (line.split(" ", 2) + [""])[:3]
        got[(int(rank), key)] = value
    return got


def _collect(outdir):
    lines = []
    for p in sorted(Path(outdir).glob("rank*.txt")):
        lines += p.read_text().splitlines()
    return _parse(lines)


def run_erdma(script, nprocs, timeout=120, args=()):
    with tempfile.TemporaryDirectory(prefix="diff-erdma-") as d:
        proc = run_mpi(nprocs, str(script), args=args, timeout=timeout,
                       env={"DIFF_OUT": d, "ERDMA_REFERENCE": ""})
        return proc, _collect(d)


def run_ref(script, nprocs, timeout=120, args=()):
    env = dict(os.environ, DIFF_OUT="", ERDMA_REFERENCE="mpi4py")
    with tempfile.TemporaryDirectory(prefix="diff-ref-") as d:
        env["DIFF_OUT"] = d
        proc = subprocess.run([MPIEXEC, "-n", str(nprocs), sys.executable, str(script)]
                              + [str(a) for a in args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
        return proc, _collect(d)


def _run_both(script, nprocs):
    """Both runs at once (they share nothing): half the wall time on 2 cores."""
    res = {}
    t = threading.Thread(target=lambda: res.__setitem__("ref", run_ref(script, nprocs)))
    t.start()
    res["erdma"] = run_erdma(script, nprocs)
    t.join()
    return res["erdma"], res["ref"]


def compare(script, nprocs):
    (pe, got), (pr, want) = _run_both(SCRIPTS / script, nprocs)
    assert pr.returncode == 0 and want, (
        f"reference run of {script} failed rc={pr.returncode}\n{pr.stdout[-3000:]}"
        f"\n{pr.stderr[-3000:]}")
    assert pe.returncode == 0 and got, (
        f"erdmampi run of {script} failed rc={pe.returncode}\n{pe.stdout[-3000:]}"
        f"\n{pe.stderr[-3000:]}")
    diffs = []
    for k in sorted(set(got) | set(want)):
        if k[1] in LEGIT_DIFFERENT:
            continue
        g, w = got.get(k, "<missing>"), want.get(k, "<missing>")
        if g != w:
            diffs.append(f"rank {k[0]} {k[1]}:\n    erdmampi: {g}\n    mpi4py:   {w}")
    assert not diffs, (f"{script} -n {nprocs}: {len(diffs)} of {len(want)} keys differ\n"
                       + "\n".join(diffs[:60]))
    return got


@needs_ref
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_ops(nprocs):
    """Every predefined op on every applicable dtype through the reductions."""
    compare("diff_ops.py", nprocs)


@needs_ref
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_collectives(nprocs):
    compare("diff_cco.py", nprocs)


@needs_ref
@pytest.mark.parametrize("nprocs", [2, 4])
def test_p2p(nprocs):
    compare("diff_p2p.py", nprocs)


@needs_ref
@pytest.mark.parametrize("nprocs", [2, 3])
def test_errors(nprocs):
    compare("diff_err.py", nprocs)


@needs_ref
@pytest.mark.parametrize("nprocs", [2, 3, 4])
def test_comms(nprocs):
    compare("diff_comm.py", nprocs)


def test_gil_released():
    """A thread keeps running while rank 0 blocks in Recv (erdmampi only)."""
    proc = run_mpi(2, str(SCRIPTS / "diff_gil.py"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GIL ok" in proc.stdout, proc.stdout + proc.stderr
