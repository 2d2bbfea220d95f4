"""Shared helper: run a rank script from tests/scripts under erdmarun."""
from pathlib import Path

from harness import run_mpi

SCRIPTS = Path(__file__).resolve().parent / "scripts"


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
