"""A job whose pair starts on the TURN relay and should end on the direct path
(tests/test_nat_jobs.py): checked Allreduces throughout, a flag file when
started, work until the test opens the direct path (another flag file), then
until both ranks route to each other directly; one JSON line at the end.

argv: FLAGDIR SECONDS (how long to wait for the direct path once opened)
"""
import json
import sys
import time
from pathlib import Path

import numpy as np

from erdmampi import MPI, bootstrap

flags, limit = Path(sys.argv[1]), float(sys.argv[2])
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
peer = 1 - rank
eng = bootstrap._world
n = 1 << 16
done = 0


def checked_allreduce():
    global done
    x = np.arange(n, dtype=np.float64) * (done + 1) + rank
    out = np.empty_like(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    want = size * np.arange(n, dtype=np.float64) * (done + 1) + size * (size - 1) / 2
    assert np.array_equal(out, want), f"rank {rank}: Allreduce wrong at {done}"
    done += 1


def agreed(flag):
    """``flag`` as every rank sees it: true if it is on any rank, so that
    all ranks take the same branch and run the same collectives."""
    return bool(comm.allreduce(int(bool(flag)), op=MPI.MAX))


for _ in range(5):
    checked_allreduce()
start_route = eng.peer_route(peer)
(flags / f"started-{rank}").write_text(start_route)
t0 = time.monotonic()
while not agreed((flags / "opened").exists()):
    assert time.monotonic() - t0 < 60, "the test never opened the direct path"
    checked_allreduce()
    time.sleep(0.05)
t_open = time.monotonic()
while True:
    checked_allreduce()
    both_direct = comm.allreduce(int(eng.peer_route(peer) == "direct"), op=MPI.MIN)
    if both_direct or agreed(time.monotonic() - t_open > limit):
        break
    time.sleep(0.05)
seconds = time.monotonic() - t_open
for _ in range(5):
    checked_allreduce()
st = eng.stats()
print("NATRET " + json.dumps({
    "rank": rank, "start_route": start_route, "end_route": eng.peer_route(peer),
    "seconds_to_direct": seconds, "allreduces": done, "to_direct": st["to_direct"],
    "to_relay": st["to_relay"], "paths": bootstrap.world_info().get("paths", {})}), flush=True)
