"""Each hpc_examples/*.py gives the same output under erdmarun -n 4 as under
MPICH's mpiexec -n 4 with ``from mpi4py import MPI`` (a temporary copy)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import REPO, run_mpi

# ddp_train.py is a torch.distributed program, not an mpi4py one: its tests
# are in test_torch_backend.py and test_nat_jobs.py
EXAMPLES = sorted(p for p in (REPO / "hpc_examples").glob("*.py")
                  if p.name != "ddp_train.py")
IMPORT_LINE = "from erdmampi import MPI"

try:
    from mpi4py import MPI as _REF  # noqa: F401
    HAVE_MPI4PY = True
except Exception:  # noqa: BLE001
    HAVE_MPI4PY = False
MPIEXEC = shutil.which("mpiexec.mpich") or shutil.which("mpiexec")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not HAVE_MPI4PY or MPIEXEC is None,
                                 reason="mpi4py (with MPICH's mpiexec) is not available")]
NPROCS = 4


def _lines(text):
    # Lines printed by different ranks interleave in an order neither launcher
    # defines, so the comparison is of the lines, not their order across ranks.
    return sorted(text.splitlines())


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_same_output(example, tmp_path):
    src = example.read_text()
    assert IMPORT_LINE in src, f"{example.name} does not import MPI from erdmampi"
    ref_copy = tmp_path / example.name
    ref_copy.write_text(src.replace(IMPORT_LINE, "from mpi4py import MPI"))

    got = run_mpi(NPROCS, str(example), timeout=120)
    assert got.returncode == 0, f"erdmampi rc={got.returncode}\n{got.stdout}\n{got.stderr}"

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    want = subprocess.run([MPIEXEC, "-n", str(NPROCS), sys.executable, str(ref_copy)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=120, env=env, stdin=subprocess.DEVNULL, cwd=tmp_path)
    assert want.returncode == 0, f"mpi4py rc={want.returncode}\n{want.stdout}\n{want.stderr}"
    assert want.stdout.strip(), f"{example.name} printed nothing under mpi4py"
    assert _lines(got.stdout) == _lines(want.stdout), (
        f"{example.name}: outputs differ\n--- erdmampi\n{got.stdout}\n--- mpi4py\n{want.stdout}")
