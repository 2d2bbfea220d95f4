"""The one-call fast paths for plain NumPy arrays give what the full
parser gives (buffers.message_p2p), and the lean blocking Send/Recv behave as
the request-based calls (tests/scripts/p2p_fast.py, also run against mpi4py)."""
import shutil

import numpy as np
import pytest

from erdmampi import buffers as B
from erdmampi import datatype as D

from _ranks import assert_ok, run_script, run_script_mpi4py

FIELDS = ("addr", "nbytes", "count", "datatype", "device", "blocks")


def _same(fast, slow):
    for f in FIELDS:
        assert getattr(fast, f) == getattr(slow, f), f
    assert fast.datatype.Get_name() == slow.datatype.Get_name()
    assert fast.array.dtype == slow.array.dtype and fast.array.ndim == 1
    assert fast.array.tobytes() == slow.array.tobytes()
    assert np.shares_memory(fast.array, fast.obj)


@pytest.mark.parametrize("code", ["b", "B", "h", "i", "l", "q", "L", "Q", "f", "d",
                                  "g", "F", "D", "?", "e"])
@pytest.mark.parametrize("readonly", [True, False])
def test_plain_arrays_match_the_parser(code, readonly):
    for shape in ((5,), (2, 3), ()):
        a = np.ones(shape, dtype=code)
        slow = B._message_simple(a, readonly, 1)
        B.message_p2p(a, readonly)                       # learns the dtype
        assert B.plain_datatype(a, readonly) is slow.datatype
        _same(B.message_p2p(a, readonly), slow)


def test_equal_dtypes_with_different_formats_keep_their_datatypes():
    # np.dtype('q') == np.dtype('l') but mpi4py maps them to LONG_LONG / LONG
    for _ in range(2):
        assert B.message_p2p(np.zeros(2, "q"), True).datatype == D.LONG_LONG
        assert B.message_p2p(np.zeros(2, "l"), True).datatype == D.LONG


def test_fast_path_refusals_still_raise_like_the_parser():
    a = np.zeros(4)
    B.message_p2p(a, False)
    ro = np.zeros(4)
    ro.flags.writeable = False
    assert B.plain_datatype(ro, False) is None
    with pytest.raises(BufferError):
        B.message_p2p(ro, readonly=False)
    assert B.message_p2p(ro, readonly=True).count == 4
    with pytest.raises(BufferError):
        B.message_p2p(np.zeros(4, ">f8"), readonly=True)
    f = np.zeros((3, 2), order="F")
    assert B.plain_datatype(f, True) is None
    _same(B.message_p2p(f, True), B._message_simple(f, True, 1))
    e = np.zeros(0)
    assert B.plain_datatype(e, True) is None and B.message_p2p(e, True).addr == 0
    with pytest.raises(KeyError):
        B.message_p2p(np.zeros(2, "U3"), True)
    with pytest.raises(KeyError):
        B.message_p2p(np.zeros(2, "U3"), True)   # errors are never cached as OK


class _Sub(np.ndarray):
    pass


def test_subclasses_take_the_parser():
    a = np.arange(4.0).view(_Sub)
    assert type(B.message_p2p(a, True).obj) is _Sub
    assert B.message_p2p(a, True).count == 4


@pytest.mark.parametrize("nprocs", [1, 2])
def test_blocking_p2p_fast_path(nprocs):
    assert_ok(run_script("p2p_fast.py", nprocs), "p2p_fast.py", nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_blocking_p2p_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("p2p_fast.py", 2, timeout=120), "p2p_fast.py", 2)


def test_revoked_communicator_refuses_the_one_call_paths():
    assert_ok(run_script("p2p_revoked.py", 2), "p2p_revoked.py", 2)


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_rooted_one_call_paths(nprocs):
    assert_ok(run_script("rooted_fast.py", nprocs), "rooted_fast.py", nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_rooted_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("rooted_fast.py", 2, timeout=120), "rooted_fast.py", 2)


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_sendrecv_of_derived_datatypes(nprocs):
    assert_ok(run_script("sendrecv_packed.py", nprocs), "sendrecv_packed.py", nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
def test_sendrecv_packed_script_holds_for_mpi4py():
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py("sendrecv_packed.py", 2, timeout=120), "sendrecv_packed.py", 2)
