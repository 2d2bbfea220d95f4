"""ERDMA_VERBOSE=1 start-up lines and the ERDMA_STATS=1 dump, on shared memory
and over QUIC."""
import os
import re

import pytest

from harness import run_mpi

PROG = """
import numpy as np
from erdmampi import MPI
c = MPI.COMM_WORLD
x = np.ones(1 << 18)
c.Allreduce(MPI.IN_PLACE, x)
assert x[0] == c.size
"""


def _tagged(err, rank):
    return [ln[len(f"[rank {rank}] "):] for ln in err.splitlines()
            if ln.startswith(f"[rank {rank}] ")]


def test_quiet_by_default():
    r = run_mpi(2, PROG, timeout=60, env={"ERDMA_VERBOSE": "", "ERDMA_STATS": ""})
    assert r.returncode == 0, r.stderr
    assert "[rank" not in r.stderr


@pytest.mark.parametrize("shm, route", [("1", "shm"), ("0", "direct")])
def test_startup_line_names_each_peers_route(shm, route):
    r = run_mpi(2, PROG, timeout=60, env={"ERDMA_VERBOSE": "1", "ERDMA_SHM": shm})
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        mine = _tagged(r.stderr, rank)
        head = [ln for ln in mine if ln.startswith("erdmampi ")]
        assert len(head) == 1, r.stderr
        line = head[0]
        assert re.search(rf"rank {rank} of 2, pid \d+, host \S+, bind [\d.]+:\d+, cc \w+, "
                         rf"compression \w+, timeout \S+ s; peers: {route} {1 - rank}$", line), line


def test_verbose_2_lists_each_peer():
    r = run_mpi(2, PROG, timeout=60, env={"ERDMA_VERBOSE": "2", "ERDMA_SHM": "0"})
    assert r.returncode == 0, r.stderr
    peer = [ln for ln in _tagged(r.stderr, 0) if ln.startswith("  peer 1:")]
    assert peer and re.search(r"direct [\d.]+:\d+, 1 QUIC connection\(s\), srtt [\d.]+ ms",
                              peer[0]), r.stderr


def test_stats_dump_at_exit():
    r = run_mpi(2, PROG, timeout=60, env={"ERDMA_STATS": "1", "ERDMA_SHM": "0"})
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        mine = _tagged(r.stderr, rank)
        head = [ln for ln in mine if ln.startswith("erdmampi statistics")]
        assert len(head) == 1, r.stderr
        sent = int(re.search(r"sent (\d+) bytes in (\d+) messages", head[0]).group(1))
        assert sent >= 8 * (1 << 18) // 2, head[0]   # at least half the vector went out
        peer = [ln for ln in mine if ln.startswith(f"  peer {1 - rank}: direct")]
        assert peer and re.search(r"srtt [\d.]+ ms, min rtt [\d.]+ ms, cwnd \d+ bytes, "
                                  r"\d+ packets lost and resent, \d+ probe timeouts",
                                  peer[0]), r.stderr
        assert any(ln.startswith("  compression:") for ln in mine)


def _netns_with_loss(percent):
    """A network namespace whose loopback drops ``percent`` % of UDP packets."""
    import shutil
    import subprocess
    if os.geteuid() != 0 or not shutil.which("nft"):
        pytest.skip("needs root and nft")
    ns = f"erdmadiag{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    rules = ("table inet loss {\n  chain out {\n    type filter hook output priority 0;\n"
             f"    meta l4proto udp numgen random mod 100 < {percent} drop\n  }}\n}}\n")
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                       check=True)
    except BaseException:
        subprocess.run(["ip", "netns", "del", ns])
        raise
    return ns


def test_stats_count_lost_packets():
    import subprocess
    import sys
    from harness import erdmarun_cmd, rank_env
    ns = _netns_with_loss(3)
    try:
        prog = PROG.replace("1 << 18", "1 << 22")
        r = subprocess.run(["ip", "netns", "exec", ns] + erdmarun_cmd()
                           + ["-n", "2", "--timeout", "120", sys.executable, "-c", prog],
                           env=rank_env({"ERDMA_STATS": "1", "ERDMA_SHM": "0"}),
                           capture_output=True, text=True, timeout=180)
    finally:
        subprocess.run(["ip", "netns", "del", ns])
    assert r.returncode == 0, r.stderr
    lost = [int(m) for m in re.findall(r"(\d+) packets lost and resent", r.stderr)]
    assert len(lost) == 2 and sum(lost) > 0, r.stderr
