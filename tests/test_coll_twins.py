"""C and Python twins of the collectives post the same messages.

Several collectives have a C implementation (erdma_coll.c: one engine call
for small host arrays; erdma_bulk.c: one-host bulk collectives; the C fast
path of Allreduce) and a Python one (erdmampi/collectives) that a rank takes
instead for a strided buffer or an ``ERDMA_COLL_<NAME>`` override.  Ranks on
different paths must still match, so the two must send and receive exactly
the same messages: tests/coll_twins_rank.py runs every case both ways (and
mixed, and strided) under the engine's message trace and compares results
(bit for bit) and each rank's ordered messages.  A drift fails here instead
of deadlocking a job.
"""
import re

import pytest

from harness import REPO, run_mpi

SCRIPT = REPO / "tests" / "coll_twins_rank.py"
LINE = re.compile(r"\[(\d+)\] (TWIN|MISMATCH|SKIP|SENSITIVE|DONE) (.*?)(?:: | msgs=| \(|$)")


def _run(n, *args, timeout=120):
    r = run_mpi(n, SCRIPT, args=args, timeout=timeout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    out = {"TWIN": set(), "MISMATCH": set(), "SKIP": set(), "SENSITIVE": set(), "DONE": set()}
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            out[m.group(2)].add((int(m.group(1)), m.group(3)))
    assert len(out["DONE"]) == n, r.stdout[-4000:] + r.stderr[-4000:]
    return out, r.stdout


def _check(n, *args):
    out, text = _run(n, *args)
    mismatches = [line for line in text.splitlines() if "MISMATCH" in line]
    assert not mismatches, "\n".join(mismatches)
    labels = {label for _, label in out["TWIN"]}
    # the twins of every collective were compared, not skipped
    for name in ("barrier", "bcast", "allreduce", "reduce", "reduce_scatter_block",
                 "gather", "scatter", "allgather", "alltoall"):
        assert any(label.startswith(name + " ") or label == name for label in labels), name
    # every rank compared every case
    assert len(out["TWIN"]) == n * len(labels)
    # a different algorithm is seen to post other messages (two ranks: a
    # Bcast and an Alltoall post none, by flags)
    assert len(out["SENSITIVE"]) == n * (3 if 2 < n < 5 else 1 if n == 2 else 2), text[-3000:]
    return labels


@pytest.mark.parametrize("n", [2, 3, 4])
def test_twins(n):
    labels = _check(n)
    assert len(labels) >= 50


@pytest.mark.slow
@pytest.mark.parametrize("n", [5, 6])
def test_twins_more_ranks(n):
    _check(n)


def test_twins_comparison_can_fail():
    """Each C call against a different Python algorithm (``--break``): at
    four ranks every one of those algorithms posts other messages, so every
    case must be reported as a mismatch on some rank."""
    out, text = _run(4, "--break", "--quick")
    compared = {label for _, label in out["TWIN"] | out["MISMATCH"]}
    failed = {label for _, label in out["MISMATCH"]}
    assert len(compared) >= 20, text[-3000:]
    assert compared == failed, sorted(compared - failed)


TRACE = r"""
import os
import numpy as np
from erdmampi import MPI
from erdmampi._commrt import _rt
comm = MPI.COMM_WORLD
eng = _rt.engine
me = comm.Get_rank()
a = np.arange(4, dtype=np.int16)
if os.environ.get("ERDMA_TRACE_MSGS"):
    # started with the engine: no trace_start needed
    comm.Barrier()
    assert len(eng.trace_take()) > 0
eng.trace_start(8)
if me == 0:
    comm.Send([a, MPI.SHORT], dest=1, tag=777)
else:
    comm.Recv([a, MPI.SHORT], source=0, tag=777)
t = eng.trace_take()
assert len(t) == 1, t
op, peer, tag, nbytes, ctx = t[0]
assert (op, peer, tag, nbytes) == (("send", 1, 777, 8) if me == 0 else ("recv", 0, 777, 8)), t
assert eng.trace_take() == []
eng.trace_start(1)
for _ in range(3):
    comm.Barrier()
try:
    eng.trace_take()
except RuntimeError as e:
    assert "dropped" in str(e)
else:
    raise AssertionError("a full trace must say so")
eng.trace_start(0)
comm.Barrier()
assert eng.trace_take() == []
print("TRACE OK", me)
"""


@pytest.mark.parametrize("env", [{}, {"ERDMA_TRACE_MSGS": "100000"}])
def test_message_trace(env):
    r = run_mpi(2, TRACE, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("TRACE OK") == 2
