"""A collective's send and receive buffers at the same address: ERR_BUFFER,
as MPICH's "Buffers must not be aliased", on every path; the same script
holds for mpi4py + MPICH (tests/scripts/coll_alias.py)."""
import pytest

from _ranks import assert_ok, assert_reference, run_script


@pytest.mark.parametrize("nprocs", [2, 3])
def test_aliased_collective_buffers_fail_with_err_buffer(nprocs):
    assert_ok(run_script("coll_alias.py", nprocs), "coll_alias.py", nprocs)


def test_coll_alias_holds_for_mpi4py():
    assert_reference("coll_alias.py", 2)
