"""``auto`` (the default) on one host never compresses; with ERDMA_FAKE_HOSTS=1
each rank claims its own host (ERDMA_HOST set before MPI starts) and large
vectors go through the compressed algorithms, each message lossless or raw
as the sender's policy decides; results stay exact either way."""
import os

if os.environ.get("ERDMA_FAKE_HOSTS") == "1":
    os.environ["ERDMA_HOST"] = "fakehost%s" % os.environ.get("ERDMA_RANK", "0")

import numpy as np  # noqa: E402
from _mpi import MPI, check, done  # noqa: E402

from erdmampi import compression as cz  # noqa: E402

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
fake = os.environ.get("ERDMA_FAKE_HOSTS") == "1"
check(cz.default_mode() == "auto", f"default {cz.default_mode()}")
cz.reset_stats()
N = 1 << 16                                  # 256 KiB of float32: above AUTO_MIN
rng = np.random.default_rng(r)
x = rng.integers(-100, 100, N).astype(np.float32)
want = sum(np.random.default_rng(p).integers(-100, 100, N).astype(np.float32)
           for p in range(n))
for _ in range(3):
    out = np.zeros(N, np.float32)
    world.Allreduce(x, out)
    check(np.array_equal(out, want), "Allreduce exact under auto")
    b = x.copy() if r == 0 else np.zeros(N, np.float32)
    world.Bcast(b, 0)
    check(np.array_equal(b, np.random.default_rng(0).integers(-100, 100, N)
                         .astype(np.float32)), "Bcast exact under auto")
small = np.zeros(10, np.float32)
world.Allreduce(np.ones(10, np.float32), small)
check((small == n).all(), "small Allreduce")
st = cz.stats()
if fake:
    check(st["calls"] == 6, f"multi-host auto: compressed calls {st}")
    check(st["plain_calls"] == 0, f"plain calls {st}")
else:
    check(st["calls"] == 0 and st["bytes_out"] == 0, f"one host auto compressed: {st}")
    # one host: auto never asks the planner (nothing to count as plain)
    check(st["plain_calls"] == 0, f"plain calls {st}")
if r == 0:
    print("stats", st, flush=True)
done("compress_auto")
