"""Two-rank Barriers of one host by flags in shared memory (erdma_pair_* in
erdma_shm.c): Barrier's semantics however the communicator is reached
(tests/scripts/pair_barrier.py, also against mpi4py), a peer that dies or
stops while the other waits on its flag, and a signal during that wait."""
import re
import time

import pytest

from _ranks import PAIR_JOB, assert_ok, assert_reference, run_script
from harness import run_mpi

SCRIPT = "pair_barrier.py"


@pytest.mark.parametrize("nprocs", [2, 3])
def test_barrier_semantics_by_flags_and_messages(nprocs):
    assert_ok(run_script(SCRIPT, nprocs), SCRIPT, nprocs)


def test_barrier_semantics_hold_for_mpi4py():
    assert_reference(SCRIPT, 2)


TIMEOUT = 3.0   # ERDMA_TIMEOUT of the jobs below

_FAULT = PAIR_JOB + r"""
comm.Barrier()
if comm.rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP if mode == "stop" else signal.SIGKILL)
    time.sleep(600)
t0 = time.monotonic()
try:
    for _ in range(1000):
        comm.Barrier()
    print("rank 0: no error", flush=True)
except MPI.Exception as e:
    same = e.Get_error_class() == MPI.ERR_PROC_FAILED
    print(f"rank 0: PROC_FAILED={same} after {time.monotonic() - t0:.2f} s", flush=True)
os.kill(pids[1], signal.SIGKILL)    # (a stopped one too)
os._exit(0)
"""


@pytest.mark.parametrize("mode", ["kill", "stop"])
def test_a_dead_or_stopped_peer_fails_a_barrier_by_flags(mode):
    res = run_mpi(2, _FAULT, args=(mode,), timeout=60,
                  env={"ERDMA_TIMEOUT": str(TIMEOUT), "ERDMA_SHM": "1"},
                  extra=["--kill-grace", "40"])
    out = res.stdout + res.stderr
    assert "rank 0: flags=True" in out and "rank 1: flags=True" in out, out
    m = re.search(r"rank 0: PROC_FAILED=(\w+) after ([\d.]+) s", res.stdout)
    assert m and m.group(1) == "True", out
    took = float(m.group(2))
    if mode == "kill":      # an exited local process is seen within a liveness tick
        assert took < 1.5, out
    else:                   # a frozen one once its heartbeat stood still ERDMA_TIMEOUT
        assert TIMEOUT - 0.5 <= took < 2 * TIMEOUT + 3, out


# rank 0 is in a Barrier (after `before` others; through a second object of
# the communicator, whose first call takes the Python-resolved path, with
# `alias`) when SIGALRM comes 0.3 s in; rank 1 enters it `late` s in; then
# both check they still agree
_ALARMED = r"""
import signal, sys, time
from erdmampi import MPI
from erdmampi._commrt import _rt
from erdmampi._engine import lib
comm = MPI.COMM_WORLD
before, late, alias = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3] == "1"

for _ in range(before):
    comm.Barrier()
class Alarm(Exception):
    pass
def ring(*_):
    raise Alarm()
if comm.rank == 0:
    signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    t0 = time.monotonic()
    try:
        (MPI.Intracomm(comm) if alias else comm).Barrier()
        print("rank 0: no signal", flush=True)
    except Alarm:
        print(f"rank 0: interrupted after {time.monotonic() - t0:.2f} s", flush=True)
else:
    time.sleep(late)
    comm.Barrier()      # meets the Barrier rank 0 entered
on = lib.erdma_pair_find(_rt.engine._h, 1 - comm.rank, comm._ctx + 1) >= 0
print(f"rank {comm.rank}: flags={on} same={comm.allgather(on) == [on, on]}", flush=True)
# both count the same Barriers from here on: no rank leaves one before the
# other entered (CLOCK_MONOTONIC is one clock for the processes of a host)
stamps = []
for i in range(20):
    if comm.rank == i % 2:
        time.sleep(0.02)
        stamps.append(time.monotonic())
        comm.Barrier()
    else:
        comm.Barrier()
        stamps.append(time.monotonic())
every = comm.allgather(stamps)
for i in range(20):
    if comm.rank != i % 2 and stamps[i] < every[i % 2][i]:
        print(f"rank {comm.rank}: round {i} left early", flush=True)
print(f"rank {comm.rank}: done", flush=True)
"""


def _alarmed(before, late, alias=False):
    res = run_mpi(2, _ALARMED, args=(before, late, int(alias)), timeout=60)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    m = re.search(r"rank 0: interrupted after ([\d.]+) s", out)
    assert m, out
    assert "rank 0: flags=True same=True" in out and "rank 1: flags=True same=True" in out, out
    assert "left early" not in out, out
    assert "rank 0: done" in out and "rank 1: done" in out, out
    return float(m.group(1))


@pytest.mark.parametrize("alias", [False, True])
def test_a_signal_interrupts_a_barrier_by_flags(alias):
    assert _alarmed(5, 2.0, alias) < 1.5    # within the 0.5 s wait slice of the alarm


def test_a_signal_at_the_agreeing_barrier_leaves_both_ranks_alike():
    # the Barrier that offers flags (the second) runs to its end, then the
    # handler runs: a rank that left it early would not know the peer's
    # answer, and the two would wait for each other on different ways
    assert _alarmed(1, 1.0) >= 0.9
