"""Collectives with buffers, IN_PLACE and nonblocking, plus objects, on 1-4 ranks."""
import pytest

from _ranks import assert_ok, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_cco(nprocs):
    assert_ok(run_script("cco.py", nprocs), "cco.py", nprocs)
