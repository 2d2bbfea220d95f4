"""Form a full mesh of NAT-traversing paths: :func:`establish`.

::

    res = establish(port, rank, size, publish, fetch, {
        "stun_servers": [("198.18.0.1", 3478)],
        "turn": ("198.18.0.1", 3478, "user", "pass"),     # or None
    })
    res[peer]            # PairResult: direct or through TURN
    res.turn             # TurnClient to keep alive (res.turn.maintain()), or None

Every rank gathers its candidates, publishes its record, fetches every other
rank's record and runs checks with all of them at once over its one port
(responses are matched by transaction id, requests by the sender's ufrag).
The lower rank of each pair is controlling.  Relayed pairs get a TURN channel
bound before :func:`establish` returns; afterwards the port keeps answering
checks until no peer has sent one for ``linger_quiet`` seconds (at most
``linger`` seconds), so that a peer whose nomination response was lost can
still finish.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields

from erdmampi.nat import NatError, stun
from erdmampi.nat.ice import IceSession, PairResult, gather, validate_record
from erdmampi.nat.stun import ATTR, StunError

__all__ = ["establish", "recheck", "open_turn", "NatConfig", "NatResult", "PairResult"]


@dataclass
class NatConfig:
    """Settings of :func:`establish` (a dict with these keys works too)."""
    #: STUN servers asked for server-reflexive candidates
    stun_servers: list = field(default_factory=list)
    #: (host, port, user, password) of a TURN server, or None
    turn: "tuple | None" = None
    #: seconds to wait for STUN answers while gathering
    gather_timeout: float = 1.5
    #: seconds one TURN transaction may take
    turn_timeout: float = 3.0
    #: seconds one candidate pair is checked before it counts as failed
    check_timeout: float = 4.0
    #: seconds the checks with one peer may take in all
    timeout: float = 15.0
    #: seconds a direct pair that works waits for a better one still being checked
    settle: float = 0.2
    #: seconds from the start of checks before a working relayed pair is taken
    #: while direct pairs are still being checked
    relay_wait: float = 2.0
    #: seconds between new checks per peer
    pace: float = 0.02
    #: at most this many seconds the port keeps answering checks after all peers
    #: are done ...
    linger: float = 2.0
    #: ... stopping once no check came in for this long
    linger_quiet: float = 0.25
    #: host candidate addresses when the port is bound to a wildcard address
    host_addresses: "list | None" = None
    #: keep the TURN allocation even when every peer is reached directly, so that
    #: direct paths can fall back to the relay later (``NatResult.turn``)
    keep_turn: bool = False
    #: how the TURN server is reached: "udp", "tcp" or "tls" (TLS over TCP); over
    #: TCP/TLS a :class:`~erdmampi.nat.turn_stream.TurnStreamShim` carries the
    #: datagrams and the relayed address is still UDP
    turn_transport: str = "udp"
    #: CA file that the TLS server's certificate must chain to (default: the system's)
    turn_tls_ca: "str | None" = None
    #: check the TLS server's certificate (False: accept any, e.g. self-signed)
    turn_tls_verify: bool = True

    @classmethod
    def of(cls, cfg) -> "NatConfig":
        if cfg is None:
            return cls()
        if isinstance(cfg, cls):
            return cfg
        if not isinstance(cfg, dict):
            raise TypeError(f"NAT config must be a dict or NatConfig, not {type(cfg).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = set(cfg) - names
        if unknown:
            raise ValueError(f"unknown NAT config keys: {', '.join(sorted(unknown))}")
        c = cls(**cfg)
        c.stun_servers = [(str(h), int(p)) for h, p in c.stun_servers]
        if c.turn is not None:
            if len(c.turn) != 4:
                raise ValueError("turn must be (host, port, user, password)")
            h, p, u, pw = c.turn
            c.turn = (str(h), int(p), str(u), str(pw))
        if c.turn_transport not in ("udp", "tcp", "tls"):
            raise ValueError(f"turn_transport must be udp, tcp or tls, not {c.turn_transport!r}")
        return c


class NatResult(dict):
    """``{peer_rank: PairResult}`` plus :attr:`turn` (the TurnClient that relayed
    pairs depend on: call its ``maintain()`` every ~30 s; None when no pair uses
    it), :attr:`record` (what this rank published) and :attr:`timings`."""
    turn = None
    record: dict = {}
    timings: dict = {}
    rank: "int | None" = None
    local = None                #: our LocalAgent (candidates, credentials)
    records: dict = {}          #: peers' validated records

    def relays(self) -> "list[tuple[int, str, int, int, str, int]]":
        """``(rank, turn_host, turn_port, channel, peer_host, peer_port)`` of every
        peer reached through our own TURN allocation (the arguments of
        ``Engine.set_peer_relay``)."""
        return [(r, *pr.turn_server, pr.channel, pr.remote_addr, pr.remote_port)
                for r, pr in sorted(self.items()) if pr.via_relay]


def establish(port, rank: int, size: int, publish, fetch, cfg=None) -> NatResult:
    """Find a working path from ``rank`` to every other rank; see the module doc.

    :param port: a :class:`~erdmampi.nat.port.DatagramPort` (this function is its only
        reader while it runs).
    :param publish: ``publish(record: dict)`` stores our record for the others.
    :param fetch: ``fetch(r) -> dict`` returns rank r's record (blocking, with a timeout).
    :param cfg: :class:`NatConfig` or a dict of its fields.
    :raises NatError: a peer is unreachable; the message names the cause.
    """
    cfg = NatConfig.of(cfg)
    rank, size = int(rank), int(size)
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} out of range for size {size}")
    t0 = time.monotonic()
    if size == 1:
        res = NatResult()
        res.timings = {"total": 0.0}
        return res
    turn, turn_error = None, None
    if cfg.turn is not None:
        try:
            turn = open_turn(port, cfg)
        except NatError as e:       # e.g. TCP to the server blocked: direct paths may do
            turn_error = str(e)
    try:
        return _establish(port, rank, size, publish, fetch, cfg, turn, t0, turn_error)
    except BaseException:
        if turn is not None:
            turn.close(timeout=0.5)
        raise


def open_turn(port, cfg):
    """A :class:`~erdmampi.nat.turn.TurnClient` for ``cfg.turn`` on ``port`` (not yet
    allocated).  Over TCP/TLS it talks to a :class:`TurnStreamShim` bound to
    loopback, which the port is told about (``port.add_turn_server``, when it has one: the engine must
    know the address its relay traffic comes from).  Raises NatError when the
    server's TCP/TLS listener cannot be reached."""
    from erdmampi.nat.turn import TurnClient
    cfg = NatConfig.of(cfg)
    h, p, u, pw = cfg.turn
    if cfg.turn_transport == "udp":
        return TurnClient(port, (h, p), u, pw, timeout=cfg.turn_timeout)
    from erdmampi.nat.turn_stream import TurnStreamShim, tls_context
    # on loopback: nothing outside this host can send to it (a socket bound to
    # any local address reaches 127.0.0.1, and its answers come back from there)
    local = "::1" if ":" in port.local_address()[0] else "127.0.0.1"
    tls = (tls_context(cfg.turn_tls_ca, cfg.turn_tls_verify)
           if cfg.turn_transport == "tls" else None)
    shim = TurnStreamShim((h, p), cfg.turn_transport, local, tls=tls,
                          connect_timeout=cfg.turn_timeout)
    try:
        register = getattr(port, "add_turn_server", None)
        if register is not None:
            register(shim.address)
        return TurnClient(port, shim.address, u, pw, timeout=cfg.turn_timeout,
                          transport=cfg.turn_transport, shim=shim)
    except BaseException:
        shim.close()
        raise


def _establish(port, rank, size, publish, fetch, cfg, turn, t0, turn_error=None):
    local = gather(port, cfg.stun_servers, turn, cfg.gather_timeout, cfg.host_addresses)
    if turn_error is not None:
        local.turn_error = turn_error
    t_gather = time.monotonic()
    record = local.record(rank)
    publish(record)
    records = {}
    for r in range(size):
        if r != rank:
            rec = validate_record(fetch(r), f"rank {rank}: record of rank {r}")
            if rec.get("rank", r) != r:
                raise NatError(f"rank {rank}: the NAT record fetched for rank {r} "
                               f"says it is rank {rec['rank']}")
            records[r] = rec
    t_fetch = time.monotonic()
    if local.turn is not None:
        # only the relayed address's family: TURN refuses a permission request
        # that names the other one (443, peer address family mismatch)
        v6 = local.turn.relayed is not None and ":" in str(local.turn.relayed[0])
        ips = {(c["addr"], 0) for rec in records.values() for c in rec["candidates"]
               if c["public"] and (":" in str(c["addr"])) == v6}
        try:
            local.turn.create_permission(sorted(ips))
        except NatError:
            pass                                # relay pairs will just fail
    res, failures, loop = _check(port, rank, local, records, cfg)
    t_checks = time.monotonic()
    _linger(loop, cfg)
    keep = cfg.keep_turn or any(pr.via_relay for pr in res.values())
    if local.turn is not None and not keep:
        local.turn.close()
    res.turn = local.turn if keep else None
    res.record = record
    res.rank, res.local, res.records = rank, local, records
    res.timings = {"gather": t_gather - t0, "fetch": t_fetch - t_gather,
                   "checks": t_checks - t_fetch, "total": time.monotonic() - t0}
    if failures:
        msgs = [_explain(rank, r, s, local, records[r], cfg) if isinstance(s, IceSession)
                else f"rank {rank}: no working path to rank {r}: {s}" for r, s in failures]
        raise NatError("; ".join(msgs))
    return res


def recheck(port, res: NatResult, peers, cfg=None) -> NatResult:
    """Run the connectivity checks again with ``peers`` (e.g. after a path died),
    reusing the candidates and records of ``res`` (from :func:`establish`); the
    peers must call it for us at the same time.  Relay candidates work only while
    the allocations behind them are alive (``res.turn``).  Returns
    ``{peer: PairResult}`` and updates ``res``; raises NatError like
    :func:`establish`."""
    cfg = NatConfig.of(cfg)
    if res.local is None:
        raise NatError("recheck needs the result of establish()")
    peers = sorted(set(int(p) for p in peers))
    unknown = [p for p in peers if p not in res.records]
    if unknown:
        raise ValueError(f"recheck: unknown peers {unknown}")
    local = res.local
    if local.turn is not None and local.turn.relayed is None:
        local.turn = None           # released after establish(): no relay base
    t0 = time.monotonic()
    new, failures, loop = _check(port, res.rank, local,
                                 {p: res.records[p] for p in peers}, cfg)
    _linger(loop, cfg)
    if failures:
        raise NatError("; ".join(
            _explain(res.rank, r, s, local, res.records[r], cfg) if isinstance(s, IceSession)
            else f"rank {res.rank}: no working path to rank {r}: {s}" for r, s in failures))
    res.update(new)
    if local.turn is not None and any(pr.via_relay for pr in res.values()):
        res.turn = local.turn
    out = NatResult(new)
    out.turn, out.rank, out.local, out.records = res.turn, res.rank, local, res.records
    out.timings = {"checks": time.monotonic() - t0}
    return out


def _check(port, rank, local, records, cfg):
    """Checks with every peer in ``records`` at once; channels for relayed pairs.
    Returns (results, failures, loop)."""
    now = time.monotonic()
    sessions = {r: IceSession(rank, r, local, rec, rank < r, now,
                              check_timeout=cfg.check_timeout, timeout=cfg.timeout,
                              settle=cfg.settle, pace=cfg.pace, relay_wait=cfg.relay_wait)
                for r, rec in records.items()}
    by_ufrag = {records[r]["ufrag"]: s for r, s in sessions.items()}
    loop = _Loop(port, local, by_ufrag)
    loop.backlog.extend(local.backlog)
    local.backlog.clear()
    if local.turn is not None:
        loop.backlog.extend(local.turn.backlog)
        local.turn.backlog.clear()
    loop.run(lambda: all(s.done for s in sessions.values()))
    res = NatResult()
    failures = []
    for r, s in sorted(sessions.items()):
        if s.state == "done":
            res[r] = s.result()
        else:
            failures.append((r, s))
    if local.turn is not None:
        for r, pr in res.items():
            if pr.via_relay:
                try:
                    pr.channel = local.turn.channel_bind((pr.remote_addr, pr.remote_port))
                except NatError as e:
                    failures.append((r, f"TURN ChannelBind failed: {e}"))
        loop.backlog.extend(local.turn.backlog)
        local.turn.backlog.clear()
    return res, failures, loop


def _linger(loop, cfg):
    """Keep answering checks until they stop coming (see the module doc)."""
    if cfg.linger <= 0:
        return
    start = time.monotonic()
    end = start + cfg.linger

    def quiet_at():
        return min(end, max(loop.last_request, start) + cfg.linger_quiet)
    loop.run(lambda: time.monotonic() >= quiet_at(), until=quiet_at)


def _explain(rank, peer, s: IceSession, local, remote, cfg) -> str:
    head = f"rank {rank}: no working path to rank {peer}: "
    tried = ", ".join(sorted({p.describe() for p in s.pairs})) or "no candidate pairs"
    why = []
    if local.stun_asked and not local.stun_answered:
        why.append("no STUN server answered this rank ("
                   + ", ".join(f"{h}:{p}" for h, p in local.stun_asked)
                   + "): UDP from this rank seems blocked")
    if remote.get("stun_asked") and not remote.get("stun_answered"):
        why.append(f"no STUN server answered rank {peer}: its UDP seems blocked")
    if s.error == "timed out" and any(p.state == "succeeded" for p in s.pairs):
        why.append(f"checks worked but no pair was nominated within {cfg.timeout:g} s")
    else:
        why.append("UDP to every candidate timed out")
    if cfg.turn is None:
        why.append("no TURN server configured")
    elif local.turn is None:
        why.append(f"TURN relay unusable ({local.turn_error})")
    elif not remote.get("turn"):
        why.append(f"rank {peer} has no TURN allocation")
    if local.stun_asked and not local.stun_answered and local.turn is None \
            and cfg.turn_transport == "udp":
        why.append("where UDP is blocked, reach a TURN server over TCP or TLS: "
                   "ERDMA_TURN=turn:USER:PASS@HOST:PORT?transport=tcp or "
                   "turns:USER:PASS@HOST:443")
    return head + "; ".join(why) + f" (tried {tried})"


class _Loop:
    """Reads the port, answers and routes STUN to the sessions, sends their checks."""

    def __init__(self, port, local, by_ufrag):
        self.port, self.local, self.by_ufrag = port, local, by_ufrag
        self.turn = local.turn
        self.backlog: list = []
        self.tids: dict = {}        # tid -> (session, pair)
        self.key = local.pwd.encode()
        self.last_request = 0.0     # when the last authenticated check came in

    def run(self, finished, until=None):
        sessions = list(self.by_ufrag.values())
        while True:
            now = time.monotonic()
            for s in sessions:
                for pair, data in s.poll(now):
                    self.tids[pair.tid] = (s, pair)
                    self._send(pair.base, data, pair.remote)
            if finished():
                return
            if self.backlog:
                self._handle(*self.backlog.pop(0))
                continue
            limit = until() if callable(until) else until
            nxt = min([s.next_time() for s in sessions] + [limit or float("inf")])
            wait = max(0.0, min(nxt - time.monotonic(), 0.5))
            got = self.port.recv(wait)
            if got is not None:
                self._handle(*got)

    def _send(self, base, data, addr):
        if base == "relay":
            self.turn.send(data, addr)
        else:
            self.port.send(data, addr)

    def _handle(self, data, addr):
        base = "sock"
        if self.turn is not None:
            r = self.turn.handle(data, addr)
            if r is not None:
                data, addr = r
                base = "relay"
        if not stun.is_stun(data):
            return
        try:
            msg = stun.decode(data)
        except StunError:
            return
        if msg.method != stun.BINDING:
            return
        now = time.monotonic()
        if msg.cls == stun.REQUEST:
            user = msg.get(ATTR.USERNAME) or b""
            mine, _, theirs = user.decode("utf-8", "replace").partition(":")
            if mine != self.local.ufrag or not stun.check_integrity(msg, self.key):
                return                  # not for us, or forged: no answer
            s = self.by_ufrag.get(theirs)
            if s is None:
                return
            self.last_request = now
            resp = s.on_request(msg, base, addr, now)
            if resp is not None:
                self._send(base, resp, addr)
        elif msg.is_response:
            hit = self.tids.get(msg.tid)
            if hit is None:
                return
            s, pair = hit
            if not stun.check_integrity(msg, s.remote["pwd"].encode()):
                s.bad_integrity += 1
                return
            s.on_response(msg, pair, base, addr, now)
