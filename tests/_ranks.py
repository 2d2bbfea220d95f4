"""Shared helper: run a rank script from tests/scripts under erdmarun (or,
as the reference, under MPICH's mpiexec with mpi4py)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from harness import run_mpi

SCRIPTS = Path(__file__).resolve().parent / "scripts"


# The start of a two-rank job whose ranks agreed on flags in shared memory
# (erdma_pair_*) at their first Barriers: errors returned, SIGTERM ignored
# (the fault tests stop or kill a rank), sys.argv[1] as `mode`, `pids`.
PAIR_JOB = r"""
import os, signal, sys, time
import numpy as np
from erdmampi import MPI
from erdmampi._commrt import _rt
from erdmampi._engine import lib
comm = MPI.COMM_WORLD
comm.Set_errhandler(MPI.ERRORS_RETURN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
mode = sys.argv[1]
pids = comm.allgather(os.getpid())
for _ in range(5):
    comm.Barrier()
on = lib.erdma_pair_find(_rt.engine._h, 1 - comm.rank, comm._ctx + 1) >= 0
print(f"rank {comm.rank}: flags={on}", flush=True)
"""


def run_script(name, nprocs, timeout=90, env=None, python_args=()):
    env = dict(env or {})
    p = run_mpi(nprocs, str(SCRIPTS / name), timeout=timeout, env=env,
                python_args=python_args)
    return p


def assert_ok(p, name, nprocs):
    out = p.stdout + p.stderr
    assert p.returncode == 0, f"{name} -n {nprocs} exited {p.returncode}:\n{out[-4000:]}"
    assert "FAIL" not in out, out[-4000:]
    assert f"{name.rsplit('.', 1)[0]}: OK size={nprocs}" in p.stdout, out[-4000:]


def run_script_mpi4py(name, nprocs, timeout=150):
    """The same script under mpiexec + mpi4py (tests/scripts/_mpi.py picks
    mpi4py from ERDMA_REFERENCE); the caller skips without them."""
    script = str(SCRIPTS / name)
    env = dict(os.environ, ERDMA_REFERENCE="mpi4py")
    return subprocess.run([shutil.which("mpiexec"), "-n", str(nprocs), sys.executable, script],
                          capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(SCRIPTS))


def assert_reference(name, nprocs, timeout=150):
    """The script holds for mpi4py + MPICH too (skipped without mpiexec or
    mpi4py)."""
    import pytest
    if shutil.which("mpiexec") is None:
        pytest.skip("no mpiexec")
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py(name, nprocs, timeout), name, nprocs)
