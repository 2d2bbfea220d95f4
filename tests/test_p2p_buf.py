"""Point-to-point with buffers and objects on 1-4 ranks (tests/scripts/p2p.py)."""
import pytest

from _ranks import assert_ok, run_script


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_p2p(nprocs):
    assert_ok(run_script("p2p.py", nprocs), "p2p.py", nprocs)
