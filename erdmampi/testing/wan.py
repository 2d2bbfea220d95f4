"""A WAN test bed in network namespaces: sites joined through a router over
rate-limited, lossy, delayed links.  Needs root and ``ip`` (iproute2), ``tc``,
``nft`` and a C compiler.  See docs/wan.md.

::

    from erdmampi.testing.wan import WanBed

    with WanBed(sites=2, rate="100mbit", delay_ms=25, loss=0.01) as bed:
        p = bed.run(1, ["iperf3", "-s", "-1"])
        bed.check(0, ["iperf3", "-c", bed.addr(1), "-t", "3"])

Topology (site *i* of N; every name carries the bed's pid-based tag)::

    site i ns                 link i ns                      router ns
    eth0 10.250.i.2/24 ==veth== dla [delayline] dlb ==veth== s<i> 10.250.i.1/24
                                    tbf (uplink) on dlb      tbf (downlink) on s<i>
                                                             nft forward: random loss

A packet from site A to site B crosses two links, so each link delays by
``delay_ms / 2`` in each direction: one-way delay A->B is ``delay_ms`` and the
RTT ``2 * delay_ms`` (plus the bed's own base RTT, ~0.1 ms).  Loss is applied
once per router crossing, so a one-way site-to-site path loses ``loss`` of its
packets.  ``rate`` limits each site's uplink and downlink separately.
"""
from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from erdmampi import config

__all__ = ["WanBed", "Job", "parse_rate", "delayline_binary", "cleanup_stale",
           "bed_available", "WanBedError"]

IFACE = "eth0"          # the site's interface name (same in every site namespace)
_PREFIX = "erdwan"      # namespace names: erdwan-<pid>-<n>-<role>
_counter = itertools.count()
_live: "set[WanBed]" = set()
_CC_SYSCTL = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
_cc_lock = threading.Lock()
# Which beds (by tag, across processes) rely on an algorithm the beds added to the
# global allowed list: the last one to close removes it again.
_CC_STATE = Path(config.get("ERDMA_WAN_STATE"))



def kill_group(p: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM a process group started with start_new_session, SIGKILL after
    ``grace`` seconds; reaps it."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()

class WanBedError(RuntimeError):
    """A test-bed command failed (the message carries the command and its stderr)."""


# ---- helpers ------------------------------------------------------------------

def parse_rate(rate) -> "int | None":
    """Bits per second from ``"100mbit"``, ``"1gbit"``, ``"500kbit"``, ``"1.5gbit"`` or
    a number (bit/s); ``None``/``0`` means unlimited."""
    if rate is None or rate == 0:
        return None
    if isinstance(rate, (int, float)):
        if rate < 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        return int(rate)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmg]?)(bit|bps)?\s*", str(rate).lower())
    if not m:
        raise ValueError(f"rate {rate!r}: expected e.g. '100mbit', '1gbit' or bits per second")
    mult = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2)]
    bits = float(m.group(1)) * mult
    if m.group(3) == "bps":         # tc's unit: bytes per second
        bits *= 8
    return int(bits)


def _run(argv, *, check=True, input=None, timeout=30):
    p = subprocess.run(argv, capture_output=True, text=True, input=input, timeout=timeout)
    if check and p.returncode != 0:
        raise WanBedError(f"{shlex.join(argv)} failed ({p.returncode}): "
                          f"{(p.stderr or p.stdout).strip()}")
    return p


def bed_available() -> "str | None":
    """None when a bed can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the WAN bed needs root (network namespaces)"
    for tool in ("ip", "tc", "nft", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install -y iproute2 nftables util-linux)"
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return "no C compiler (cc) to build the delay line"
    try:
        _run(["ip", "netns", "list"], timeout=10)
    except (OSError, WanBedError, subprocess.TimeoutExpired) as e:
        return f"ip netns unavailable: {e}"
    return None


def _cache_dir() -> Path:
    base = config.get("ERDMA_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "erdmampi"
    home = Path.home()
    if home.is_dir() and os.access(home, os.W_OK):
        return home / ".cache" / "erdmampi"
    return Path(tempfile.gettempdir()) / f"erdmampi-cache-{os.getuid()}"


def delayline_binary() -> Path:
    """Path of the compiled delay line, built with ``cc -O2`` on first use and cached
    by the hash of its source (``$ERDMA_CACHE_DIR``, ``$XDG_CACHE_HOME/erdmampi`` or
    ``~/.cache/erdmampi``)."""
    src = Path(__file__).with_name("delayline.c")
    if not src.is_file():
        raise WanBedError(f"delay line source not found: {src}")
    cc = os.environ.get("CC", "cc")
    flags = ["-O2", "-Wall"]
    digest = hashlib.sha256(src.read_bytes() + " ".join([cc, *flags]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"delayline-{digest}"
    if out.is_file() and os.access(out, os.X_OK):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    p = subprocess.run([cc, *flags, "-o", str(tmp), str(src)], capture_output=True, text=True)
    if p.returncode != 0:
        raise WanBedError(f"compiling {src} failed:\n{p.stderr}")
    os.replace(tmp, out)
    return out


def _ns_path(ns):
    return f"/var/run/netns/{ns}"


def _ns_pids(ns) -> "list[int]":
    p = _run(["ip", "netns", "pids", ns], check=False, timeout=10)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def _kill_ns(ns, grace=1.0):
    """SIGTERM, then SIGKILL, every process living in namespace ``ns``."""
    pids = _ns_pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = _ns_pids(ns)
        if not pids:
            return


def _our_namespaces(pid=None) -> "list[str]":
    p = _run(["ip", "netns", "list"], check=False, timeout=10)
    names = [line.split()[0] for line in p.stdout.splitlines() if line.strip()]
    pre = f"{_PREFIX}-" if pid is None else f"{_PREFIX}-{pid}-"
    return [n for n in names if n.startswith(pre)]


def cleanup_stale() -> "list[str]":
    """Delete namespaces (and kill their processes) left by beds whose process is gone,
    e.g. after a SIGKILL.  Returns the namespaces removed."""
    removed = []
    for ns in _our_namespaces():
        m = re.match(rf"{_PREFIX}-(\d+)-", ns)
        if not m:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or Path(f"/proc/{pid}").exists():
            continue
        _kill_ns(ns)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    if _CC_STATE.exists():
        with _cc_state() as state:      # algorithms added by beds that are all gone
            for algo, tags in list(state.items()):
                if not tags:
                    state.pop(algo)
                    allowed = Path(_CC_SYSCTL).read_text().split()
                    if algo in allowed:
                        Path(_CC_SYSCTL).write_text(" ".join(a for a in allowed if a != algo))
    return removed


def _atexit_close():
    for bed in list(_live):
        try:
            bed.close()
        except Exception:
            pass


atexit.register(_atexit_close)

class _cc_state:
    """Context manager: the shared congestion-control record, locked across
    processes (flock) and threads; entries of beds whose process is gone are
    dropped on read, so a killed bed does not pin an algorithm forever."""

    def __enter__(self):
        import fcntl
        _cc_lock.acquire()
        try:
            self._f = open(_CC_STATE.with_suffix(".lock"), "a+")
            fcntl.flock(self._f, fcntl.LOCK_EX)
            try:
                self.state = json.loads(_CC_STATE.read_text())
            except (OSError, ValueError):
                self.state = {}
        except BaseException:
            _cc_lock.release()
            raise
        for algo, tags in list(self.state.items()):
            alive = [t for t in tags if _tag_alive(t)]
            self.state[algo] = alive
        return self.state

    def __exit__(self, *exc):
        try:
            tmp = _CC_STATE.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.state))
            os.replace(tmp, _CC_STATE)
        finally:
            self._f.close()
            _cc_lock.release()
        return False


def _tag_alive(tag) -> bool:
    m = re.match(rf"{_PREFIX}-(\d+)-", tag)
    return bool(m) and (int(m.group(1)) == os.getpid() and any(b.tag == tag for b in _live)
                        or int(m.group(1)) != os.getpid() and Path(f"/proc/{m.group(1)}").exists())


_prev_sigterm = None


def _on_sigterm(signum, frame):
    """SIGTERM while a bed is up: unwind like Ctrl-C so ``with`` blocks tear down."""
    raise SystemExit(128 + signum)


def _hook_sigterm(on):
    """While beds are live, turn a default-action SIGTERM into SystemExit (main
    thread only; a handler someone else installed is left alone)."""
    global _prev_sigterm
    if threading.current_thread() is not threading.main_thread():
        return
    if on and _prev_sigterm is None and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        _prev_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    elif not on and _prev_sigterm is not None and not _live:
        if signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, _prev_sigterm)
        _prev_sigterm = None


# ---- jobs -----------------------------------------------------------------------

class Job:
    """Processes started together on a bed (one per rank), outputs in files.

    ``wait(timeout)`` returns the exit codes, killing everything on timeout
    (then ``timed_out`` is True); ``outputs()`` gives each process's stdout+stderr.
    """

    def __init__(self, bed, procs, logs, extra=()):
        self.bed, self.procs, self.logs, self.extra = bed, procs, logs, list(extra)
        self.timed_out = False
        self._outs = None

    def wait(self, timeout=120.0) -> "list[int]":
        deadline = time.monotonic() + timeout
        rcs = []
        for p in self.procs:
            left = deadline - time.monotonic()
            try:
                rcs.append(p.wait(max(left, 0.01)))
            except subprocess.TimeoutExpired:
                self.timed_out = True
                self.kill()
                rcs = [q.wait() for q in self.procs]
                break
        self.kill()      # helpers (store server) and anything left
        self._outs = self._read()   # kept: the bed's temp dir goes away on close
        return rcs

    def kill(self):
        for p in [*self.procs, *self.extra]:
            self.bed._kill_proc(p)

    def outputs(self) -> "list[str]":
        """stdout+stderr of each process (so far, before ``wait`` returned)."""
        return list(self._outs) if self._outs is not None else self._read()

    def _read(self):
        return [Path(f).read_text(errors="replace") if Path(f).exists() else ""
                for f in self.logs]

    def check(self, timeout=120.0) -> "list[str]":
        """Wait; raise WanBedError with all outputs unless every process exited 0."""
        rcs = self.wait(timeout)
        outs = self.outputs()
        if self.timed_out or any(rcs):
            detail = "\n".join(f"--- process {i} (rc {rc}) ---\n{o[-3000:]}"
                               for i, (rc, o) in enumerate(zip(rcs, outs)))
            why = f"timed out after {timeout} s" if self.timed_out else f"exit codes {rcs}"
            raise WanBedError(f"job {why}\n{detail}")
        return outs


# ---- the bed --------------------------------------------------------------------

class WanBed:
    """N site namespaces joined through a router namespace (see the module doc).

    :param sites: number of sites (1..200).
    :param rate: bottleneck rate of each site's uplink and downlink (``"100mbit"``,
        ``"1gbit"``, bit/s, or None for unlimited).
    :param delay_ms: one-way delay between two sites in ms (each link adds half).
    :param loss: fraction of packets dropped at each router crossing (0..1).
    :param queue_bytes: tbf queue of each shaped direction; default one
        bandwidth-delay product (rate x RTT), at least 128 KiB.
    :param cc: TCP congestion control set in every site namespace (``"cubic"``,
        ``"bbr"``, ``"reno"``); None keeps the kernel's default.
    :param rt: run the delay lines SCHED_FIFO (default; without it a busy machine
        delays frames by milliseconds now and then).
    :param gro: GRO on the sites' eth0 (default): received frames are merged for
        the site's stack as a real NIC does, after shaping, loss and delay; this
        cuts the receivers' CPU and ACK count.
    :param delayline_args: extra options for the delay line programs (see the
        usage in delayline.c).
    """

    def __init__(self, sites=2, rate="100mbit", delay_ms=0.0, loss=0.0, queue_bytes=None,
                 cc=None, rt=True, gro=True, delayline_args=()):
        if not 1 <= int(sites) <= 200:
            raise ValueError(f"sites must be 1..200, got {sites!r}")
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms!r}")
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss is a fraction in [0, 1), got {loss!r}")
        self.sites = int(sites)
        self.rate = parse_rate(rate)
        self.delay_ms = float(delay_ms)
        self.loss = float(loss)
        rtt_s = 2 * self.delay_ms / 1000
        if queue_bytes is None:
            queue_bytes = max(128 << 10, int((self.rate or 0) / 8 * rtt_s))
        self.queue_bytes = int(queue_bytes)
        self.cc = cc
        self.rt = rt
        self.gro = gro
        self.delayline_args = [str(a) for a in delayline_args]
        self.tag = f"{_PREFIX}-{os.getpid()}-{next(_counter)}"
        self.router_ns = f"{self.tag}-router"
        self.site_ns = [f"{self.tag}-site{i}" for i in range(self.sites)]
        self.link_ns = [f"{self.tag}-link{i}" for i in range(self.sites)]
        self.tmpdir = None
        self._procs: list = []          # every Popen we started (killed on close)
        self._delaylines: list = []
        self.delayline_stats: dict = {}
        self._cc_added: list = []
        self._closed = True

    # -- addresses and commands
    def addr(self, site) -> str:
        """The site's address (on its ``eth0``)."""
        return f"10.250.{self._site(site)}.2"

    def router_addr(self, site=0) -> str:
        """The router's address on its link to ``site``."""
        return f"10.250.{self._site(site)}.1"

    @property
    def config(self) -> dict:
        """The link parameters, for result tables."""
        return {"sites": self.sites, "rate_bps": self.rate, "delay_ms": self.delay_ms,
                "rtt_ms": 2 * self.delay_ms, "loss": self.loss,
                "queue_bytes": self.queue_bytes, "tcp_cc": self.cc}

    @property
    def namespaces(self) -> "list[str]":
        return [*self.site_ns, *self.link_ns, self.router_ns]

    def _site(self, site) -> int:
        if not 0 <= int(site) < self.sites:
            raise IndexError(f"site {site!r} out of range (bed has {self.sites} sites)")
        return int(site)

    def hostname(self, site) -> str:
        """Host name that processes of ``site`` see (each site looks like its own host)."""
        return f"{self.tag}-site{self._site(site)}"

    def ns_cmd(self, site, argv) -> "list[str]":
        """``argv`` prefixed to run in site ``site`` (``"router"`` for the router).
        Site processes also get a UTS namespace whose host name is :meth:`hostname`,
        so MPICH/UCX, gloo and erdmampi take each site for a separate machine."""
        if site == "router":
            return ["ip", "netns", "exec", self.router_ns, *map(str, argv)]
        i = self._site(site)
        return ["ip", "netns", "exec", self.site_ns[i], "unshare", "--uts", "sh", "-c",
                'echo "$0" > /proc/sys/kernel/hostname && exec "$@"', self.hostname(i),
                *map(str, argv)]

    # -- lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self):
        why = bed_available()
        if why:
            raise WanBedError(why)
        binary = delayline_binary()
        cleanup_stale()                 # namespaces of beds whose process was killed
        self._closed = False
        _live.add(self)
        _hook_sigterm(True)
        try:
            self.tmpdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
            self._build(binary)
        except BaseException:
            self.close()
            raise
        return self

    def _build(self, binary):
        n = self.sites
        for ns in self.namespaces:
            _run(["ip", "netns", "add", ns])
        quiet = ("for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; "
                 "done 2>/dev/null; ip link set lo up")
        batch = {ns: [] for ns in self.namespaces}
        create = []
        for i in range(n):
            s, l, r = self.site_ns[i], self.link_ns[i], self.router_ns
            mac_site, mac_rtr = f"02:ea:00:{i:02x}:00:02", f"02:ea:00:{i:02x}:00:01"
            create += [
                f"link add name {IFACE} netns {s} address {mac_site} "
                f"type veth peer name dla netns {l}",
                f"link add name dlb netns {l} type veth peer name s{i} netns {r} address {mac_rtr}",
            ]
            batch[s] += [f"addr add {self.addr(i)}/24 dev {IFACE}", f"link set {IFACE} up",
                         f"route add default via {self.router_addr(i)}",
                         f"neigh replace {self.router_addr(i)} lladdr {mac_rtr} dev {IFACE} "
                         "nud permanent"]
            batch[l] += ["link set dla up", "link set dlb up"]
            batch[r] += [f"addr add {self.router_addr(i)}/24 dev s{i}", f"link set s{i} up",
                         f"neigh replace {self.addr(i)} lladdr {mac_site} dev s{i} nud permanent"]
        # sysctls first so new interfaces come up without IPv6 chatter
        for ns in self.namespaces:
            extra = ""
            if ns == self.router_ns:
                extra = ("; echo 1 > /proc/sys/net/ipv4/ip_forward && "
                         "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter && "
                         "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter")
            _run(["ip", "netns", "exec", ns, "sh", "-c", quiet + extra])
        _run(["ip", "-batch", "-"], input="\n".join(create) + "\n")
        for ns, cmds in batch.items():
            if cmds:
                _run(["ip", "-n", ns, "-batch", "-"], input="\n".join(cmds) + "\n")
        # MTU-sized frames with full checksums on every interface a delay line touches
        for i in range(n):
            _run(["ip", "netns", "exec", self.site_ns[i], str(binary), "--offload-off", IFACE])
            if self.gro:    # merging for the site's own stack, after all shaping
                _run(["ip", "netns", "exec", self.site_ns[i], str(binary), "--gro-on", IFACE])
            _run(["ip", "netns", "exec", self.link_ns[i], str(binary), "--offload-off",
                  "dla", "dlb"])
        _run(["ip", "netns", "exec", self.router_ns, str(binary), "--offload-off",
              *[f"s{i}" for i in range(n)]])
        if self.rate:
            for i in range(n):
                self._tbf(self.link_ns[i], "dlb")           # uplink, after the delay line
                self._tbf(self.router_ns, f"s{i}")        # downlink
        if self.loss > 0:
            k = round(self.loss * 1_000_000)
            rules = ("table inet erdwan {\n"
                     "  chain loss {\n"
                     "    type filter hook forward priority 0; policy accept;\n"
                     f"    numgen random mod 1000000 < {k} counter drop\n"
                     "  }\n"
                     "}\n")
            _run(["ip", "netns", "exec", self.router_ns, "nft", "-f", "-"], input=rules)
        if self.cc:
            self.set_cc(self.cc)
        for i in range(n):
            self._start_delayline(binary, i)

    def _tbf(self, ns, dev):
        bps = self.rate / 8
        burst = max(3028, int(bps * 0.001))               # 1 ms of tokens
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf",
              "rate", f"{self.rate}bit", "burst", str(burst), "limit", str(self.queue_bytes)])

    def _start_delayline(self, binary, i):
        one_way_us = self.delay_ms * 1000 / 2
        bps = (self.rate or 10**10) / 8
        # room for what one direction holds in flight (x2), plus the queue's worth
        qcap = int(min(256 << 20, max(16 << 20, 2 * bps * (one_way_us / 1e6)
                                      + 2 * self.queue_bytes)))
        stats = self.tmpdir / f"delayline{i}.stats"
        argv = ["ip", "netns", "exec", self.link_ns[i], str(binary), "-a", "dla", "-b", "dlb",
                "-d", f"{one_way_us:.3f}", "-q", str(qcap), "-s", str(stats)]
        if self.rt:
            argv += ["-r", "10"]
        argv += self.delayline_args
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        self._delaylines.append((i, p, stats))
        line = _readline_timeout(p.stdout, 10.0)
        if line.strip() != "ready":
            p.kill()
            err = p.stderr.read() if p.poll() is not None else ""
            raise WanBedError(f"delay line of site {i} did not start: {line!r} {err}")

    def set_cc(self, algo, namespaces=None):
        """Set ``net.ipv4.tcp_congestion_control`` in every site namespace (and the
        router's), adding ``algo`` to the global allowed list when it is missing (it is
        removed again on close)."""
        algo = str(algo)
        avail_file = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
        if algo not in avail_file.read_text().split() and shutil.which("modprobe"):
            _run(["modprobe", f"tcp_{algo}"], check=False)
        avail = avail_file.read_text().split()
        if algo not in avail:
            raise WanBedError(f"TCP congestion control {algo!r} not available "
                              f"(kernel offers {' '.join(avail)})")
        with _cc_state() as state:
            allowed = Path(_CC_SYSCTL).read_text().split()
            if algo not in allowed:
                Path(_CC_SYSCTL).write_text(" ".join([*allowed, algo]))
                state[algo] = []
            # an entry means a bed added it (an algorithm allowed from the start has none)
            if algo in state and self.tag not in state[algo]:
                state[algo].append(self.tag)
                self._cc_added.append(algo)
        for ns in (namespaces or [*self.site_ns, self.router_ns]):
            _run(["ip", "netns", "exec", ns, "sh", "-c",
                  f"echo {algo} > /proc/sys/net/ipv4/tcp_congestion_control"])
        self.cc = algo

    def link_bytes(self) -> "list[dict]":
        """Per site: bytes the router sent to it (``down``) and received from it
        (``up``) so far, read from the router's interface counters."""
        out = json.loads(_run(["ip", "-n", self.router_ns, "-j", "-s", "link", "show"]).stdout)
        by = {d["ifname"]: d["stats64"] for d in out}
        return [{"down": by[f"s{i}"]["tx"]["bytes"], "up": by[f"s{i}"]["rx"]["bytes"]}
                for i in range(self.sites)]

    def link_stats(self, reset=False) -> dict:
        """The delay lines' counters now: ``{site: {"ab": {...}, "ba": {...}}}`` ("ab":
        site to router).  Keys: ``rx``, ``tx``, ``tx_bytes``, ``drop_full`` (delay queue
        full), ``drop_tx`` (uplink tbf queue full), ``oversize``, ``cpu_s``, ``sys_s``
        (the process's CPU time) and how late frames left: ``late_p50_us``,
        ``late_p99_us``, ``late_p999_us`` (power-of-two buckets), ``late_max_us``.
        ``reset=True`` zeroes the counters afterwards (per-run figures)."""
        res = {}
        for i, p, stats in self._delaylines:
            if p.poll() is not None:
                raise WanBedError(f"delay line of site {i} exited ({p.returncode})")
            before = stats.stat().st_mtime_ns if stats.exists() else None
            before_ino = stats.stat().st_ino if stats.exists() else None
            p.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                if stats.exists():
                    st = stats.stat()
                    if (st.st_mtime_ns, st.st_ino) != (before, before_ino):
                        break
                time.sleep(0.005)
            else:
                raise WanBedError(f"delay line of site {i} did not report its counters")
            res[i] = _parse_stats(stats.read_text())
            if reset:
                p.send_signal(signal.SIGUSR2)
        return res

    def get_cc(self, site=0) -> str:
        return _run(self.ns_cmd(site, ["cat", "/proc/sys/net/ipv4/tcp_congestion_control"])
                    ).stdout.strip()

    def close(self):
        """Kill every process in the bed's namespaces, delete them, restore sysctls.
        Safe to call twice; runs on ``with`` exit, also after an exception."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for p in self._procs:
            self._kill_proc(p)
        for i, p, stats in self._delaylines:
            try:
                p.send_signal(signal.SIGTERM)
                p.wait(3)
            except (subprocess.TimeoutExpired, OSError):
                p.kill()
                p.wait()
            try:
                self.delayline_stats[i] = _parse_stats(stats.read_text())
            except OSError:
                pass
            for f in (p.stdout, p.stderr):
                if f:
                    f.close()
        for ns in self.namespaces:
            if Path(_ns_path(ns)).exists():
                _kill_ns(ns)
                p = _run(["ip", "netns", "del", ns], check=False)
                if p.returncode != 0:
                    errors.append(p.stderr.strip())
        if self._cc_added:
            with _cc_state() as state:
                for algo in self._cc_added:
                    users = [t for t in state.get(algo, []) if t != self.tag]
                    if users:
                        state[algo] = users
                        continue
                    state.pop(algo, None)
                    allowed = Path(_CC_SYSCTL).read_text().split()
                    if algo in allowed:
                        Path(_CC_SYSCTL).write_text(" ".join(a for a in allowed if a != algo))
            self._cc_added.clear()
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        _live.discard(self)
        _hook_sigterm(False)
        if errors:
            raise WanBedError("teardown: " + "; ".join(errors))

    def _kill_proc(self, p):
        kill_group(p)

    # -- running things
    def run(self, site, argv, env=None, stdout=None, stderr=None, text=True, **kw):
        """Start ``argv`` in site ``site`` (``"router"``: the router) and return its
        ``Popen``; it is killed (with its process group) on close."""
        p = subprocess.Popen(self.ns_cmd(site, argv), env=env, stdout=stdout, stderr=stderr,
                             text=text, start_new_session=True, **kw)
        self._procs.append(p)
        return p

    def check(self, site, argv, env=None, timeout=60, input=None):
        """Run ``argv`` in site ``site`` to completion; return the CompletedProcess,
        raising WanBedError when it fails."""
        p = self.run(site, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL)
        try:
            out, err = p.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_proc(p)
            raise WanBedError(f"{shlex.join(map(str, argv))} in site {site}: "
                              f"timed out after {timeout} s") from None
        if p.returncode != 0:
            raise WanBedError(f"{shlex.join(map(str, argv))} in site {site} failed "
                              f"({p.returncode}): {(err or out).strip()[-2000:]}")
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def placement(self, ranks_per_site=1) -> "list[int]":
        """Site of each rank: block placement, ``ranks_per_site`` consecutive ranks per site."""
        return [s for s in range(self.sites) for _ in range(ranks_per_site)]

    def _start_ranks(self, argvs_envs, name):
        procs, logs = [], []
        for r, (site, argv, env) in enumerate(argvs_envs):
            log = self.tmpdir / f"{name}-{next(_counter)}-rank{r}.log"
            with open(log, "w") as f:
                procs.append(self.run(site, argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL))
            logs.append(log)
        return procs, logs

    @staticmethod
    def _base_env(env):
        e = dict(os.environ)
        e.update(env or {})
        e.setdefault("PYTHONUNBUFFERED", "1")
        return e

    def erdmampi_job(self, argv, ranks_per_site=1, env=None) -> Job:
        """Start an erdmampi job: the rendezvous store in the router namespace, rank *r*
        in site ``r // ranks_per_site`` with the ERDMA_* contract (ERDMA_BIND = the site's
        address, ERDMA_HOST = the site, so ranks of one site share memory)."""
        store = self.run("router", [sys.executable, "-m", "erdmampi.launcher.store_server",
                                    "--host", "0.0.0.0", "--port", "0"],
                         env=self._base_env(env), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        line = _readline_timeout(store.stdout, 30.0)
        m = re.search(r":(\d+)\s*$", line)
        if not m:
            self._kill_proc(store)
            raise WanBedError(f"rendezvous store did not start: {line!r}")
        rdv = f"{self.router_addr(0)}:{m.group(1)}"
        sites = self.placement(ranks_per_site)
        jobid = secrets.token_hex(8)
        secret = secrets.token_hex(32)      # ranks refuse to bootstrap without one
        runs = []
        for r, s in enumerate(sites):
            e = self._base_env(env)
            e.setdefault("ERDMA_JOB_SECRET", secret)
            e.update(ERDMA_RANK=str(r), ERDMA_SIZE=str(len(sites)), ERDMA_RENDEZVOUS=rdv,
                     ERDMA_JOBID=jobid, ERDMA_LOCAL_RANK=str(r % ranks_per_site),
                     ERDMA_LOCAL_SIZE=str(ranks_per_site), ERDMA_BIND=self.addr(s),
                     ERDMA_HOST=self.hostname(s), ERDMA_APPNUM="0",
                     ERDMA_UNIVERSE_SIZE=str(len(sites)))
            runs.append((s, argv, e))
        procs, logs = self._start_ranks(runs, "erdmampi")
        return Job(self, procs, logs, extra=[store])

    def torch_job(self, argv, ranks_per_site=1, env=None, port=29500) -> Job:
        """Start a torch.distributed job (``init_method="env://"``, gloo): MASTER_ADDR is
        site 0's address, GLOO_SOCKET_IFNAME the sites' eth0."""
        sites = self.placement(ranks_per_site)
        runs = []
        for r, s in enumerate(sites):
            e = self._base_env(env)
            e.update(MASTER_ADDR=self.addr(0), MASTER_PORT=str(port), RANK=str(r),
                     WORLD_SIZE=str(len(sites)), LOCAL_RANK=str(r % ranks_per_site),
                     LOCAL_WORLD_SIZE=str(ranks_per_site), GLOO_SOCKET_IFNAME=IFACE,
                     TP_SOCKET_IFNAME=IFACE)
            runs.append((s, argv, e))
        procs, logs = self._start_ranks(runs, "torch")
        return Job(self, procs, logs)

    def mpich_job(self, argv, ranks_per_site=1, env=None, mpiexec="mpiexec") -> Job:
        """Start an MPICH job: hydra's ``mpiexec`` runs in the router namespace and
        starts one proxy per site through a launcher script that does ``ip netns exec``;
        MPICH's UCX device is restricted to TCP on the sites' eth0 (``UCX_TLS=tcp,self``:
        UCX's shared memory would join sites; ranks of one site use TCP over loopback)."""
        script = self.tmpdir / "nsexec.sh"
        cases = "\n".join(f"    {self.addr(i)}) ns={self.site_ns[i]} hn={self.hostname(i)} ;;"
                          for i in range(self.sites))
        script.write_text(
            "#!/bin/sh\n"
            "# hydra calls: nsexec.sh -x HOST COMMAND... (as it would call ssh)\n"
            "while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n"
            "host=$1; shift\n"
            "case \"$host\" in\n"
            f"{cases}\n"
            "    *) echo \"nsexec.sh: unknown host $host\" >&2; exit 255 ;;\n"
            "esac\n"
            "exec ip netns exec \"$ns\" unshare --uts sh -c "
            "'echo \"$0\" > /proc/sys/kernel/hostname && eval \"$1\"' \"$hn\" \"$*\"\n")
        script.chmod(0o755)
        hosts = ",".join(f"{self.addr(i)}:{ranks_per_site}" for i in range(self.sites))
        e = self._base_env(env)
        e.setdefault("UCX_TLS", "tcp,self")   # shm across sites would bypass the bed
        e.setdefault("UCX_NET_DEVICES", IFACE)
        e.setdefault("UCX_WARN_UNUSED_ENV_VARS", "n")
        e.setdefault("MPIR_CVAR_CH4_NETMOD", "ucx")
        cmd = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(script),
               "-localhost", self.router_addr(0), "-hosts", hosts,
               "-n", str(self.sites * ranks_per_site), "-genvall", *argv]
        procs, logs = self._start_ranks([("router", cmd, e)], "mpich")
        return Job(self, procs, logs)

    def ping(self, src, dst, count=20, size=64, interval=0.01, port=7, timeout=10.0):
        """Round-trip times in ms of ``count`` UDP echoes from site ``src`` to site
        ``dst`` (udptool's echo server; lost probes are left out)."""
        srv = self.run(dst, [sys.executable, "-m", "erdmampi.testing.udptool", "echo",
                             "--port", port], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            if _readline_timeout(srv.stdout, 30.0).strip() != "ready":
                raise WanBedError("UDP echo server did not start")
            out = self.check(src, [sys.executable, "-m", "erdmampi.testing.udptool", "ping",
                                   self.addr(dst), "--port", port, "--count", count,
                                   "--size", size, "--interval", interval,
                                   "--timeout", timeout],
                             timeout=timeout + count * interval + 30)
        finally:
            self._kill_proc(srv)
        return json.loads(out.stdout)["rtt_ms"]

    def udp_loss(self, src, dst, count=2000, size=200, pps=2000, port=9):
        """Send ``count`` numbered datagrams from ``src`` to ``dst`` at ``pps`` per
        second; return the fraction that did not arrive."""
        sink = self.run(dst, [sys.executable, "-m", "erdmampi.testing.udptool", "sink",
                              "--port", port, "--count", count,
                              "--idle", 1.0 + 4 * self.delay_ms / 1000],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL)
        try:
            if _readline_timeout(sink.stdout, 30.0).strip() != "ready":
                raise WanBedError("UDP sink did not start")
            self.check(src, [sys.executable, "-m", "erdmampi.testing.udptool", "blast",
                             self.addr(dst), "--port", port, "--count", count,
                             "--size", size, "--pps", pps], timeout=count / pps + 30)
            line = _readline_timeout(sink.stdout, 30.0)
        finally:
            self._kill_proc(sink)
        got = json.loads(line)["received"]
        return 1.0 - got / count


def _readline_timeout(f, timeout) -> str:
    out = []
    t = threading.Thread(target=lambda: out.append(f.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else ""


def _parse_stats(text) -> dict:
    res = {}
    for line in text.splitlines():
        name, *kv = line.split()
        res[name] = {k: float(v) for k, v in (x.split("=") for x in kv)}
    return res
