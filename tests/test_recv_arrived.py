"""Blocking receives of messages that arrived first (taken from the
unexpected queue without a request, erdma_recv_now): bytes, status,
truncation and order, at 2 and 3 ranks; the same script holds for mpi4py +
MPICH (tests/scripts/recv_arrived.py); a message that lands while the
receive reads the rings itself (erdma_recv_soon_alloc, tests/scripts/recv_soon.py)."""
import pytest

from _ranks import assert_ok, assert_reference, run_script


@pytest.mark.parametrize("nprocs", [2, 3])
def test_receives_of_messages_already_here(nprocs):
    assert_ok(run_script("recv_arrived.py", nprocs), "recv_arrived.py", nprocs)


def test_recv_arrived_holds_for_mpi4py():
    assert_reference("recv_arrived.py", 2)


def test_a_receive_reads_the_rings_for_a_message_landing_soon():
    assert_ok(run_script("recv_soon.py", 2), "recv_soon.py", 2)
