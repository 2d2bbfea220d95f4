"""Ranks on two 'hosts' (ERDMA_HOST): shared memory inside a host, QUIC between
hosts, hierarchical collectives across them."""
import subprocess
import sys

import pytest

from harness import REPO, erdmarun_cmd, rank_env

JOB = r'''
import numpy as np
from erdmampi import MPI, bootstrap
c = MPI.COMM_WORLD
info = bootstrap.world_info()
assert info["local_size"] == 2 and info["local_rank"] == c.rank % 2, info
for n in (1, 1000, 3 << 20):
    x = np.arange(n, dtype=np.float64) * (c.rank + 1)
    y = np.empty_like(x)
    c.Allreduce(x, y)
    assert np.array_equal(y, np.arange(n, dtype=np.float64) * 10), n
    for root in range(c.size):
        b = x.copy() if c.rank == root else np.zeros(n)
        c.Bcast(b, root=root)
        assert np.array_equal(b, np.arange(n, dtype=np.float64) * (root + 1)), (n, root)
assert c.allreduce(c.rank) == 6
sub = c.Split_type(MPI.COMM_TYPE_SHARED)
assert sub.size == 2 and sorted(sub.allgather(c.rank)) == [c.rank // 2 * 2, c.rank // 2 * 2 + 1]
st = bootstrap.init_world().stats()
print("rank", c.rank, "ok", st["pkts_sent"] > 0, flush=True)
'''


@pytest.mark.slow
def test_two_hosts_shared_memory_and_quic(tmp_path):
    wrap = tmp_path / "host.sh"
    wrap.write_text('#!/bin/sh\nexport ERDMA_HOST="host$((ERDMA_RANK / 2))"\nexec "$@"\n')
    wrap.chmod(0o755)
    script = tmp_path / "job.py"
    script.write_text(JOB)
    p = subprocess.run([*erdmarun_cmd(), "-n", "4", "--timeout", "120", str(wrap),
                        sys.executable, str(script)], env=rank_env(), capture_output=True,
                       text=True, timeout=180, cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    # every rank sent QUIC packets (to the other host), and all checks passed
    assert p.stdout.count("ok True") == 4, p.stdout
