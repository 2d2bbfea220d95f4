"""Object collectives on sub-communicators, user ops (tests/scripts/cco_obj.py),
one message per pickle (tests/scripts/obj_bytes.py), and the two-rank
calls made in one C call (tests/scripts/obj_pair.py)."""
import shutil

import pytest

from _ranks import assert_ok, run_script, run_script_mpi4py


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_cco_obj(nprocs):
    assert_ok(run_script("cco_obj.py", nprocs), "cco_obj.py", nprocs)


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_object_messages(nprocs):
    assert_ok(run_script("obj_bytes.py", nprocs, timeout=150), "obj_bytes.py", nprocs)


def test_object_messages_over_quic():
    """Every message through the request path (no shared memory: no eager ring)."""
    assert_ok(run_script("obj_bytes.py", 3, timeout=150, env={"ERDMA_SHM": "0"}),
              "obj_bytes.py", 3)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_object_messages_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("obj_bytes.py", 3), "obj_bytes.py", 3)


@pytest.mark.parametrize("env", [{}, {"ERDMA_SHM": "0"}], ids=["shm", "quic"])
def test_two_rank_object_calls_in_one_c_call(env):
    """send / recv and the object collectives of two ranks (pickled, moved
    and unpickled in one C call; over QUIC every send leaves it midway)."""
    assert_ok(run_script("obj_pair.py", 2, timeout=150, env=env), "obj_pair.py", 2)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_two_rank_object_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("obj_pair.py", 2), "obj_pair.py", 2)


def test_the_fast_modules_answer_types_cannot_be_made_from_python():
    """recv_obj / pair_obj tell their non-object answers by the More type:
    Python code (or a pickle naming it) cannot make one."""
    from erdmampi import _engine
    if _engine.fast is None:
        pytest.skip("no C fast path on this Python")
    with pytest.raises(TypeError):
        _engine.fast.More()
