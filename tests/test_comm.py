"""Communicator management and error classes on 1-4 ranks (tests/scripts/comm_err.py)."""
import pytest

from _ranks import assert_ok, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_comm(nprocs):
    assert_ok(run_script("comm_err.py", nprocs), "comm_err.py", nprocs)
