"""Messages past 2 GiB: the engine's lengths are 64-bit, pkl5 keeps mpi4py's API."""
import pytest

from harness import REPO, run_mpi


@pytest.mark.slow
def test_message_over_2gib():
    res = run_mpi(2, REPO / "tests" / "scripts" / "big_message.py", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "rank 0: OK" in res.stdout and "rank 1: OK" in res.stdout, res.stdout
