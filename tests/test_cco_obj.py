"""Object collectives on sub-communicators, user ops (tests/scripts/cco_obj.py)."""
import pytest

from _ranks import assert_ok, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_cco_obj(nprocs):
    assert_ok(run_script("cco_obj.py", nprocs), "cco_obj.py", nprocs)
