"""A job run across the NAT bed (tests/test_nat_jobs.py): collectives with
checked results, then one JSON line with this rank's paths.

argv: [iterations] [seconds to pause between iterations]
"""
import json
import sys
import time

import numpy as np

from erdmampi import MPI, bootstrap

iters = int(sys.argv[1]) if len(sys.argv) > 1 else 1
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
t_init = time.monotonic()
for it in range(iters):
    x = np.arange(100_000, dtype=np.float64) + rank + it
    out = np.empty_like(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    want = size * (np.arange(100_000, dtype=np.float64) + it) + size * (size - 1) / 2
    assert np.array_equal(out, want), f"rank {rank}: Allreduce wrong at iteration {it}"
    b = np.arange(1 << 18, dtype=np.int32) * (it + 1) if rank == 0 else np.empty(1 << 18, np.int32)
    comm.Bcast(b, root=0)
    assert np.array_equal(b, np.arange(1 << 18, dtype=np.int32) * (it + 1)), "Bcast wrong"
    s = np.array([[rank * 1000 + d + it for _ in range(500)] for d in range(size)], np.int64)
    r = np.empty_like(s)
    comm.Alltoall(s, r)
    assert all((r[src] == src * 1000 + rank + it).all() for src in range(size)), "Alltoall wrong"
    obj = comm.bcast({"it": it, "from": rank} if rank == 0 else None, root=0)
    assert obj == {"it": it, "from": 0}
    if pause:
        time.sleep(pause)
eng = bootstrap._world
routes = {p: eng.peer_route(p) for p in range(size) if p != rank}
info = bootstrap.world_info()
print("NATJOB " + json.dumps({"rank": rank, "routes": routes, "paths": info.get("paths", {}),
                              "bootstrap_seconds": info.get("bootstrap_seconds")}), flush=True)
