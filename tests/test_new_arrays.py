"""Calls written the way programs write them (tests/scripts/new_arrays.py):
a new [array, datatype] list or a new array every call gives mpi4py's
results and, repeated, the one-call C path; also run against mpi4py."""
import shutil

import pytest

from _ranks import assert_ok, run_script, run_script_mpi4py


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_new_lists_and_arrays_every_call(nprocs):
    assert_ok(run_script("new_arrays.py", nprocs), "new_arrays.py", nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_new_arrays_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("new_arrays.py", 3), "new_arrays.py", 3)
