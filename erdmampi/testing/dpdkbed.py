"""A test bed for the DPDK packet I/O backend (docs/dpdk.md): two network
namespaces joined by a veth pair, and hugepage helpers.

Namespace ``a`` holds the kernel side (``10.N.0.1`` on ``va<tag>``), namespace
``b`` holds the DPDK side: its veth ``vb<tag>`` keeps the kernel address
``10.N.0.2`` (so kernel-UDP ranks can run there too), and a DPDK endpoint takes
``10.N.0.12`` (:attr:`DpdkBed.dpdk_addr`), an address the kernel does not own:
the kernel silently ignores datagrams for it instead of answering them with
ICMP port-unreachable, and it never answers ARP for it (the DPDK backend does).
A second endpoint, for both-on-DPDK runs, uses ``10.N.0.11`` on ``va``.

Offloads: the kernel peer's veth keeps TX checksum offload on (its packets
carry partial checksums, which the backend accepts), but UDP segmentation
offload is turned off there: a veth hands a GSO train to an AF_PACKET or
AF_XDP reader as one 64 KiB frame, which the PMD truncates.  A NIC on a wire
never delivers such frames, so this is a veth artefact, not a fix.

Needs root.  Everything is removed on :meth:`close` (also on errors).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile

HUGEPAGE_SIZE = 2 << 20


class DpdkBedError(RuntimeError):
    pass


def _run(argv, check=True, input=None):
    p = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=30)
    if check and p.returncode != 0:
        raise DpdkBedError(f"{' '.join(argv)}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def dpdk_available() -> "str | None":
    """None when DPDK tests can run here, else the reason they cannot."""
    if os.geteuid() != 0:
        return "DPDK on veth needs root (AF_PACKET/AF_XDP sockets, namespaces)"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is missing"
    from erdmampi import _engine
    if not _engine.dpdk_plugin_path():
        return _engine.NO_DPDK
    return None


def ns_snmp(ns: str, key: str = "InCsumErrors", proto: str = "Udp") -> int:
    """A counter of /proc/net/snmp inside namespace ``ns`` (Udp InCsumErrors)."""
    out = _run(["ip", "netns", "exec", ns, "cat", "/proc/net/snmp"]).stdout.splitlines()
    rows = [line.split() for line in out if line.startswith(proto + ":")]
    names, values = rows[0][1:], rows[1][1:]
    return int(values[names.index(key)])


class Hugepages:
    """Reserve ``count`` 2 MiB hugepages and mount a private hugetlbfs;
    :meth:`close` gives them back (the previous nr_hugepages)."""

    def __init__(self, count: int = 64):
        self.count = count
        self.dir = None
        self._before = None

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def open(self):
        path = "/proc/sys/vm/nr_hugepages"
        with open(path) as f:
            self._before = int(f.read())
        try:
            with open(path, "w") as f:
                f.write(str(self._before + self.count))
            with open(path) as f:
                got = int(f.read()) - self._before
            if got < self.count:
                raise DpdkBedError(f"asked for {self.count} hugepages, the kernel gave {got}")
            self.dir = tempfile.mkdtemp(prefix="erdma-huge-")
            _run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "nodev", self.dir])
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        if self.dir:
            _run(["umount", self.dir], check=False)
            try:
                os.rmdir(self.dir)
            except OSError:
                pass
            self.dir = None
        if self._before is not None:
            with open("/proc/sys/vm/nr_hugepages", "w") as f:
                f.write(str(self._before))
            self._before = None


class DpdkBed:
    """Two namespaces and a veth pair; see the module docstring."""

    def __init__(self, prefix: str = "erdk", subnet: "int | None" = None):
        self.tag = secrets.token_hex(3)
        self.ns_a, self.ns_b = f"{prefix}a{self.tag}", f"{prefix}b{self.tag}"
        self.dev_a, self.dev_b = f"va{self.tag}", f"vb{self.tag}"
        n = subnet if subnet is not None else 100 + int(self.tag, 16) % 100
        self.net = f"10.{n}.0"
        self.kernel_a = f"{self.net}.1"      # kernel address in a
        self.kernel_b = f"{self.net}.2"      # kernel address in b
        self.dpdk_addr = f"{self.net}.12"    # DPDK endpoint on vb
        self.dpdk_addr_a = f"{self.net}.11"  # DPDK endpoint on va (both-on-DPDK runs)
        self._up = False

    def __enter__(self):
        return self.open()

    def __exit__(self, *exc):
        self.close()

    def open(self):
        try:
            _run(["ip", "netns", "add", self.ns_a])
            _run(["ip", "netns", "add", self.ns_b])
            self._up = True
            _run(["ip", "link", "add", self.dev_a, "netns", self.ns_a, "type", "veth", "peer",
                  "name", self.dev_b, "netns", self.ns_b])
            for ns, dev, addr in ((self.ns_a, self.dev_a, self.kernel_a),
                                  (self.ns_b, self.dev_b, self.kernel_b)):
                _run(["ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev])
                _run(["ip", "-n", ns, "link", "set", dev, "up"])
                _run(["ip", "-n", ns, "link", "set", "lo", "up"])
                # see the module docstring: GSO trains cross a veth unsegmented
                _run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx-udp-segmentation",
                      "off"], check=False)
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        if self._up:
            for ns in (self.ns_a, self.ns_b):
                pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), 9)
                    except (OSError, ValueError):
                        pass
                _run(["ip", "netns", "del", ns], check=False)
            self._up = False

    def set_udp_segmentation(self, side: str, on: bool):
        """UDP GSO offload of side a's or b's veth (off after open(); see the
        module docstring).  On is the kernel path's best case when the peer
        is a kernel socket: GSO trains cross the veth unsegmented."""
        ns, dev = (self.ns_a, self.dev_a) if side == "a" else (self.ns_b, self.dev_b)
        _run(["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx-udp-segmentation",
              "on" if on else "off"])

    def ns_cmd(self, side: str, argv) -> "list[str]":
        ns = self.ns_a if side == "a" else self.ns_b
        return ["ip", "netns", "exec", ns, *argv]

    def eal_args(self, side: str = "b", pmd: str = "af_packet", huge_dir: "str | None" = None,
                 mem_mb: int = 64) -> str:
        """EAL arguments for a DPDK endpoint on side a or b's veth."""
        dev = self.dev_b if side == "b" else self.dev_a
        if pmd == "af_packet":
            vdev = f"--vdev=net_af_packet0,iface={dev}"
        elif pmd == "af_xdp":
            vdev = f"--vdev=net_af_xdp0,iface={dev},start_queue=0,queue_count=1"
        else:
            raise ValueError(f"unknown PMD {pmd!r}")
        mem = f"--huge-dir={huge_dir} --in-memory" if huge_dir else "--no-huge"
        return f"{mem} --no-pci -m {mem_mb} {vdev}"

    # -- impairments (nftables in namespace a: both directions pass its veth)
    def add_loss(self, percent: int):
        """Drop ``percent`` % of the packets leaving and entering a's veth."""
        rules = (f"table netdev erdmaloss {{\n"
                 f"  chain in {{\n    type filter hook ingress device {self.dev_a} priority 0;\n"
                 f"    meta l4proto udp numgen random mod 100 < {percent} counter drop\n  }}\n"
                 f"  chain out {{\n    type filter hook egress device {self.dev_a} priority 0;\n"
                 f"    meta l4proto udp numgen random mod 100 < {percent} counter drop\n  }}\n}}\n")
        _run(["ip", "netns", "exec", self.ns_a, "nft", "-f", "-"], input=rules)

    def add_reorder(self, percent: int):
        """Hold back ``percent`` % of the UDP packets leaving a's veth in a slow
        HTB class (nft sets their priority to it), so they arrive behind later
        ones.  (No netem here, and no prio qdisc.)"""
        dev = self.dev_a

        def tc(*args):
            _run(["ip", "netns", "exec", self.ns_a, "tc", *args])

        tc("qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10")
        tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit")
        tc("class", "add", "dev", dev, "parent", "1:", "classid", "1:20", "htb", "rate", "20mbit",
           "ceil", "20mbit")
        rules = (f"table netdev erdmareord {{\n"
                 f"  chain out {{\n    type filter hook egress device {dev} priority 0;\n"
                 f"    meta l4proto udp numgen random mod 100 < {percent} counter "
                 f"meta priority set 1:20\n"
                 f"  }}\n}}\n")
        _run(["ip", "netns", "exec", self.ns_a, "nft", "-f", "-"], input=rules)


# -- a two-rank engine worker, run inside a namespace by tests and bench/pktio.py
def nft_counted(bed: DpdkBed, table: str) -> int:
    """Packets counted by the rules of netdev table ``table`` in namespace a."""
    import re
    out = _run(bed.ns_cmd("a", ["nft", "list", "table", "netdev", table])).stdout
    return sum(int(n) for n in re.findall(r"counter packets (\d+)", out))


def _pattern(n: int, salt: int):
    import numpy as np
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + salt) >> 7).astype(np.uint8)


def _worker(argv=None) -> int:
    """python -m erdmampi.testing.dpdkbed --rank R --bind IP --port P
    --peer IP:PORT [--pktio dpdk --eal ARGS] (--sizes N,N,... | --bench BYTES --msg BYTES)

    Two engines: rank 0 sends each size with checked contents, rank 1 checks
    and echoes it back transformed; or rank 0 streams BYTES to rank 1 in
    messages of --msg bytes (bench).  Prints one JSON line."""
    import argparse
    import json
    import resource
    import time

    import numpy as np

    from erdmampi._engine import Engine

    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--bind", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--pktio", default="udp")
    ap.add_argument("--eal", default="")
    ap.add_argument("--neigh", default="", help="static neighbours ip=mac,...")
    ap.add_argument("--sizes", default="")
    ap.add_argument("--bench", type=int, default=0)
    ap.add_argument("--msg", type=int, default=1 << 20)
    ap.add_argument("--verbose", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--idle", type=float, default=0.0, help="seconds to sit idle (CPU measured)")
    ap.add_argument("--pingpong", type=int, default=0, help="1-byte round trips (latency)")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between round trips")
    ap.add_argument("--ready-file", help="created once connected and done with --sizes")
    ap.add_argument("--wait-file", help="then wait (up to --timeout) until this file exists")
    a = ap.parse_args(argv)
    host, port = a.peer.rsplit(":", 1)
    kw = dict(pktio=a.pktio, dpdk_eal=a.eal, dpdk_neigh=a.neigh) if a.pktio == "dpdk" else {}
    # a test bed of its own: the two ranks exchange no fingerprints
    e = Engine.create(rank=a.rank, size=2, bind=a.bind, port=a.port, connect_timeout=a.timeout,
                      verbose=a.verbose, insecure=True, **kw)
    peer = 1 - a.rank
    e.set_peer(peer, host, int(port))
    e.connect()
    out = {"rank": a.rank, "pktio": a.pktio}
    if a.sizes:
        for i, n in enumerate(int(x) for x in a.sizes.split(",")):
            if a.rank == 0:
                x = _pattern(n, i)
                e.send(x.ctypes.data, n, peer, i, 7, keep=x)
                y = np.empty(n, np.uint8)
                st = e.recv(y.ctypes.data, n, peer, i, 7, keep=y)
                assert st.nbytes == n and np.array_equal(y, x ^ 0x5A), f"echo of {n} bytes wrong"
            else:
                y = np.empty(n, np.uint8)
                st = e.recv(y.ctypes.data, n, peer, i, 7, keep=y)
                assert st.nbytes == n and np.array_equal(y, _pattern(n, i)), f"{n} bytes wrong"
                y ^= 0x5A
                e.send(y.ctypes.data, n, peer, i, 7, keep=y)
        out["sizes_ok"] = len(a.sizes.split(","))
    if a.ready_file:
        open(a.ready_file, "w").close()
    if a.wait_file:
        t_end = time.monotonic() + a.timeout
        while not os.path.exists(a.wait_file) and time.monotonic() < t_end:
            time.sleep(0.05)
    if a.bench:
        buf = np.zeros(a.msg, np.uint8) if a.rank == 0 else np.empty(a.msg, np.uint8)
        one = np.zeros(1, np.uint8)
        # a round trip first: both sides are ready before the clock starts
        if a.rank == 0:
            e.send(one.ctypes.data, 1, peer, 1, 9, keep=one)
            e.recv(one.ctypes.data, 1, peer, 2, 9, keep=one)
        else:
            e.recv(one.ctypes.data, 1, peer, 1, 9, keep=one)
            e.send(one.ctypes.data, 1, peer, 2, 9, keep=one)
        s0, r0 = e.stats(), resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        nmsg = max(1, a.bench // a.msg)
        window = 8
        reqs = []
        for k in range(nmsg):
            if a.rank == 0:
                reqs.append(e.isend(buf.ctypes.data, a.msg, peer, 3, 9, keep=buf))
            else:
                reqs.append(e.irecv(buf.ctypes.data, a.msg, peer, 3, 9, keep=buf))
            if len(reqs) >= window:
                reqs.pop(0).wait(a.timeout)
        for r in reqs:
            r.wait(a.timeout)
        # the receiver has it all once it says so
        if a.rank == 0:
            e.recv(one.ctypes.data, 1, peer, 4, 9, keep=one)
        else:
            e.send(one.ctypes.data, 1, peer, 4, 9, keep=one)
        wall = time.monotonic() - t0
        s1, r1 = e.stats(), resource.getrusage(resource.RUSAGE_SELF)
        out.update(wall=wall, bytes=nmsg * a.msg,
                   cpu=(r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
                   pkts_sent=s1["pkts_sent"] - s0["pkts_sent"],
                   pkts_recv=s1["pkts_recv"] - s0["pkts_recv"])
    if a.pingpong:
        one = np.zeros(1, np.uint8)
        rtts = []
        for k in range(a.pingpong):
            if a.rank == 0:
                if a.gap:
                    time.sleep(a.gap)
                t = time.perf_counter()
                e.send(one.ctypes.data, 1, peer, 5, 9, keep=one)
                e.recv(one.ctypes.data, 1, peer, 6, 9, keep=one)
                rtts.append(time.perf_counter() - t)
            else:
                e.recv(one.ctypes.data, 1, peer, 5, 9, keep=one)
                e.send(one.ctypes.data, 1, peer, 6, 9, keep=one)
        if rtts:
            rtts.sort()
            out.update(rtt_median_us=rtts[len(rtts) // 2] * 1e6,
                       rtt_p90_us=rtts[int(len(rtts) * 0.9)] * 1e6)
    if a.idle:
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        time.sleep(a.idle)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        out["idle_cpu_share"] = ((r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)) / a.idle
    e.shutdown(10.0)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker())
