"""Packet I/O backends compared on one veth pair (docs/dpdk.md, "Numbers").

Two engines in two network namespaces (erdmampi.testing.dpdkbed), each pinned
to its own core (UDP segmentation offload on a veth only where its peer is a
kernel socket: the kernel path's best case); rank 0 streams BYTES to rank 1 in 1 MiB messages (8 in
flight).  Every combination of kernel UDP (sendmmsg + UDP GSO, recvmmsg + UDP
GRO) and DPDK (AF_PACKET PMD, or AF_XDP with hugepages) runs RUNS times and
the best run is kept (the machine is shared and loaded).

Per rank: payload throughput, packets per second (sent + received QUIC
packets), CPU time and CPU cycles per payload byte = CPU seconds x nominal
clock / bytes.  A DPDK rank polls, so its CPU time includes the polling.

Needs root and a build with the DPDK backend.  Usage:

    python -m bench.pktio [--bytes 256M] [--runs 3] [--pmd af_packet] [--json FILE]
"""
import argparse
import json
import os
import signal
import subprocess
import sys

from bench.common import format_size, parse_size

WORKER = [sys.executable, "-m", "erdmampi.testing.dpdkbed"]


def nominal_hz():
    """The CPU's nominal clock (/proc/cpuinfo 'cpu MHz' of the first CPU)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) * 1e6
    return 2.5e9


def run_once(bed, sender, receiver, nbytes, msg, huge_dir=None, pmd="af_packet", extra=()):
    """One transfer; sender/receiver: "udp" or "dpdk".  Returns both JSON records."""
    sides = [(0, "a", sender), (1, "b", receiver)]
    addr = {}
    for rank, side, kind in sides:
        if kind == "dpdk":
            addr[rank] = bed.dpdk_addr_a if side == "a" else bed.dpdk_addr
        else:
            addr[rank] = bed.kernel_a if side == "a" else bed.kernel_b
    # GSO trains may cross the veth whole only towards a kernel socket
    bed.set_udp_segmentation("a", receiver == "udp")
    bed.set_udp_segmentation("b", sender == "udp")
    procs = []
    for rank, side, kind in sides:
        argv = ["taskset", "-c", str(rank % (os.cpu_count() or 1))] + WORKER + [
            "--rank", str(rank), "--bind", addr[rank], "--port", str(47300 + rank),
            "--peer", f"{addr[1 - rank]}:{47300 + 1 - rank}", "--bench", str(nbytes),
            "--msg", str(msg), "--verbose", "0", "--timeout", "60", *extra]
        if kind == "dpdk":
            argv += ["--pktio", "dpdk", "--eal", bed.eal_args(side, pmd, huge_dir=huge_dir)]
        procs.append(subprocess.Popen(bed.ns_cmd(side, argv), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    recs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise RuntimeError("a bench rank timed out")
        line = [l for l in out.splitlines() if l.startswith("{")]
        if p.returncode != 0 or not line:
            raise RuntimeError(f"bench rank failed ({p.returncode}): {err[-2000:]}")
        recs.append(json.loads(line[-1]))
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", default="256M", help="payload per run (default 256M)")
    ap.add_argument("--msg", default="1M", help="message size (default 1M)")
    ap.add_argument("--runs", type=int, default=3, help="runs per cell; the best is kept")
    ap.add_argument("--pmd", default="af_packet", choices=["af_packet", "af_xdp"])
    ap.add_argument("--json", help="append one record per cell to this file")
    ap.add_argument("--latency", action="store_true",
                    help="instead: 1-byte round trips back to back and 5 ms apart, and the "
                         "CPU share of an idle rank")
    a = ap.parse_args(argv)
    # a terminated run still removes its namespaces and hugepages (finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from erdmampi.testing import dpdkbed
    why = dpdkbed.dpdk_available()
    if why:
        sys.exit(f"bench/pktio: {why}")
    nbytes, msg = parse_size(a.bytes), parse_size(a.msg)
    hz = nominal_hz()
    if a.latency:
        return latency(a)
    cells = [("udp", "udp"), ("udp", "dpdk"), ("dpdk", "udp"), ("dpdk", "dpdk")]
    results = {c: None for c in cells}
    huge = dpdkbed.Hugepages(96).open() if a.pmd == "af_xdp" else None
    try:
        with dpdkbed.DpdkBed(prefix="erbp") as bed:
            # alternate the cells run by run: the machine's speed drifts
            for _ in range(a.runs):
                for cell in cells:
                    recs = run_once(bed, *cell, nbytes, msg, huge.dir if huge else None, a.pmd)
                    best = results[cell]
                    if best is None or recs[1]["wall"] < best[1]["wall"]:
                        results[cell] = recs
    finally:
        if huge:
            huge.close()
    print(f"# {format_size(nbytes)} in {format_size(msg)} messages, best of {a.runs}, "
          f"PMD {a.pmd}, nominal clock {hz / 1e9:.2f} GHz")
    print(f"{'sender -> receiver':<20} {'MB/s':>8} {'sender kpps':>12} {'recv kpps':>10} "
          f"{'send cyc/B':>11} {'recv cyc/B':>11}")
    for cell in cells:
        s, r = results[cell]
        wall = r["wall"]
        row = dict(sender=cell[0], receiver=cell[1], pmd=a.pmd, bytes=r["bytes"], wall=wall,
                   mbps=r["bytes"] / wall / 1e6,
                   send_kpps=(s["pkts_sent"] + s["pkts_recv"]) / s["wall"] / 1e3,
                   recv_kpps=(r["pkts_sent"] + r["pkts_recv"]) / wall / 1e3,
                   send_cpb=s["cpu"] * hz / s["bytes"], recv_cpb=r["cpu"] * hz / r["bytes"],
                   send_cpu=s["cpu"], recv_cpu=r["cpu"])
        print(f"{cell[0] + ' -> ' + cell[1]:<20} {row['mbps']:8.1f} {row['send_kpps']:12.1f} "
              f"{row['recv_kpps']:10.1f} {row['send_cpb']:11.2f} {row['recv_cpb']:11.2f}")
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")


def latency(a):
    """Round-trip times (median, p90) and an idle rank's CPU share per cell."""
    from erdmampi.testing import dpdkbed
    cells = [("udp", "udp"), ("udp", "dpdk"), ("dpdk", "dpdk")]
    print(f"# 1-byte round trips (rank 0 asks, rank 1 answers), PMD {a.pmd}; idle: 3 s")
    print(f"{'rank0 - rank1':<16} {'RTT med us':>10} {'p90':>8} {'5ms-gap med':>12} {'p90':>8} "
          f"{'idle CPU r0':>12} {'r1':>6}")
    with dpdkbed.DpdkBed(prefix="erbl") as bed:
        for cell in cells:
            busy = run_once(bed, *cell, 1, 1, pmd=a.pmd, extra=["--pingpong", "2000"])
            gap = run_once(bed, *cell, 1, 1, pmd=a.pmd,
                           extra=["--pingpong", "200", "--gap", "0.005", "--idle", "3"])
            row = dict(cell="-".join(cell), pmd=a.pmd, rtt_us=busy[0]["rtt_median_us"],
                       rtt_p90_us=busy[0]["rtt_p90_us"], gap_rtt_us=gap[0]["rtt_median_us"],
                       gap_rtt_p90_us=gap[0]["rtt_p90_us"], idle_cpu0=gap[0]["idle_cpu_share"],
                       idle_cpu1=gap[1]["idle_cpu_share"])
            print(f"{cell[0] + ' - ' + cell[1]:<16} {row['rtt_us']:10.1f} {row['rtt_p90_us']:8.1f} "
                  f"{row['gap_rtt_us']:12.1f} {row['gap_rtt_p90_us']:8.1f} "
                  f"{row['idle_cpu0'] * 100:11.1f}% {row['idle_cpu1'] * 100:5.1f}%")
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
