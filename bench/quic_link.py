"""One-way throughput over an emulated link: erdmampi's engine vs iperf3 TCP.

Builds two network namespaces joined by a veth pair, shapes both directions
with tbf (``--rate``), drops packets at random with nftables (``--loss``, in
both directions, on the receiving side of each namespace), then measures

* ``quic``  the engine (``erdmampi._engine``) sending ``--msg``-byte messages
  from rank 1 (namespace B) to rank 0 (namespace A) for ``--time`` seconds,
  several in flight, and
* ``tcp-cubic`` / ``tcp-bbr``  one iperf3 TCP stream B -> A for as long,

each link setting in turn, and prints one JSON record per measurement plus a
table.  Needs root.  Everything it creates is torn down on exit, also on
errors; net.ipv4.tcp_allowed_congestion_control is restored.  Only addresses
in 10.213.0.0/24 inside the namespaces are used.

    python -m bench.quic_link --rate 100mbit,1gbit --loss 0,1,3 --time 8
    python -m bench.quic_link --cc bbr2 --env ERDMA_DATA_STREAMS=1 ...

``--cc`` and ``--env NAME=VALUE`` (the ERDMA_* tuning variables of
docs/design.md) are passed to the engine ranks (the engine's own defaults
otherwise), so configurations can be compared on the same link.
A delay line is not built here (this kernel has no netem): RTT is the veth's.
"""
import argparse
import inspect
import json
import os
import secrets
import subprocess
import sys
import time

ADDR_A, ADDR_B = "10.213.0.1", "10.213.0.2"
PORT_A, PORT_B = 47001, 47002
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _run(*args, check=True, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, check=check, **kw)


def rate_bits(text):
    t = text.lower().strip()
    for suffix, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if t.endswith(suffix):
            return int(float(t[:-len(suffix)]) * scale)
    return int(t)


class Link:
    """Two namespaces, a veth pair, tbf on both ends, random loss on both ingresses."""

    def __init__(self, mtu=0):
        self.mtu = mtu
        tag = secrets.token_hex(3)
        self.a, self.b = f"qla{tag}", f"qlb{tag}"
        self.dev_a, self.dev_b = f"qa{tag}", f"qb{tag}"

    def __enter__(self):
        try:
            _run("ip", "netns", "add", self.a)
            _run("ip", "netns", "add", self.b)
            _run("ip", "link", "add", self.dev_a, "netns", self.a, "type", "veth",
                 "peer", "name", self.dev_b, "netns", self.b)
            for ns, dev, addr in ((self.a, self.dev_a, ADDR_A), (self.b, self.dev_b, ADDR_B)):
                _run("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
                if self.mtu:
                    _run("ip", "-n", ns, "link", "set", dev, "mtu", str(self.mtu))
                _run("ip", "-n", ns, "link", "set", dev, "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def shape(self, rate, loss_pct, queue_ms=20):
        """rate in bit/s (0: unshaped); loss in percent (0: none)."""
        for ns, dev in ((self.a, self.dev_a), (self.b, self.dev_b)):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if rate:
                burst = max(16000, rate // 8 // 500)          # 2 ms worth
                limit = max(64000, rate // 8 * queue_ms // 1000)
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                     "rate", str(rate), "burst", str(burst), "limit", str(limit))
            _run("ip", "netns", "exec", ns, "nft", "delete", "table", "inet", "qloss",
                 check=False)
            if loss_pct:
                per_million = int(round(loss_pct * 10000))
                rules = ("table inet qloss {\n chain in {\n"
                         "  type filter hook input priority 0; policy accept;\n"
                         f"  iifname \"{dev}\" numgen random mod 1000000 < {per_million} drop\n"
                         " }\n}\n")
                subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules,
                               text=True, check=True, capture_output=True)

    def __exit__(self, *exc):
        for ns in (self.a, self.b):
            _run("ip", "netns", "del", ns, check=False)

    def cmd(self, site, argv):
        return ["ip", "netns", "exec", (self.a, self.b)[site], *argv]

    def addr(self, site):
        return (ADDR_A, ADDR_B)[site]


def wan_bed_class(path=""):
    """erdmampi.testing.wan.WanBed (sites joined through a router by delay
    lines), from the package or from the file ``path``; None if unavailable."""
    if path:
        import importlib.util
        spec = importlib.util.spec_from_file_location("_wan_bed", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_wan_bed"] = mod
        spec.loader.exec_module(mod)
        return mod.WanBed
    try:
        from erdmampi.testing.wan import WanBed
    except ImportError:
        return None
    return WanBed


class DelayLink:
    """The same interface over a WanBed with two sites and a one-way delay."""

    def __init__(self, bed_class, rate, loss_pct, delay_ms):
        self.bed = bed_class(sites=2, rate=rate, delay_ms=delay_ms, loss=loss_pct / 100)

    def __enter__(self):
        self.bed.start()
        return self

    def __exit__(self, *exc):
        self.bed.close()

    def cmd(self, site, argv):
        return self.bed.ns_cmd(site, argv)

    def addr(self, site):
        return self.bed.addr(site)


# ------------------------------------------------------------------ quic
def _cpu_secs():
    """CPU time of this process so far (all threads: the engine's too)."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker(args):
    """One rank (run inside its namespace): 1 sends, 0 receives and reports."""
    import numpy as np

    from erdmampi import _engine as E

    rank = args.rank
    addrs, ports = args.addrs.split(","), (PORT_A, PORT_B)
    opts = {"rank": rank, "size": 2, "bind": addrs[rank], "port": ports[rank],
            "connect_timeout": 20.0, "idle_timeout": 30.0}
    # a benchmark pair exchanges no fingerprints (older trees: no such argument)
    if "insecure" in inspect.signature(E.Engine.create).parameters:
        opts["insecure"] = True
    if args.cc:
        opts["cc"] = args.cc
    # the engine's tuning variables (ERDMA_DATA_STREAMS, ERDMA_CHUNK, windows...) as a
    # launched rank would read them
    from erdmampi import bootstrap
    for name, var in getattr(bootstrap, "_TUNING_ENV", {}).items():  # (older trees: none)
        value = bootstrap._env_size(var)
        if value is not None:
            opts[name] = value
    opts["verbose"] = int(os.environ.get("ERDMA_VERBOSE", "0") or 0)
    # read by bootstrap apart from the tuning table: without this, --env
    # ERDMA_MAX_UDP_PAYLOAD=... would not reach the ranks
    opts["max_udp_payload"] = int(os.environ.get("ERDMA_MAX_UDP_PAYLOAD", "0") or 0)
    eng = E.Engine.create(**opts)
    other = 1 - rank
    eng.set_peer(other, addrs[other], ports[other], "")
    eng.connect()
    n = args.msg
    depth = 4
    bufs = [np.zeros(n, np.uint8) for _ in range(depth)]
    tok = np.zeros(8, np.uint8)
    deadline = 30 + 3 * args.time
    cpu0 = _cpu_secs()
    if rank == 1:
        for b in bufs:
            b[:] = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
        eng.recv(E.buffer_pointer(tok), 8, 0, 9, 0)  # the receiver is ready
        t0 = time.monotonic()
        reqs, i = [], 0
        while time.monotonic() - t0 < args.time:
            if len(reqs) == depth:
                reqs.pop(0).wait(deadline)
            reqs.append(eng.isend(E.buffer_pointer(bufs[i % depth]), n, 0, 1, 0))
            i += 1
        for r in reqs:
            r.wait(deadline)
        eng.send(E.buffer_pointer(tok), 8, 0, 2, 0)  # stop
        eng.recv(E.buffer_pointer(tok), 8, 0, 9, 0)
        print(json.dumps({"cpu": _cpu_secs() - cpu0, "wall": time.monotonic() - t0}), flush=True)
    else:
        reqs = [eng.irecv(E.buffer_pointer(b), n, 1, E.ANY_TAG, 0) for b in bufs]
        eng.send(E.buffer_pointer(tok), 8, 1, 9, 0)
        total, k, t0, t_last = 0, 0, None, None
        while True:
            st = reqs[k % depth].wait(deadline)
            if st.error:
                raise SystemExit(f"receive failed: {E.strerror(st.error)}")
            if st.tag == 2:
                break
            now = time.monotonic()
            if t0 is None:
                t0 = now  # timed from the first complete message
            else:
                total += st.nbytes
            t_last = now
            reqs[k % depth] = eng.irecv(E.buffer_pointer(bufs[k % depth]), n, 1, E.ANY_TAG, 0)
            k += 1
        for r in reqs:
            r.cancel()
        eng.send(E.buffer_pointer(tok), 8, 1, 9, 0)
        secs = (t_last - t0) if t0 is not None and t_last > t0 else float("nan")
        print(json.dumps({"bytes": total, "secs": secs, "mbit": total * 8 / secs / 1e6,
                          "cpu_recv": _cpu_secs() - cpu0, "stats": eng.stats()}), flush=True)
    eng.shutdown(5.0)


def run_quic(link, args):
    env = dict(os.environ)
    for kv in args.env:
        k, _, v = kv.partition("=")
        env[k] = v
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    # by file, so that PYTHONPATH (not the current directory) picks erdmampi
    base = [sys.executable, os.path.abspath(__file__), "--worker", "--msg", str(args.msg),
            "--time", str(args.time), "--addrs", f"{link.addr(0)},{link.addr(1)}"]
    base += ["--cc", args.cc] if args.cc else []
    recv = subprocess.Popen(link.cmd(0, [*base, "--rank", "0"]), cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    send = subprocess.Popen(link.cmd(1, [*base, "--rank", "1"]), cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = recv.communicate(timeout=60 + 4 * args.time)
        out1, err1 = send.communicate(timeout=30)
        if os.environ.get("QL_STDERR"):
            sys.stderr.write(err + err1)
    except subprocess.TimeoutExpired:
        for p in (recv, send):
            p.kill()
            p.wait()
        return {"error": "timeout"}
    line = [ln for ln in out.splitlines() if ln.startswith("{")]
    if recv.returncode or not line:
        return {"error": (err or out)[-400:]}
    rec = json.loads(line[-1])
    sline = [ln for ln in out1.splitlines() if ln.startswith("{")]
    if sline:  # the ranks' CPU use: near 1 core each means CPU-bound
        rec["cpu_send"] = json.loads(sline[-1])["cpu"]
    return rec


def udp_drops(link):
    """UDP datagrams the kernel dropped in both namespaces so far (receive
    buffer full, send buffer full), from /proc/net/snmp."""
    total = {"RcvbufErrors": 0, "SndbufErrors": 0}
    for site in (0, 1):
        p = _run(*link.cmd(site, ["cat", "/proc/net/snmp"]), check=False)
        rows = [ln.split()[1:] for ln in p.stdout.splitlines() if ln.startswith("Udp:")]
        if len(rows) >= 2:
            for k in total:
                if k in rows[0]:
                    total[k] += int(rows[1][rows[0].index(k)])
    return total


# ----------------------------------------------------------------- iperf3
def run_iperf(link, cc, secs):
    srv = subprocess.Popen(link.cmd(0, ["iperf3", "-s", "-1", "-B", link.addr(0)]),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        p = _run(*link.cmd(1, ["iperf3", "-c", link.addr(0), "-t", str(secs), "-C", cc, "-J"]),
                 check=False, timeout=secs + 30)
        rec = json.loads(p.stdout)
        if "error" in rec:
            return {"error": rec["error"]}
        bps = rec["end"]["sum_received"]["bits_per_second"]
        return {"mbit": bps / 1e6, "retransmits": rec["end"]["sum_sent"].get("retransmits")}
    except (subprocess.TimeoutExpired, ValueError, KeyError) as e:
        return {"error": repr(e)}
    finally:
        srv.kill()
        srv.wait()


ALLOWED = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="100mbit,1gbit", help="comma list; 0 = unshaped")
    ap.add_argument("--loss", default="0,1,3", help="comma list of percents")
    ap.add_argument("--time", type=float, default=6.0, help="seconds per measurement")
    ap.add_argument("--msg", type=int, default=4 << 20, help="bytes per engine message")
    ap.add_argument("--stacks", default="quic,tcp-cubic,tcp-bbr")
    ap.add_argument("--cc", default="", help="engine congestion control (default: engine's)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the ranks")
    ap.add_argument("--pythonpath", default="",
                    help="PYTHONPATH of the ranks (compare another build of erdmampi)")
    ap.add_argument("--mtu", type=int, default=0,
                    help="MTU of the veth pair (no delay line only; 0: the default 1500)")
    ap.add_argument("--label", default="", help="name of this engine configuration")
    ap.add_argument("--json", default="", help="append records to this file")
    ap.add_argument("--delay-ms", default="0",
                    help="comma list of one-way delays; > 0 needs erdmampi.testing.wan")
    ap.add_argument("--wan-module", default="", help="path of wan.py (if not in the package)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--addrs", default=f"{ADDR_A},{ADDR_B}", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if os.geteuid() != 0:
        sys.exit("quic_link needs root (network namespaces)")
    stacks = args.stacks.split(",")
    with open(ALLOWED) as f:
        allowed = f.read().strip()
    rows = []
    try:
        if "cubic" not in allowed.split():
            with open(ALLOWED, "w") as f:
                f.write(allowed + " cubic")
        delays = [float(d) for d in args.delay_ms.split(",")]
        bed_class = wan_bed_class(args.wan_module) if max(delays) > 0 else None
        if max(delays) > 0 and bed_class is None:
            sys.exit("--delay-ms needs erdmampi.testing.wan (or --wan-module PATH)")
        for delay in delays:
            for rate in args.rate.split(","):
                for loss in args.loss.split(","):
                    if delay > 0:
                        link = DelayLink(bed_class, rate, float(loss), delay)
                    else:
                        link = Link(mtu=args.mtu)
                    with link:
                        if delay <= 0:
                            link.shape(rate_bits(rate), float(loss))
                        for stack in stacks:
                            if stack == "quic":
                                d0 = udp_drops(link)
                                r = run_quic(link, args)
                                d1 = udp_drops(link)
                                r["udp_drops"] = {k: d1[k] - d0[k] for k in d0}
                            else:
                                r = run_iperf(link, stack.split("-")[1], args.time)
                            rec = {"stack": stack if stack != "quic" else
                                   "quic" + (f"[{args.label}]" if args.label else ""),
                                   "mtu": args.mtu or 1500, "rate": rate, "loss": float(loss), "rtt_ms": 2 * delay, **r}
                            rec.pop("stats", None)
                            rows.append(rec)
                            print(json.dumps(rec), flush=True)
                            if args.json:
                                with open(args.json, "a") as f:
                                    f.write(json.dumps(rec) + "\n")
    finally:
        with open(ALLOWED, "w") as f:
            f.write(allowed)
    print("\n%-22s %-8s %-7s %-6s %10s" % ("stack", "rate", "rtt_ms", "loss%", "Mbit/s"))
    for r in rows:
        print("%-22s %-8s %-7g %-6g %10s" % (r["stack"], r["rate"], r["rtt_ms"], r["loss"],
                                             "%.1f" % r["mbit"] if "mbit" in r else r.get("error")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
