"""Ranks in two network namespaces joined by a veth pair: the QUIC path over a
real (virtual) link, not loopback.  Needs root; skipped otherwise."""
import os
import secrets
import subprocess
import sys

import pytest

from harness import REPO, erdmarun_cmd, rank_env

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture
def two_hosts():
    tag = secrets.token_hex(3)
    a, b = f"erta{tag}", f"ertb{tag}"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
        _ip("link", "add", "va" + tag, "netns", a, "type", "veth", "peer", "name", "vb" + tag,
            "netns", b)
        for ns, dev, addr in ((a, "va" + tag, "10.99.7.1/24"), (b, "vb" + tag, "10.99.7.2/24")):
            _ip("-n", ns, "addr", "add", addr, "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (OSError, subprocess.CalledProcessError) as e:
        for ns in (a, b):
            _ip("netns", "del", ns, check=False)
        pytest.skip(f"cannot build network namespaces here: {e}")
    yield a, b, "va" + tag
    for ns in (a, b):
        _ip("netns", "del", ns, check=False)


def _rx_bytes(ns, dev):
    out = _ip("-n", ns, "-s", "link", "show", dev).stdout.split("\n")
    i = next(k for k, line in enumerate(out) if line.strip().startswith("RX:"))
    return int(out[i + 1].split()[0])


@pytest.mark.slow
def test_allreduce_across_namespaces_over_quic(two_hosts, tmp_path):
    a, b, dev_a = two_hosts
    wrapper = tmp_path / "wrap.sh"
    # rank 1 lives in the other namespace; erdmarun and rank 0 run in `a`
    wrapper.write_text(f'#!/bin/sh\n[ "$ERDMA_RANK" = 1 ] && exec ip netns exec {b} "$@"\n'
                       'exec "$@"\n')
    wrapper.chmod(0o755)
    script = tmp_path / "job.py"
    script.write_text(
        "import numpy as np\n"
        "from erdmampi import MPI\n"
        "c = MPI.COMM_WORLD\n"
        "x = np.full(8 << 20, c.rank + 1, np.float32)\n"
        "y = np.empty_like(x)\n"
        "c.Allreduce(x, y)\n"
        "assert (y == 3).all()\n"
        "print('rank', c.rank, 'sum ok', c.allreduce(c.rank), flush=True)\n")
    before = _rx_bytes(a, dev_a)
    cmd = ["ip", "netns", "exec", a, *erdmarun_cmd(), "-n", "2", "--timeout", "120",
           "--rendezvous-addr", "10.99.7.1", "--env", "ERDMA_SHM=0", str(wrapper),
           sys.executable, str(script)]
    p = subprocess.run(cmd, env=rank_env(), capture_output=True, text=True, timeout=180,
                       cwd=REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("sum ok 1") == 2, p.stdout
    # 32 MiB went each way over the veth, not through shared memory or loopback
    assert _rx_bytes(a, dev_a) - before > 32 << 20
