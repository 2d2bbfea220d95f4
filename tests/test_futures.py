"""``erdmarun -n 3 python -m erdmampi.futures script.py``: rank 0 runs the
script and its MPIPoolExecutor maps over the two other ranks."""
import pytest

from harness import run_mpi

pytestmark = pytest.mark.slow

SCRIPT = """\
from erdmampi import MPI
from erdmampi.futures import MPIPoolExecutor, get_comm_workers


def work(x):
    return (x * x, MPI.COMM_WORLD.Get_rank(), get_comm_workers().Get_size())


def fail(x):
    raise ValueError(f"bad {x}")


if __name__ == "__main__":
    assert MPI.COMM_WORLD.Get_rank() == 0
    with MPIPoolExecutor() as executor:
        assert executor.num_workers == 2
        results = list(executor.map(work, range(20)))
        chunked = list(executor.map(work, range(20), chunksize=6))
        try:
            executor.submit(fail, 7).result()
        except ValueError as exc:
            print("remote error:", exc)
    assert [r[0] for r in results] == [x * x for x in range(20)]
    assert [r[0] for r in chunked] == [x * x for x in range(20)]
    assert {r[1] for r in results + chunked} <= {1, 2}
    assert {r[2] for r in results} == {2}
    print("squares ok", sorted({r[1] for r in results + chunked}))
"""


def test_static_world_pool_maps_over_workers():
    proc = run_mpi(3, SCRIPT, python_args=["-m", "erdmampi.futures"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "squares ok" in proc.stdout
    assert "remote error: bad 7" in proc.stdout
