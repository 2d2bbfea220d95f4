"""Errors raised in one process, and aborting a job from an uncaught exception."""
import subprocess
import sys

import numpy as np
import pytest

from harness import REPO, rank_env, run_mpi

MPI = pytest.importorskip("erdmampi.MPI")


def err(fn, *args):
    with pytest.raises(MPI.Exception) as info:
        fn(*args)
    return info.value.Get_error_class()


def test_error_classes_self():
    c = MPI.COMM_SELF
    assert err(c.Send, np.zeros(1), 1) == MPI.ERR_RANK
    assert err(c.Recv, np.zeros(1), 5) == MPI.ERR_RANK
    assert err(c.Send, np.zeros(1), 0, MPI.TAG_UB_VALUE + 1
               if hasattr(MPI, "TAG_UB_VALUE") else 2 ** 28) == MPI.ERR_TAG
    assert err(c.Bcast, np.zeros(1), 1) == MPI.ERR_ROOT
    assert err(MPI.COMM_NULL.Barrier) == MPI.ERR_COMM
    assert err(MPI.GROUP_NULL.Get_size) == MPI.ERR_GROUP
    assert err(MPI.COMM_WORLD.Free) == MPI.ERR_COMM
    assert err(MPI.MESSAGE_NULL.recv) == MPI.ERR_REQUEST
    req = c.Isend(np.arange(4.0), 0, 1)
    assert err(c.Recv, np.zeros(2), 0, 1) == MPI.ERR_TRUNCATE
    req.Wait()


def test_bad_buffers_raise_python_errors():
    c = MPI.COMM_SELF
    with pytest.raises(TypeError):
        c.Send(object(), 0)
    with pytest.raises(ValueError):
        c.Allreduce(np.zeros(3), np.zeros(4))


def test_status_counts():
    st = MPI.Status()
    st.Set_elements(MPI.BYTE, 10)
    assert st.Get_count(MPI.BYTE) == 10
    assert st.Get_count(MPI.INT) == MPI.UNDEFINED
    st.Set_elements(MPI.DOUBLE, 3)
    assert st.Get_count(MPI.DOUBLE) == 3 and st.count == 24
    assert MPI.Status(st) == st


@pytest.mark.parametrize("nprocs", [2, 3])
def test_uncaught_exception_aborts_job(nprocs):
    script = ("from erdmampi import MPI\n"
              "c = MPI.COMM_WORLD\n"
              "if c.rank == 1:\n"
              "    raise ValueError('boom on rank 1')\n"
              "c.recv(source=1)\n")
    p = run_mpi(nprocs, script, timeout=60, python_args=["-m", "erdmampi"])
    assert p.returncode != 0
    assert p.returncode != 124, "job hung instead of aborting"
    assert "boom on rank 1" in p.stderr
    assert "MPI_Abort" in p.stderr


def test_run_usage():
    p = subprocess.run([sys.executable, "-m", "erdmampi", "--version"], cwd=REPO,
                       env=rank_env(), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "erdmampi 0.1.0" in p.stdout


def test_a_datatype_mismatch_names_both_types():
    # mpi4py's ValueError text, then the two datatypes
    with pytest.raises(ValueError, match=r"^mismatch in send and receive MPI datatypes "
                                         r"\(send MPI_FLOAT, receive MPI_DOUBLE\)$"):
        MPI.COMM_SELF.Allreduce(np.ones(4, np.float32), np.ones(4, np.float64))
    with pytest.raises(ValueError, match=r"send MPI_INT, receive MPI_DOUBLE"):
        MPI.SUM.Reduce_local(np.ones(4, np.int32), np.ones(4, np.float64))
