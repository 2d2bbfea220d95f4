"""A sender that runs ahead of its receiver on one host is held back in the
ring beyond ERDMA_SHM_UNEXPECTED_MAX, and no wait of the receiver's (a
receive or probe of the message sent last, an Iprobe or Test loop, two
ranks flooding each other, a rendezvous answered from behind a flood) is
stuck behind the held bytes (tests/scripts/shm_hold.py; the same script
holds for mpi4py + MPICH)."""
from _ranks import assert_ok, assert_reference, run_script


def test_shm_sender_held_and_every_wait_served():
    assert_ok(run_script("shm_hold.py", 2), "shm_hold.py", 2)


def test_shm_hold_with_a_bound_past_the_ring():
    # the old behaviour: the receiver takes in up to 8 MiB (the script's
    # bound check is for the default and fails; every message still arrives)
    p = run_script("shm_hold.py", 2, env={"ERDMA_SHM_UNEXPECTED_MAX": "8M"})
    out = p.stdout + p.stderr
    assert "messages held" in out and "out of order" not in out, out[-3000:]
    assert "Gather after" not in out and "the last message" not in out, out[-3000:]


def test_shm_hold_holds_for_mpi4py():
    assert_reference("shm_hold.py", 2)
