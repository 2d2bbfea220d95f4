"""Object point-to-point through util.pkl5, with large out-of-band payloads."""
import pytest

from _ranks import assert_ok, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_pkl5(nprocs):
    assert_ok(run_script("pkl5_obj.py", nprocs), "pkl5_obj.py", nprocs)
