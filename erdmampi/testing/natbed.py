"""A NAT test bed in network namespaces: sites behind routers that do NAT with
nftables, joined by a 'public' bridge that also holds STUN/TURN (coturn).
Needs root, ``ip``, ``nft`` (and ``turnserver`` for :meth:`NatBed.start_turn`,
``conntrack`` for :meth:`NatBed.cut_path` with ``flush``).  See docs/nat.md.

::

    from erdmampi.testing.natbed import NatBed

    with NatBed(["full_cone", "symmetric"]) as bed:
        turn = bed.start_turn()                  # coturn on 198.18.0.1 and .2, port 3478
        a, b = bed.port(0), bed.port(1)          # SocketPorts inside the sites' hosts
        ...

Topology (every namespace name carries the bed's tag ``erdnat-<pid>-<n>``)::

    pub ns: bridge br0  198.18.0.1/24, 198.18.0.2/24 (STUN/TURN services)
      |-- veth -- router ns of site i: "wan" 198.18.0.<k>  (one address per host for
      |            full_cone), "lan" bridge 10.251.<i>.1/24 -- veth -- host ns <i>.<j>
      |            eth0 10.251.<i>.<2+j>, default route via the router
      `-- veth -- host ns of a ``none`` site: eth0 198.18.0.<k> (public, no router)

NAT kinds (router ``nft`` table ``natbed``):

* ``none``: the host has a public address.
* ``full_cone``: static 1:1 NAT (snat + dnat of one public address per host):
  endpoint-independent mapping *and* filtering, ports kept.
* ``port_restricted``: ``masquerade`` (conntrack keeps the source port, so the
  mapping is endpoint-independent); only replies to an earlier outbound packet
  come in (address-and-port-dependent filtering) -- hole punching needed.
* ``symmetric``: ``masquerade fully-random``: a new random port per destination.
* ``udp_blocked``: the router drops all forwarded UDP (TCP still masqueraded).
* ``v6_only``: the host has a public IPv6 address and no IPv4 at all.

With ``ipv6=True`` (implied by a ``v6_only`` site) the public bridge also
carries IPv6 (``fd00:198:18::/64``, no NAT, as IPv6 sites usually are): the
services get ``fd00:198:18::1`` and ``::2`` besides their IPv4 addresses,
and the hosts of ``none`` sites an IPv6 address besides their IPv4 one
(dual-stack).  Sites behind NATs stay IPv4-only.

Unsolicited UDP to a router's own address is dropped in its input hook, so the
conntrack entry it would create is never confirmed and cannot steal the port a
later outbound mapping wants (a known Linux hole-punching pitfall).
"""
from __future__ import annotations

import ctypes
import itertools
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from erdmampi.testing.wan import WanBedError, _kill_ns, _run, kill_group

__all__ = ["NatBed", "NatBedError", "KINDS", "natbed_available", "cleanup_stale",
           "socket_in_netns"]

KINDS = ("none", "full_cone", "port_restricted", "symmetric", "udp_blocked", "v6_only")
_PREFIX = "erdnat"
_counter = itertools.count()
_CLONE_NEWNET = 0x40000000
PUBLIC_NET = "198.18.0"           # /24 inside 198.18.0.0/15 (RFC 2544 benchmarking)
SERVICE_IPS = (f"{PUBLIC_NET}.1", f"{PUBLIC_NET}.2")
PUBLIC_NET6 = "fd00:198:18:"      # ULA /64 of the public bridge, when the bed has IPv6
SERVICE_IPS6 = (f"{PUBLIC_NET6}:1", f"{PUBLIC_NET6}:2")
TURN_USER, TURN_PASSWORD, TURN_REALM = "natuser", "natpass", "natbed"


class NatBedError(WanBedError):
    """A bed command failed (the message carries the command and its stderr)."""


def natbed_available(turn: bool = False) -> "str | None":
    """None when a bed can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "the NAT bed needs root (network namespaces)"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install -y iproute2 nftables)"
    if turn and shutil.which("turnserver") is None:
        return "turnserver not found (apt-get install -y coturn)"
    try:
        _run(["ip", "netns", "list"], timeout=10)
    except (OSError, WanBedError, subprocess.TimeoutExpired) as e:
        return f"ip netns unavailable: {e}"
    return None


def cleanup_stale() -> "list[str]":
    """Delete namespaces left by beds whose process is gone (after a SIGKILL)."""
    removed = []
    out = _run(["ip", "netns", "list"], check=False, timeout=10).stdout
    for line in out.splitlines():
        ns = line.split()[0] if line.strip() else ""
        m = re.match(rf"{_PREFIX}-(\d+)-", ns)
        if not m or Path(f"/proc/{m.group(1)}").exists():
            continue
        _kill_ns(ns)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    return removed


_libc = None


def socket_in_netns(ns: str, family=socket.AF_INET, type=socket.SOCK_DGRAM) -> socket.socket:
    """A socket created inside network namespace ``ns`` (it stays there; this
    process's other threads are not moved).  Done in a short-lived thread that
    ``setns()``-es itself."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    result = {}

    def work():
        try:
            fd = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({ns}): {os.strerror(err)}")
            finally:
                os.close(fd)
            result["sock"] = socket.socket(family, type)
        except BaseException as e:      # reported in the caller's thread
            result["err"] = e

    t = threading.Thread(target=work, name=f"setns-{ns}")
    t.start()
    t.join()
    if "err" in result:
        raise result["err"]
    return result["sock"]


class Host:
    """One host of a site: its namespace and addresses."""

    def __init__(self, site, index, ns, addr, public, addr6=None):
        self.site, self.index, self.ns, self.addr = site, index, ns, addr
        self.public = public        #: the public address its NAT maps it to (None: masquerade)
        self.addr6 = addr6          #: its IPv6 address (None: IPv4 only)

    def __repr__(self):
        return f"Host(site={self.site}, {self.index}, {self.addr}, ns={self.ns})"


class NatBed:
    """Sites behind NATs of the given kinds, a public bridge and services.

    :param kinds: one NAT kind per site (see :data:`KINDS`).
    :param hosts: hosts per site (an int for all sites, or a list).
    :param ipv6: IPv6 on the public bridge and at ``none`` sites (see the module doc).
    """

    def __init__(self, kinds, hosts=1, ipv6=False):
        kinds = list(kinds)
        if not kinds:
            raise ValueError("a NAT bed needs at least one site")
        for k in kinds:
            if k not in KINDS:
                raise ValueError(f"NAT kind {k!r} unknown; choose from {', '.join(KINDS)}")
        nh = [int(hosts)] * len(kinds) if isinstance(hosts, int) else [int(h) for h in hosts]
        if len(nh) != len(kinds) or any(not 1 <= h <= 50 for h in nh):
            raise ValueError("hosts: 1..50 per site, one entry per site")
        if sum(nh) + len(kinds) > 200:
            raise ValueError("too many hosts and routers for one /24 public network")
        self.kinds = kinds
        self.ipv6 = bool(ipv6) or "v6_only" in kinds
        self.tag = f"{_PREFIX}-{os.getpid()}-{next(_counter)}"
        self.pub_ns = f"{self.tag}-pub"
        self.router_ns = [None if k in ("none", "v6_only") else f"{self.tag}-r{i}"
                          for i, k in enumerate(kinds)]
        self.hosts: "list[list[Host]]" = []
        nxt = itertools.count(10)
        self.router_public: "list[str | None]" = []
        for i, k in enumerate(kinds):
            site = []
            rpub = None if k in ("none", "v6_only") else f"{PUBLIC_NET}.{next(nxt)}"
            self.router_public.append(rpub)
            for j in range(nh[i]):
                ns = f"{self.tag}-h{i}-{j}"
                if k == "v6_only":
                    a = f"{PUBLIC_NET6}:{next(nxt):x}"
                    site.append(Host(i, j, ns, a, a, addr6=a))
                elif k == "none":
                    k4 = next(nxt)
                    a = f"{PUBLIC_NET}.{k4}"
                    site.append(Host(i, j, ns, a, a,
                                     addr6=f"{PUBLIC_NET6}:{k4:x}" if self.ipv6 else None))
                elif k == "full_cone":
                    pub = rpub if j == 0 else f"{PUBLIC_NET}.{next(nxt)}"
                    site.append(Host(i, j, ns, f"10.251.{i}.{2 + j}", pub))
                else:
                    site.append(Host(i, j, ns, f"10.251.{i}.{2 + j}", rpub))
            self.hosts.append(site)
        self._procs: "list[subprocess.Popen]" = []
        self._ports: list = []
        self.tmpdir: "Path | None" = None
        self.turn_server: "tuple[str, int] | None" = None
        self._closed = True

    # -- names and addresses
    @property
    def namespaces(self) -> "list[str]":
        return [self.pub_ns, *[r for r in self.router_ns if r],
                *[h.ns for site in self.hosts for h in site]]

    def host(self, site, index=0) -> Host:
        return self.hosts[site][index]

    @property
    def stun_servers(self) -> "list[tuple[str, int]]":
        """The STUN servers (coturn's two listening addresses, and its IPv6 one
        when the bed has IPv6) once started."""
        if self.turn_server is None:
            return []
        ips = SERVICE_IPS + (SERVICE_IPS6[:1] if self.ipv6 else ())
        return [(ip, self.turn_server[1]) for ip in ips]

    def public_address(self, site, index=0) -> "str":
        """The address peers see for this host (router's or its own)."""
        return self.hosts[site][index].public

    # -- lifecycle
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self):
        why = natbed_available()
        if why:
            raise NatBedError(why)
        cleanup_stale()
        self._closed = False
        try:
            self.tmpdir = Path(tempfile.mkdtemp(prefix=f"{self.tag}-"))
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self):
        for ns in self.namespaces:
            _run(["ip", "netns", "add", ns])
        quiet = ("for f in all default; do echo 1 > /proc/sys/net/ipv6/conf/$f/disable_ipv6; "
                 "done 2>/dev/null; ip link set lo up")
        routers = [r for r in self.router_ns if r]
        v6 = set()
        if self.ipv6:
            v6 = {self.pub_ns, *[h.ns for site in self.hosts for h in site if h.addr6]}
        for ns in self.namespaces:
            extra = ""
            if ns in v6:    # IPv6 on, and no router advertisements to wait for
                extra = ("; for f in all default; do echo 0 > /proc/sys/net/ipv6/conf/$f/"
                         "disable_ipv6; echo 0 > /proc/sys/net/ipv6/conf/$f/accept_ra; done")
            if ns in routers:
                extra = ("; echo 1 > /proc/sys/net/ipv4/ip_forward && "
                         "echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter && "
                         "echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter")
            _run(["ip", "netns", "exec", ns, "sh", "-c", quiet + extra])
        create = []
        batch = {ns: [] for ns in self.namespaces}
        batch[self.pub_ns] += ["link add br0 type bridge", "link set br0 up",
                               *[f"addr add {ip}/24 dev br0" for ip in SERVICE_IPS]]
        if self.ipv6:
            batch[self.pub_ns] += [f"addr add {ip}/64 dev br0 nodad" for ip in SERVICE_IPS6]
        for i, kind in enumerate(self.kinds):
            r = self.router_ns[i]
            if r is None:
                for h in self.hosts[i]:
                    pv = f"p{i}x{h.index}"
                    create.append(f"link add name eth0 netns {h.ns} type veth "
                                  f"peer name {pv} netns {self.pub_ns}")
                    batch[self.pub_ns] += [f"link set {pv} master br0", f"link set {pv} up"]
                    if h.addr != h.addr6:
                        batch[h.ns].append(f"addr add {h.addr}/24 dev eth0")
                    if h.addr6:
                        batch[h.ns].append(f"addr add {h.addr6}/64 dev eth0 nodad")
                    batch[h.ns].append("link set eth0 up")
                continue
            pv = f"p{i}"
            create.append(f"link add name wan netns {r} type veth peer name {pv} "
                          f"netns {self.pub_ns}")
            batch[self.pub_ns] += [f"link set {pv} master br0", f"link set {pv} up"]
            pubs = [self.router_public[i]]
            pubs += [h.public for h in self.hosts[i] if h.public not in pubs]
            batch[r] += [*[f"addr add {a}/24 dev wan" for a in pubs], "link set wan up",
                         "link add lan type bridge", "link set lan up",
                         f"addr add 10.251.{i}.1/24 dev lan"]
            for h in self.hosts[i]:
                hv = f"h{h.index}"
                create.append(f"link add name eth0 netns {h.ns} type veth "
                              f"peer name {hv} netns {r}")
                batch[r] += [f"link set {hv} master lan", f"link set {hv} up"]
                batch[h.ns] += [f"addr add {h.addr}/24 dev eth0", "link set eth0 up",
                                f"route add default via 10.251.{i}.1"]
        _run(["ip", "-batch", "-"], input="\n".join(create) + "\n")
        for ns, cmds in batch.items():
            if cmds:
                _run(["ip", "-n", ns, "-batch", "-"], input="\n".join(cmds) + "\n")
        for i, kind in enumerate(self.kinds):
            if self.router_ns[i]:
                _run(["ip", "netns", "exec", self.router_ns[i], "nft", "-f", "-"],
                     input=self._nft_rules(i, kind))

    def _nft_rules(self, i, kind) -> str:
        pre, post, fwd = [], [], []
        if kind == "full_cone":
            for h in self.hosts[i]:
                pre.append(f'iifname "wan" ip daddr {h.public} dnat to {h.addr}')
                post.append(f'oifname "wan" ip saddr {h.addr} snat to {h.public}')
        elif kind == "symmetric":
            post.append('oifname "wan" masquerade fully-random')
        else:       # port_restricted, udp_blocked
            post.append('oifname "wan" masquerade')
        if kind in ("port_restricted", "symmetric", "udp_blocked"):
            fwd += ['iifname "wan" ct state established,related accept',
                    'iifname "wan" drop']
        if kind == "udp_blocked":
            fwd.insert(0, "meta l4proto udp drop")

        def chain(name, kind_, hook, prio, rules):
            body = "".join(f"    {r};\n" for r in rules)
            return (f"  chain {name} {{\n    type {kind_} hook {hook} priority {prio}; "
                    f"policy accept;\n{body}  }}\n")
        return ("table ip natbed {\n"
                + chain("nat_pre", "nat", "prerouting", "dstnat", pre)
                + chain("nat_post", "nat", "postrouting", "srcnat", post)
                + chain("filter_fwd", "filter", "forward", "filter", fwd)
                + chain("filter_in", "filter", "input", "filter",
                        ['iifname "wan" meta l4proto udp drop'])
                + chain("cutoff", "filter", "forward", "-10", [])   # cut_path() adds here
                + "}\n")

    def close(self):
        """Close ports, kill the bed's processes by PID, delete its namespaces.
        Safe to call twice; runs on ``with`` exit, also after an exception."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for p in self._ports:
            try:
                p.close()
            except OSError:
                pass
        for p in self._procs:
            self._kill_proc(p)
        for ns in self.namespaces:
            if Path(f"/var/run/netns/{ns}").exists():
                _kill_ns(ns)
                p = _run(["ip", "netns", "del", ns], check=False)
                if p.returncode != 0:
                    errors.append(p.stderr.strip())
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
        if errors:
            raise NatBedError("teardown: " + "; ".join(errors))

    _kill_proc = staticmethod(kill_group)

    # -- running things
    def _ns(self, where) -> str:
        """``"pub"``, ``("router", i)``, ``(site, j)`` or a Host -> namespace name."""
        if where == "pub":
            return self.pub_ns
        if isinstance(where, Host):
            return where.ns
        if isinstance(where, tuple) and where[0] == "router":
            ns = self.router_ns[where[1]]
            if ns is None:
                raise ValueError(f"site {where[1]} ({self.kinds[where[1]]}) has no router")
            return ns
        if isinstance(where, int):
            return self.hosts[where][0].ns
        site, j = where
        return self.hosts[site][j].ns

    def popen(self, where, argv, **kw) -> subprocess.Popen:
        """Start ``argv`` in a namespace (see :meth:`_ns`); killed on close."""
        kw.setdefault("stdin", subprocess.DEVNULL)
        p = subprocess.Popen(["ip", "netns", "exec", self._ns(where), *map(str, argv)],
                             start_new_session=True, **kw)
        self._procs.append(p)
        return p

    def run(self, where, argv, timeout=30, check=True, input=None):
        """Run ``argv`` to completion in a namespace; CompletedProcess (text)."""
        return _run(["ip", "netns", "exec", self._ns(where), *map(str, argv)],
                    check=check, timeout=timeout, input=input)

    def socket(self, where, bind=None, port=0) -> socket.socket:
        """A UDP socket inside a namespace, bound to ``bind`` (default: the host's
        address) and ``port``."""
        if bind is None:
            bind = "0.0.0.0" if where == "pub" else self._host_of(where).addr
        s = socket_in_netns(self._ns(where), socket.AF_INET6 if ":" in bind else socket.AF_INET)
        s.bind((bind, port))
        return s

    def port(self, site, index=0, port=0):
        """A :class:`~erdmampi.nat.port.SocketPort` on a host of ``site``."""
        from erdmampi.nat.port import SocketPort
        p = SocketPort(sock=self.socket((site, index), port=port))
        self._ports.append(p)
        return p

    def _host_of(self, where) -> Host:
        if isinstance(where, Host):
            return where
        if isinstance(where, int):
            return self.hosts[where][0]
        return self.hosts[where[0]][where[1]]

    # -- services
    def start_turn(self, port=3478, user=TURN_USER, password=TURN_PASSWORD, realm=TURN_REALM,
                   extra=(), timeout=15.0, tls_port=None) -> "tuple[str, int]":
        """Start coturn in the public namespace, listening on both service addresses
        (two STUN servers for mapping tests) and relaying from the first one; UDP
        and TCP on ``port``, and with ``tls_port`` TLS over TCP there too (a
        self-signed certificate for the service addresses: :meth:`tls_cert`).
        Returns ``(host, port)`` of the TURN server; ready when this returns.  The
        first server started becomes :attr:`turn_server` (and :attr:`stun_servers`)."""
        if shutil.which("turnserver") is None:
            raise NatBedError("turnserver not found (apt-get install -y coturn)")
        pidfile = self.tmpdir / "turnserver.pid"
        log = self.tmpdir / "turnserver.log"
        if tls_port:
            cert, key = self.tls_cert()
            tls = [f"--tls-listening-port={tls_port}", f"--cert={cert}", f"--pkey={key}"]
        else:
            tls = ["--no-tls"]
        listen = SERVICE_IPS + (SERVICE_IPS6[:1] if self.ipv6 else ())
        peers6 = ([f"--allowed-peer-ip={PUBLIC_NET6}:0-{PUBLIC_NET6}:ffff"]
                  if self.ipv6 else [])
        argv = ["turnserver", "-n", *[f"--listening-ip={ip}" for ip in listen],
                f"--relay-ip={SERVICE_IPS[0]}", f"--listening-port={port}",
                "--lt-cred-mech", f"--user={user}:{password}", f"--realm={realm}",
                "--no-cli", *tls, "--no-dtls", "--log-file=stdout", "--simple-log",
                "--min-port=49160", "--max-port=49999", f"--pidfile={pidfile}",
                f"--userdb={self.tmpdir / 'turndb'}", "--fingerprint",
                f"--allowed-peer-ip={PUBLIC_NET}.0-{PUBLIC_NET}.255", *peers6, *extra]
        f = open(log, "w")
        try:
            p = self.popen("pub", argv, stdout=f, stderr=subprocess.STDOUT)
        finally:
            f.close()
        server = (SERVICE_IPS[0], port)
        if self.turn_server is None:        # the first one is the bed's default
            self.turn_server = server
            self.turn_credentials = (user, password, realm)
        # ready when every listening address answers a STUN Binding request
        from erdmampi.nat import stun
        deadline = time.monotonic() + timeout
        for ip in listen:
            s = self.socket("pub", bind="::" if ":" in ip else "0.0.0.0")
            try:
                while True:
                    if p.poll() is not None:
                        raise NatBedError(f"turnserver exited ({p.returncode}): "
                                          f"{log.read_text(errors='replace')[-2000:]}")
                    if time.monotonic() > deadline:
                        raise NatBedError(f"turnserver did not answer STUN on {ip}:{port} "
                                          f"within {timeout} s")
                    req = stun.Message(stun.BINDING)
                    s.sendto(req.encode(), (ip, port))
                    s.settimeout(0.2)
                    try:
                        data, _ = s.recvfrom(2048)
                        if stun.decode(data).tid == req.tid:
                            break
                    except (socket.timeout, stun.StunError, ConnectionRefusedError):
                        pass
            finally:
                s.close()
        return server

    def tls_cert(self) -> "tuple[str, str]":
        """``(certificate, key)`` files of a self-signed certificate for the service
        addresses (IP subjectAltNames; made with openssl once per bed).  The
        certificate is also its own CA file for clients."""
        cert, key = self.tmpdir / "turn-cert.pem", self.tmpdir / "turn-key.pem"
        if not cert.exists():
            if shutil.which("openssl") is None:
                raise NatBedError("openssl not found")
            san = ",".join(f"IP:{ip}" for ip in SERVICE_IPS)
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                            "-subj", "/CN=natbed-turn", "-addext", f"subjectAltName={san}",
                            "-keyout", str(key), "-out", str(cert)],
                           check=True, capture_output=True)
        return str(cert), str(key)

    def turn_log(self) -> str:
        f = self.tmpdir / "turnserver.log" if self.tmpdir else None
        return f.read_text(errors="replace") if f and f.exists() else ""

    # -- faults
    def cut_path(self, site, index=0, flush=True, drop=True):
        """Cut a host off mid-run: ``drop`` all its forwarded traffic at its router (or,
        for a ``none`` site, in the host itself) and ``flush`` its NAT mappings
        (conntrack entries) so a later packet gets a fresh mapping."""
        h = self.hosts[site][index]
        r = self.router_ns[site]
        if drop:
            if r is None:
                _run(["ip", "netns", "exec", h.ns, "nft", "-f", "-"],
                     input=("table ip natcut {\n  chain o {\n    type filter hook output "
                            "priority 0; policy accept;\n    oifname \"eth0\" drop;\n  }\n"
                            "  chain i {\n    type filter hook input priority 0; policy "
                            "accept;\n    iifname \"eth0\" drop;\n  }\n}\n"))
            else:
                for sel in ("saddr", "daddr"):
                    _run(["ip", "netns", "exec", r, "nft", "add", "rule", "ip", "natbed",
                          "cutoff", "ip", sel, h.addr, "drop"])
        if flush and r is not None:
            if shutil.which("conntrack") is None:
                raise NatBedError("conntrack not found (apt-get install -y conntrack)")
            for opt in ("--orig-src", "--reply-src"):
                _run(["ip", "netns", "exec", r, "conntrack", "-D", opt, h.addr], check=False)

    def shape_uplink(self, site, rate_bit, queue_bytes=None):
        """Limit what a NATed site sends to the public network to ``rate_bit``
        bits per second (tbf on its router's public side, so every flow leaving
        the site shares it: the bottleneck a home or campus uplink is); a false
        ``rate_bit`` removes the limit.  ``queue_bytes``: the tbf queue (default
        25 ms of the rate, at least 64 KiB)."""
        r = self.router_ns[site]
        if r is None:
            raise NatBedError(f"site {site} ({self.kinds[site]}) has no router to shape")
        if not rate_bit:
            _run(["tc", "-n", r, "qdisc", "del", "dev", "wan", "root"], check=False)
            return
        rate_bit = int(rate_bit)
        if rate_bit <= 0:
            raise ValueError("rate_bit must be positive")
        bps = rate_bit / 8
        burst = max(3028, int(bps * 0.001))               # 1 ms of tokens
        limit = int(queue_bytes) if queue_bytes else max(64 << 10, int(bps * 0.025))
        _run(["tc", "-n", r, "qdisc", "replace", "dev", "wan", "root", "tbf",
              "rate", f"{rate_bit}bit", "burst", str(burst), "limit", str(limit)])

    def restore_path(self, site, index=0):
        """Undo :meth:`cut_path`'s drop rules (mappings stay flushed)."""
        h = self.hosts[site][index]
        r = self.router_ns[site]
        if r is None:
            _run(["ip", "netns", "exec", h.ns, "nft", "delete", "table", "ip", "natcut"],
                 check=False)
        else:
            _run(["ip", "netns", "exec", r, "nft", "flush", "chain", "ip", "natbed", "cutoff"])

    def conntrack(self, site) -> str:
        """The router's conntrack table (``conntrack -L``), for debugging."""
        return self.run(("router", site), ["conntrack", "-L"], check=False).stdout
