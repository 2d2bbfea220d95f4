"""Blocking receives of messages that arrived first (taken from the
unexpected queue without a request, erdma_recv_now): bytes, status,
truncation and order, at 2 and 3 ranks; the same script holds for mpi4py +
MPICH (tests/scripts/recv_arrived.py)."""
import shutil

import pytest

from _ranks import assert_ok, run_script, run_script_mpi4py


@pytest.mark.parametrize("nprocs", [2, 3])
def test_receives_of_messages_already_here(nprocs):
    assert_ok(run_script("recv_arrived.py", nprocs), "recv_arrived.py", nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_recv_arrived_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("recv_arrived.py", 2), "recv_arrived.py", 2)
