"""Process topologies and inter-communicators (tests/scripts/topo_inter.py)."""
import shutil

import pytest

from _ranks import assert_ok, run_script, run_script_mpi4py


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_topo_inter(nprocs):
    assert_ok(run_script("topo_inter.py", nprocs), "topo_inter.py", nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_topo_inter_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("topo_inter.py", 3), "topo_inter.py", 3)
