"""ICE-style candidates and connectivity checks (RFC 8445 in spirit).

* :func:`gather` collects a rank's candidates through its port: ``host`` (the
  port's address), ``srflx`` (STUN Binding to each configured STUN server) and
  ``relay`` (a TURN allocation).  The result is a JSON-able record:
  ``{"ufrag", "pwd", "candidates": [{"type", "addr", "port", "priority"}], ...}``.
* :class:`IceSession` is the sans-I/O check state machine for one peer: it is
  fed requests/responses and the time, and gives the requests to send.  Checks
  run in both directions at once with short-term credentials (USERNAME
  ``"remoteufrag:localufrag"``, MESSAGE-INTEGRITY keyed with the remote pwd on
  requests and with the local pwd on responses), retransmitted with a doubling
  RTO for at most ``check_timeout`` seconds per pair; incoming checks from an
  unknown address add a peer-reflexive candidate and a triggered check.  The
  lower rank is *controlling*: it picks the best working pair (direct pairs beat
  relayed ones) and nominates it with USE-CANDIDATE; the other side takes the
  pair it was nominated on.
* A local "base" is either ``"sock"`` (the port itself: host/srflx candidates)
  or ``"relay"`` (sending through the TURN allocation).

:func:`erdmampi.nat.agent.establish` drives sessions with every peer over one port.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
import time
from dataclasses import dataclass, field

from erdmampi.nat import NatError, stun
from erdmampi.nat.port import route_source, socket_families
from erdmampi.nat.stun import ATTR, Message, StunError

__all__ = ["PairResult", "IceSession", "gather", "stun_binding", "candidate_priority",
           "pair_priority", "TYPE_PREF", "LocalAgent", "validate_record"]

TYPE_PREF = {"host": 126, "prflx": 110, "srflx": 100, "relay": 0}


def candidate_priority(ctype: str, local_pref: int = 65535, component: int = 1) -> int:
    """RFC 8445 5.1.2.1: ``2^24*type + 2^8*local + (256 - component)``."""
    return (TYPE_PREF[ctype] << 24) | ((local_pref & 0xFFFF) << 8) | (256 - component)


def pair_priority(controlling: int, controlled: int) -> int:
    """RFC 8445 6.1.2.3."""
    g, d = controlling, controlled
    return (min(g, d) << 32) + 2 * max(g, d) + (1 if g > d else 0)


@dataclass
class PairResult:
    """The path chosen to one peer."""
    #: our side's candidate type: "host", "srflx", "prflx" (as the peer saw us) or "relay"
    local_type: str
    #: where to send: the peer's address (its relay address when ``remote_type`` is "relay")
    remote_addr: str
    remote_port: int
    #: True when we send through our own TURN allocation (wrap in ChannelData)
    via_relay: bool
    #: the channel bound to (remote_addr, remote_port) on our TURN server (relay only)
    channel: "int | None" = None
    #: our TURN server (relay only)
    turn_server: "tuple[str, int] | None" = None
    #: the peer's candidate type: "host", "srflx", "prflx" or "relay"
    remote_type: str = "host"
    #: round-trip time of the last successful check, seconds
    rtt: "float | None" = None

    @property
    def direct(self) -> bool:
        """No TURN relay on either side."""
        return not self.via_relay and self.remote_type != "relay"

    def describe(self) -> str:
        how = "direct" if self.direct else "relay"
        return (f"{how} {self.local_type}->{self.remote_type} "
                f"{self.remote_addr}:{self.remote_port}")


# ---- gathering --------------------------------------------------------------------

def stun_binding(port, server, timeout=1.5, rto=0.1, backlog=None) -> "tuple[str, int] | None":
    """Our mapped address as ``server`` sees it (one Binding transaction, retransmitted),
    or None after ``timeout``.  Other datagrams go to ``backlog`` (a list) if given."""
    res = binding_many(port, [server], timeout, rto, backlog)
    return res.get(_addr(server))


def binding_many(port, servers, timeout=1.5, rto=0.1, backlog=None, turn=None
                 ) -> "dict[tuple[str, int], tuple[str, int]]":
    """STUN Binding to several servers at once; ``{server: mapped}`` for those that
    answered within ``timeout``.  With ``turn`` (a TurnClient), its Allocate runs
    while the bindings are outstanding."""
    servers = [_addr(s) for s in servers]
    reqs = {s: Message(stun.BINDING) for s in servers}
    tids = {m.tid: s for s, m in reqs.items()}
    data = {s: m.encode() for s, m in reqs.items()}
    got: "dict[tuple[str, int], tuple[str, int]]" = {}
    start = time.monotonic()
    deadline = start + timeout
    next_send, cur = start, rto
    turn_err = None

    def take(payload, addr):
        if stun.is_stun(payload):
            try:
                m = stun.decode(payload)
            except StunError:
                m = None
            if m is not None and m.is_response and m.tid in tids:
                s = tids[m.tid]
                if m.cls == stun.SUCCESS and _addr(addr) == s:
                    try:
                        mapped = m.mapped_address()
                    except StunError:
                        mapped = None
                    if mapped is not None:
                        got[s] = mapped
                return
        if backlog is not None:
            backlog.append((payload, addr))

    first = True
    while len(got) < len(servers):
        now = time.monotonic()
        if now >= deadline:
            break
        if now >= next_send:
            for s in servers:
                if s not in got:
                    port.send(data[s], s)
            next_send = now + cur
            cur = min(cur * 2, 0.5)
            if first and turn is not None:
                first = False
                try:
                    turn.allocate()
                except NatError as e:
                    turn_err = e
                while turn.backlog:
                    take(*turn.backlog.popleft())
                continue
        r = port.recv(max(0.0, min(next_send, deadline) - time.monotonic()))
        if r is not None:
            take(*r)
    if turn is not None and first:
        try:
            turn.allocate()
        except NatError as e:
            turn_err = e
        while turn.backlog:
            take(*turn.backlog.popleft())
    if turn is not None:
        binding_many.last_turn_error = turn_err
    return got


binding_many.last_turn_error = None


def _addr(a) -> "tuple[str, int]":
    return str(a[0]), int(a[1])


def _family(host: str) -> int:
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return 0


@dataclass
class LocalAgent:
    """What :func:`gather` learned: credentials, candidates and the TURN client."""
    ufrag: str
    pwd: str
    candidates: "list[dict]"
    turn: object = None                 #: TurnClient with an allocation, or None
    stun_asked: "list[tuple[str, int]]" = field(default_factory=list)
    stun_answered: "list[tuple[str, int]]" = field(default_factory=list)
    turn_error: "str | None" = None
    backlog: list = field(default_factory=list)   #: datagrams read while gathering

    @property
    def host_addr(self) -> "tuple[str, int] | None":
        for c in self.candidates:
            if c["type"] == "host":
                return c["addr"], c["port"]
        return None

    @property
    def host_addrs(self) -> "list[tuple[str, int]]":
        """Every host candidate (one per address family on a dual-stack socket)."""
        return [(c["addr"], c["port"]) for c in self.candidates if c["type"] == "host"]

    def record(self, rank=None) -> dict:
        rec = {"ufrag": self.ufrag, "pwd": self.pwd, "candidates": list(self.candidates),
               "stun_answered": len(self.stun_answered), "stun_asked": len(self.stun_asked),
               "turn": self.turn is not None}
        if rank is not None:
            rec["rank"] = int(rank)
        return rec


def gather(port, stun_servers=(), turn=None, timeout=1.5, host_addresses=None) -> LocalAgent:
    """Gather candidates through ``port``.

    :param stun_servers: ``[(host, port), ...]`` asked for server-reflexive addresses.
    :param turn: a :class:`~erdmampi.nat.turn.TurnClient` (not yet allocated) or None.
    :param host_addresses: host candidate addresses when the port is bound to a
        wildcard (default: the address routing toward the first STUN/TURN server,
        and on a dual-stack socket the one toward the first server of each
        address family).
    Servers of an address family the port cannot reach are not asked.
    """
    la = LocalAgent(ufrag=secrets.token_hex(4), pwd=secrets.token_urlsafe(18), candidates=[])
    host, lport = port.local_address()
    fams = socket_families(host)
    stun_servers = [s for s in stun_servers if _family(str(s[0])) in fams]
    if host in ("0.0.0.0", "::", ""):
        if host_addresses:
            hosts = list(host_addresses)
        else:
            servers = list(stun_servers) + ([turn.server] if turn is not None else [])
            hosts = []
            for fam in (4, 6):
                probe = [sv for sv in servers if _family(str(sv[0])) == fam][:1]
                src = route_source(*probe[0]) if probe and fam in fams else None
                if src and _family(src) == fam:
                    hosts.append(src)
    else:
        hosts = [host]
    seen = set()

    def add(ctype, addr, pref=65535, **extra):
        key = (addr[0], int(addr[1]))
        if key in seen:
            return
        seen.add(key)
        la.candidates.append({"type": ctype, "addr": key[0], "port": key[1],
                              "priority": candidate_priority(ctype, pref), **extra})

    for i, h in enumerate(hosts):
        add("host", (h, lport), 65535 - i)
    la.stun_asked = [_addr(s) for s in stun_servers]
    got = binding_many(port, la.stun_asked, timeout=timeout, backlog=la.backlog, turn=turn)
    la.stun_answered = [s for s in la.stun_asked if s in got]
    hosts_seen = {(c["addr"], c["port"]): c for c in la.candidates}
    for i, s in enumerate(la.stun_asked):
        if s in got:
            if _addr(got[s]) in hosts_seen:       # not behind a NAT: the host is public
                hosts_seen[_addr(got[s])]["public"] = True
            add("srflx", got[s], 65535 - i)
    if turn is not None:
        err = binding_many.last_turn_error
        if turn.relayed is not None:
            # over TCP/TLS the mapped address is a TCP mapping: no UDP candidate
            if turn.mapped is not None and getattr(turn, "transport", "udp") == "udp":
                add("srflx", turn.mapped, 65535 - len(la.stun_asked))
            add("relay", turn.relayed)
            la.turn = turn
        else:
            la.turn_error = str(err) if err else "allocation failed"
    return la


def validate_record(rec, who="peer") -> dict:
    """Check a peer's record (from the rendezvous) and return it normalised;
    raises NatError naming what is wrong."""
    if not isinstance(rec, dict):
        raise NatError(f"{who}: NAT record is not a dict: {type(rec).__name__}")
    for k in ("ufrag", "pwd"):
        if not isinstance(rec.get(k), str) or not rec[k] or ":" in rec[k] and k == "ufrag":
            raise NatError(f"{who}: NAT record has no valid {k!r}")
    cands = rec.get("candidates")
    if not isinstance(cands, list):
        raise NatError(f"{who}: NAT record has no candidate list")
    out = []
    for c in cands:
        try:
            t, a, p, pr = c["type"], str(c["addr"]), int(c["port"]), int(c["priority"])
            ipaddress.ip_address(a)
        except (KeyError, TypeError, ValueError):
            raise NatError(f"{who}: malformed candidate {c!r}") from None
        if t not in TYPE_PREF or not 0 < p < 65536 or not 0 <= pr < 2 ** 32:
            raise NatError(f"{who}: malformed candidate {c!r}")
        out.append({"type": t, "addr": a, "port": p, "priority": pr,
                    "public": bool(c.get("public", t != "host"))})
    return {**rec, "candidates": out}


# ---- checks -----------------------------------------------------------------------

WAITING, INPROGRESS, SUCCEEDED, FAILED = "waiting", "in-progress", "succeeded", "failed"


@dataclass
class Pair:
    base: str                   # "sock" | "relay"
    local_type: str             # "host" | "relay"
    local_prio: int
    remote: "tuple[str, int]"
    remote_type: str
    remote_prio: int
    priority: int = 0
    state: str = WAITING
    tid: "bytes | None" = None
    data: bytes = b""
    sent_at: float = 0.0
    next_send: float = 0.0
    rto: float = 0.0
    deadline: float = 0.0
    nominating: bool = False
    mapped: "tuple[str, int] | None" = None
    rtt: "float | None" = None

    @property
    def relayed(self) -> bool:
        return self.base == "relay" or self.remote_type == "relay"

    def describe(self):
        return f"{self.local_type}->{self.remote_type} {self.remote[0]}:{self.remote[1]}"


class IceSession:
    """Connectivity checks with one peer (sans-I/O).

    :param local: our :class:`LocalAgent`.
    :param remote: the peer's record (validated).
    :param controlling: True on the side that nominates (the lower rank).
    :param now: the current time (``time.monotonic()``).
    """

    def __init__(self, my_rank, peer_rank, local: LocalAgent, remote: dict, controlling: bool,
                 now: float, *, check_timeout=4.0, timeout=15.0, settle=0.2, pace=0.02,
                 rto=0.1, max_rto=0.5, nominate_timeout=2.0, relay_wait=2.0):
        self.my_rank, self.peer_rank = my_rank, peer_rank
        self.local, self.remote = local, remote
        self.controlling = controlling
        self.check_timeout, self.settle, self.pace = check_timeout, settle, pace
        self.rto0, self.max_rto, self.nominate_timeout = rto, max_rto, nominate_timeout
        self.relay_wait = relay_wait
        self.start = now
        self.deadline = now + timeout
        self.tiebreaker = os.urandom(8)
        self.pairs: "list[Pair]" = []
        self.triggered: "list[Pair]" = []
        self.next_pace = now
        self.first_success: "float | None" = None
        self.nominated: "Pair | None" = None
        self.selected: "Pair | None" = None
        self.state = "running"          # running | done | failed
        self.error: "str | None" = None
        self.requests_seen = 0
        self.bad_integrity = 0
        self._hosts = set(local.host_addrs)
        self._srflx = {(c["addr"], c["port"]) for c in local.candidates if c["type"] == "srflx"}
        host_prio = candidate_priority("host")
        # the socket reaches the families of its host candidates (both on a
        # dual-stack socket); a relay only its relayed address's family
        fams = {_family(h[0]) for h in self._hosts} or {4}
        bases = [("sock", "host", host_prio, fams)]
        relay = [c for c in local.candidates if c["type"] == "relay"]
        if relay and local.turn is not None and local.turn.relayed is not None:
            bases.append(("relay", "relay", relay[0]["priority"], {_family(relay[0]["addr"])}))
        for c in remote["candidates"]:
            raddr = (c["addr"], c["port"])
            for base, ltype, lprio, bfams in bases:
                if _family(c["addr"]) not in bfams:
                    continue
                if base == "relay" and not c["public"]:
                    continue        # a TURN server cannot reach private addresses (and
                                    # coturn drops the allocation on ENETUNREACH)
                self._add_pair(base, ltype, lprio, raddr, c["type"], c["priority"])
        self.pairs.sort(key=lambda p: -p.priority)

    # -- queries
    @property
    def done(self) -> bool:
        return self.state != "running"

    def result(self) -> PairResult:
        p = self.selected
        if p is None:
            raise NatError(self.error or f"rank {self.my_rank}: no path to rank {self.peer_rank}")
        if p.base == "relay":
            ltype = "relay"
        elif p.mapped is None or p.mapped in self._hosts:
            ltype = "host"
        elif p.mapped in self._srflx:
            ltype = "srflx"
        else:
            ltype = "prflx"
        return PairResult(local_type=ltype, remote_addr=p.remote[0], remote_port=p.remote[1],
                          via_relay=p.base == "relay", remote_type=p.remote_type, rtt=p.rtt,
                          turn_server=(self.local.turn.server if p.base == "relay" else None))

    def next_time(self) -> float:
        if self.done:
            return float("inf")
        t = self.deadline
        for p in self.pairs:
            if p.state == INPROGRESS:
                t = min(t, p.next_send, p.deadline)
        if self.triggered or any(p.state == WAITING for p in self.pairs):
            t = min(t, self.next_pace)
        if self.controlling and self.first_success is not None and self.nominated is None:
            ok = [p for p in self.pairs if p.state == SUCCEEDED]
            if ok:
                best = max(ok, key=lambda p: (not p.relayed, p.priority))
                t = min(t, self.start + self.relay_wait if best.relayed
                        else self.first_success + self.settle)
        return t

    # -- events
    def poll(self, now: float) -> "list[tuple[Pair, bytes]]":
        """Requests due now (new checks, retransmits, a nomination)."""
        out = []
        if self.done:
            return out
        if now >= self.deadline:
            self._fail(now, "timed out")
            return out
        if self.controlling and self.nominated is None:
            p = self._choose(now)
            if p is not None:
                self.nominated = p
                p.nominating = True
                self._send_new(p, now, self.nominate_timeout)
                out.append((p, p.data))
        for p in self.pairs:
            if p.state != INPROGRESS:
                continue
            if now >= p.deadline:
                p.state = FAILED
                if p is self.nominated:
                    p.nominating = False
                    self.nominated = None
                continue
            if now >= p.next_send:
                out.append((p, p.data))
                p.next_send = now + p.rto
                p.rto = min(p.rto * 2, self.max_rto)
        if now >= self.next_pace:
            nxt = None
            while self.triggered and nxt is None:
                c = self.triggered.pop(0)
                if c.state in (WAITING, FAILED):
                    nxt = c
            if nxt is None:
                nxt = next((p for p in self.pairs if p.state == WAITING), None)
            if nxt is not None:
                self._send_new(nxt, now, self.check_timeout)
                out.append((nxt, nxt.data))
                self.next_pace = now + self.pace
        self._check_failed(now)
        return out

    def on_request(self, msg: Message, base: str, src, now: float) -> "bytes | None":
        """An authenticated Binding request from the peer (integrity checked by the
        caller) arrived on ``base`` from ``src``: the response to send back."""
        src = _addr(src)
        self.requests_seen += 1
        pair = self._find(base, src)
        if pair is None and not self.done:
            prio = msg.u32(ATTR.PRIORITY) or candidate_priority("prflx")
            lprio = (candidate_priority("relay") if base == "relay"
                     else candidate_priority("host"))
            pair = self._add_pair(base, "relay" if base == "relay" else "host", lprio,
                                  src, "prflx", prio)
            self.pairs.sort(key=lambda p: -p.priority)
        if pair is not None and not self.done and pair.state in (WAITING, FAILED):
            if pair.state == FAILED:
                pair.state = WAITING
            self.triggered.append(pair)
        if (not self.controlling and msg.has(ATTR.USE_CANDIDATE) and pair is not None
                and self.selected is None):
            self.selected = pair
            self.state = "done"
        resp = Message(stun.BINDING, stun.SUCCESS, msg.tid)
        resp.add_address(ATTR.XOR_MAPPED_ADDRESS, src)
        return resp.encode(key=self.local.pwd.encode())

    def on_response(self, msg: Message, pair: Pair, base: str, src, now: float) -> None:
        """A response (integrity checked by the caller) to ``pair``'s current check."""
        if pair.state != INPROGRESS or msg.tid != pair.tid:
            return
        if msg.cls == stun.ERROR or base != pair.base or _addr(src) != pair.remote:
            pair.state = FAILED
            if pair is self.nominated:
                pair.nominating = False
                self.nominated = None
            return
        pair.state = SUCCEEDED
        pair.rtt = now - pair.sent_at
        try:
            pair.mapped = msg.address(ATTR.XOR_MAPPED_ADDRESS)
        except StunError:
            pair.mapped = None
        if self.first_success is None:
            self.first_success = now
        if pair.nominating:
            self.selected = pair
            self.state = "done"

    # -- private
    def _add_pair(self, base, ltype, lprio, raddr, rtype, rprio) -> Pair:
        p = Pair(base, ltype, lprio, raddr, rtype, rprio)
        g, d = (lprio, rprio) if self.controlling else (rprio, lprio)
        p.priority = pair_priority(g, d)
        self.pairs.append(p)
        return p

    def _find(self, base, remote) -> "Pair | None":
        for p in self.pairs:
            if p.base == base and p.remote == remote:
                return p
        return None

    def _send_new(self, p: Pair, now: float, limit: float):
        m = Message(stun.BINDING)
        m.add_text(ATTR.USERNAME, f"{self.remote['ufrag']}:{self.local.ufrag}")
        m.add_u32(ATTR.PRIORITY, candidate_priority("prflx") if p.base == "sock"
                  else p.local_prio)
        m.add(ATTR.ICE_CONTROLLING if self.controlling else ATTR.ICE_CONTROLLED,
              self.tiebreaker)
        if p.nominating:
            m.add(ATTR.USE_CANDIDATE)
        p.tid = m.tid
        p.data = m.encode(key=self.remote["pwd"].encode())
        p.state = INPROGRESS
        p.sent_at = now
        p.rto = self.rto0
        p.next_send = now + p.rto
        p.rto = min(p.rto * 2, self.max_rto)
        p.deadline = now + limit

    def _choose(self, now) -> "Pair | None":
        ok = [p for p in self.pairs if p.state == SUCCEEDED]
        if not ok:
            return None
        best = max(ok, key=lambda p: (not p.relayed, p.priority))
        pending_better = any(p.state in (WAITING, INPROGRESS) and p.priority > best.priority
                             and (best.relayed or not p.relayed) for p in self.pairs)
        if best.relayed:
            pending_direct = any(p.state in (WAITING, INPROGRESS) and not p.relayed
                                 for p in self.pairs) or any(
                not p.relayed and p.state in (WAITING, FAILED) for p in self.triggered)
            if pending_direct and now < self.start + self.relay_wait:
                return None
            return best
        if not pending_better or now >= self.first_success + self.settle:
            return best
        return None

    def _check_failed(self, now):
        if self.done:
            return
        active = any(p.state in (WAITING, INPROGRESS, SUCCEEDED) for p in self.pairs) \
            or self.triggered
        if active:
            return
        if not self.controlling and self.requests_seen and now < self.deadline:
            return                      # the peer reaches us: its nomination may come
        self._fail(now, "every check timed out")

    def _fail(self, now, why):
        self.state = "failed"
        self.error = why
