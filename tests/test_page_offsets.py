"""Messages whose buffers start at every kind of offset into a page, so that
the copies into and out of the rings, the CMA reads and writes and a rank's
own block run with the source and destination 1-63 bytes apart modulo the
page (copied by erdma_copy's vector loop and through the CMA bounce buffer)
and otherwise: point-to-point and collectives, every byte checked, at 2 and
3 ranks and under mpi4py + MPICH (tests/scripts/page_offsets.py)."""
import pytest

from _ranks import assert_ok, assert_reference, run_script


@pytest.mark.parametrize("nprocs", [2, 3])
def test_messages_at_every_page_offset(nprocs):
    assert_ok(run_script("page_offsets.py", nprocs, timeout=150), "page_offsets.py", nprocs)


def test_page_offsets_hold_for_mpi4py():
    assert_reference("page_offsets.py", 2)
