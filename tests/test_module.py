"""The MPI facade: names and values as mpi4py (MPICH) has them; rc; init flags."""
import subprocess
import sys

import pytest

from harness import rank_env

MPI = pytest.importorskip("erdmampi.MPI")


def test_constants():
    assert (MPI.ANY_SOURCE, MPI.ANY_TAG, MPI.PROC_NULL, MPI.ROOT, MPI.UNDEFINED) == \
        (-2, -1, -1, -3, -32766)
    assert (MPI.IDENT, MPI.CONGRUENT, MPI.SIMILAR, MPI.UNEQUAL) == (0, 1, 2, 3)
    assert MPI.COMM_TYPE_SHARED == 1
    assert MPI.THREAD_MULTIPLE == 3 and MPI.THREAD_SINGLE == 0
    assert MPI.TAG_UB == 1681915905 and MPI.APPNUM == 1681915917
    assert MPI.ERR_TRUNCATE == 14 and MPI.ERR_RANK == 6 and MPI.ERR_COMM == 5


def test_versions():
    assert MPI.Get_version() == (4, 0)
    assert MPI.get_vendor() == ("erdmampi", (0, 1, 0))
    assert "erdmampi" in MPI.Get_library_version()
    import erdmampi
    assert erdmampi.__version__ == "0.1.0"


def test_world():
    w = MPI.COMM_WORLD
    assert MPI.Is_initialized() and not MPI.Is_finalized()
    assert w.Get_size() >= 1 and 0 <= w.Get_rank() < w.Get_size()
    assert w.Get_name() == "MPI_COMM_WORLD"
    assert w.Get_attr(MPI.TAG_UB) == 2 ** 28 - 1
    assert w.Get_attr(MPI.APPNUM) == 0
    assert MPI.COMM_SELF.Get_size() == 1
    assert not MPI.COMM_NULL and MPI.COMM_NULL == MPI.Comm()
    assert isinstance(w, MPI.Intracomm)


def test_names_match_mpi4py_core():
    names = ["Comm", "Intracomm", "Group", "Request", "Prequest", "Status", "Message",
             "Datatype", "Op", "Exception", "Pickle", "pickle", "IN_PLACE", "BOTTOM",
             "COMM_WORLD", "COMM_SELF", "COMM_NULL", "GROUP_EMPTY", "GROUP_NULL",
             "REQUEST_NULL", "MESSAGE_NULL", "MESSAGE_NO_PROC", "SUM", "MAX", "DOUBLE",
             "INT", "BYTE", "Init", "Init_thread", "Finalize", "Is_initialized",
             "Is_finalized", "Query_thread", "Wtime", "Wtick", "Get_processor_name",
             "Get_version", "Get_library_version", "get_vendor", "Errhandler",
             "ERRORS_RETURN", "Info", "INFO_NULL", "Compute_dims"]
    missing = [n for n in names if not hasattr(MPI, n)]
    assert not missing


def test_pickle():
    import numpy as np
    p = MPI.Pickle()
    assert p.PROTOCOL == 5 and p.THRESHOLD == 262144
    data, bufs = p.dumps_oob(np.arange(100_000))
    assert len(bufs) == 1
    assert (p.loads_oob(data, bufs) == np.arange(100_000)).all()
    small, bufs = p.dumps_oob(np.arange(10))
    assert bufs == []
    assert p.loads(p.dumps({"a": 1})) == {"a": 1}


def test_rc_initialize_false():
    code = ("import erdmampi\n"
            "erdmampi.rc.initialize = False\n"
            "from erdmampi import MPI\n"
            "assert not MPI.Is_initialized()\n"
            "MPI.Init()\n"
            "assert MPI.Is_initialized() and MPI.COMM_WORLD.Get_size() == 1\n"
            "MPI.Finalize()\n"
            "assert MPI.Is_finalized()\n"
            "print('done')\n")
    p = subprocess.run([sys.executable, "-c", code], env=rank_env(), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "done" in p.stdout, p.stderr


def test_rc_rejects_unknown_option():
    import erdmampi
    with pytest.raises(TypeError):
        erdmampi.rc(bogus=1)
    assert repr(erdmampi.rc) == "<erdmampi.rc>"
