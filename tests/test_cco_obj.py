"""Object collectives on sub-communicators, user ops (tests/scripts/cco_obj.py),
and one message per pickle (tests/scripts/obj_bytes.py)."""
import os
import shutil
import subprocess
import sys

import pytest

from _ranks import assert_ok, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_cco_obj(nprocs):
    assert_ok(run_script("cco_obj.py", nprocs), "cco_obj.py", nprocs)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_object_messages(nprocs):
    assert_ok(run_script("obj_bytes.py", nprocs, timeout=150), "obj_bytes.py", nprocs)


def test_object_messages_over_quic():
    """Every message through the request path (no shared memory: no eager ring)."""
    assert_ok(run_script("obj_bytes.py", 3, timeout=150, env={"ERDMA_SHM": "0"}),
              "obj_bytes.py", 3)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_object_messages_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    script = os.path.join(os.path.dirname(__file__), "scripts", "obj_bytes.py")
    env = dict(os.environ, ERDMA_REFERENCE="mpi4py")
    p = subprocess.run([shutil.which("mpiexec"), "-n", "3", sys.executable, script],
                       capture_output=True, text=True, timeout=150, env=env,
                       cwd=os.path.dirname(script))
    assert p.returncode == 0 and "obj_bytes: OK size=3" in p.stdout, p.stdout + p.stderr
