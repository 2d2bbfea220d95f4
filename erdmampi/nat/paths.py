"""Bootstrap glue: choose every peer's path through NATs and install it in the engine.

Used by :mod:`erdmampi.bootstrap` when NAT traversal is on (``ERDMA_STUN``,
``ERDMA_TURN`` or ``ERDMA_NAT=1``). The ICE agent (:mod:`erdmampi.nat.agent`)
runs on the engine's own UDP socket (:class:`~erdmampi.nat.engine_port.EnginePort`),
so the NAT bindings the checks open are the ones QUIC then uses; candidate
records travel through the job's (authenticated) rendezvous store under
``nat/{rank}``.
"""
from __future__ import annotations

import json
import logging
import os
import threading

from erdmampi.nat import NatError
from erdmampi.nat.agent import NatConfig, establish

__all__ = ["nat_config", "install_paths", "TurnKeeper", "parse_hostport", "parse_turn"]

log = logging.getLogger("erdmampi.nat")

STUN_PORT = 3478


def parse_hostport(text: str, var: str, default_port: int = STUN_PORT) -> tuple[str, int]:
    """``host``, ``host:port`` or ``[v6]:port`` -> (host, port)."""
    text = text.strip()
    if not text:
        raise ValueError(f"{var}: empty address")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest.lstrip(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host, port = text, ""
    try:
        p = int(port) if port else default_port
    except ValueError:
        raise ValueError(f"{var}: {text!r} has a bad port (want host:port)") from None
    if not host or not 0 < p < 65536:
        raise ValueError(f"{var}: {text!r} is not host:port")
    return host, p


TURNS_PORT = 5349
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def parse_turn(text: str, var: str = "ERDMA_TURN") -> tuple[str, int, str, str, str]:
    """A TURN server setting -> ``(host, port, user, password, transport)``.

    * ``user:password@host[:port]`` -- UDP (the password may contain ':');
    * ``turn:user:password@host[:port][?transport=udp|tcp]`` -- as WebRTC users
      write TURN URIs (RFC 7065) with the credentials in front; default port 3478;
    * ``turns:user:password@host[:port][?transport=tcp]`` -- TLS over TCP; default
      port 5349 (often 443, where only HTTPS leaves a network).

    User and password may be percent-encoded (``%40`` for '@').  ``transport``
    is ``udp``, ``tcp`` or ``tls``.  Raises ValueError naming what is wrong.
    """
    from urllib.parse import unquote
    raw = text.strip()
    scheme, rest = "", raw
    head, colon, tail = raw.partition(":")
    if colon and head.lower() in ("turn", "turns"):
        cred = tail.partition("?")[0].rpartition("@")[0]
        # "turn:PASS@host" is the old form with the user "turn": a URI needs user:password
        if ":" in cred or "@" not in tail or head.lower() == "turns":
            scheme, rest = head.lower(), tail
    elif colon and "@" not in head and head.lower() in ("stun", "stuns", "http", "https",
                                                         "tcp", "udp", "tls"):
        raise ValueError(f"{var}={text!r}: scheme {head!r}: want turn: or turns:")
    rest, q, query = rest.partition("?")
    if rest.startswith("//"):
        raise ValueError(f"{var}={text!r}: no '//' after {scheme or 'the scheme'}: "
                         f"want {scheme or 'turn'}:user:password@host[:port]")
    if q and not scheme:
        raise ValueError(f"{var}={text!r}: ?{query} needs a turn: or turns: URI")
    transport = "tls" if scheme == "turns" else "udp"
    if q:
        for item in query.split("&"):
            key, eq, val = item.partition("=")
            if key.lower() != "transport" or not eq:
                raise ValueError(f"{var}={text!r}: unknown parameter {item!r} "
                                 "(only ?transport=udp or ?transport=tcp)")
            val = val.lower()
            if val not in ("udp", "tcp"):
                raise ValueError(f"{var}={text!r}: transport={val!r}: want udp or tcp")
            if scheme == "turns" and val == "udp":
                raise ValueError(f"{var}={text!r}: turns: with transport=udp is DTLS, "
                                 "which is not supported (use turns: over TCP, or turn:)")
            if scheme == "turn":
                transport = val
    cred, at, addr = rest.rpartition("@")
    user, colon, password = cred.partition(":")
    form = f"{scheme}:user:password@host[:port]" if scheme else "user:password@host[:port]"
    if not at or not colon or not user:
        raise ValueError(f"{var}={text!r}: want {form} (TURN needs a user and a password)")
    if not addr.strip():
        raise ValueError(f"{var}={text!r}: no host after '@'")
    host, port = parse_hostport(addr, var, TURNS_PORT if scheme == "turns" else STUN_PORT)
    if "/" in host or "@" in host:
        raise ValueError(f"{var}={text!r}: bad host {host!r}")
    return host, port, unquote(user), unquote(password), transport


def _parse_turn(text: str) -> tuple[str, int, str, str]:
    """``(host, port, user, password)`` of an ERDMA_TURN setting (any form)."""
    return parse_turn(text)[:4]


def _flag(env, var) -> bool:
    v = env.get(var, "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ValueError(f"{var}={v!r}: want 1 or 0")


def nat_config(env) -> NatConfig | None:
    """The NAT settings from the environment; None when traversal is off."""
    stun = env.get("ERDMA_STUN", "").strip()
    turn = env.get("ERDMA_TURN", "").strip()
    mode = env.get("ERDMA_NAT", "").strip().lower()
    if mode in ("0", "off", "no", "false"):
        return None
    if not (stun or turn or mode in ("1", "on", "yes", "true")):
        return None
    cfg = NatConfig()
    cfg.stun_servers = [parse_hostport(s, "ERDMA_STUN") for s in stun.split(",") if s.strip()]
    if turn:
        *cfg.turn, cfg.turn_transport = parse_turn(turn)
        cfg.turn = tuple(cfg.turn)
        cfg.turn_tls_ca = env.get("ERDMA_TURN_CA", "").strip() or None
        cfg.turn_tls_verify = not _flag(env, "ERDMA_TURN_INSECURE")
        if cfg.turn_tls_ca and not os.path.isfile(cfg.turn_tls_ca):
            raise ValueError(f"ERDMA_TURN_CA={cfg.turn_tls_ca!r}: no such file")
    t = env.get("ERDMA_NAT_TIMEOUT", "").strip()
    if t:
        try:
            cfg.timeout = float(t)
        except ValueError:
            raise ValueError(f"ERDMA_NAT_TIMEOUT={t!r} is not a number of seconds") from None
        if cfg.timeout <= 0:
            raise ValueError(f"ERDMA_NAT_TIMEOUT={t!r} must be positive")
    return cfg


def first_server(cfg: NatConfig) -> tuple[str, int] | None:
    """A server whose route decides which local address to bind."""
    if cfg.stun_servers:
        return cfg.stun_servers[0]
    if cfg.turn is not None:
        return cfg.turn[:2]
    return None


def bind_address(cfg: NatConfig) -> str | None:
    """The address the engine binds for NAT traversal: "::" (one dual-stack
    socket, IPv4 and IPv6 candidates) when servers of both families are
    configured and this host routes to one of each; else the local address
    that routes to the first server that is reachable (None: no server)."""
    from erdmampi.nat.port import route_source
    servers = list(cfg.stun_servers) + ([cfg.turn[:2]] if cfg.turn is not None else [])
    routed = {}
    for h, p in servers:
        fam = 6 if ":" in str(h) else 4
        if fam not in routed:
            src = route_source(h, p)
            if src is not None:
                routed[fam] = src
    if len(routed) == 2:
        return "::"
    if routed:
        return next(iter(routed.values()))
    return None


def install_paths(eng, store, rank: int, size: int, cfg: NatConfig, fingerprints: dict,
                  timeout: float):
    """Run the checks with every peer, then point the engine at the chosen paths.

    :param fingerprints: ``{rank: certificate fingerprint}`` from the authenticated
        records; QUIC pins them whichever path a peer is reached by.
    :returns: the agent's :class:`~erdmampi.nat.agent.NatResult` (``.turn`` is the
        TURN client to keep alive when a peer is relayed, else None).
    """
    from erdmampi.nat.engine_port import EnginePort

    if cfg.turn is not None and cfg.turn_transport == "udp":
        eng.add_turn_server(cfg.turn[0], cfg.turn[1])  # over TCP/TLS: the shim's address

    def publish(rec):
        store.set(f"nat/{rank}", json.dumps(rec).encode())

    def fetch(r):
        try:
            return json.loads(store.get(f"nat/{r}", timeout=timeout))
        except TimeoutError:
            raise NatError(f"rank {rank}: rank {r} published no NAT candidates within "
                           f"{timeout:g} s (it did not start, or cannot reach the "
                           "rendezvous)") from None

    if cfg.turn is not None:
        cfg.keep_turn = True  # direct paths get the relay as their fallback
    res = establish(EnginePort(eng), rank, size, publish, fetch, cfg)
    recheck = getattr(eng, "direct_recheck", 0) > 0
    for r, pr in sorted(res.items()):
        _install_pair(eng, r, pr, res.records[r], fingerprints[r], recheck)
        log.info("rank %d -> rank %d: %s", rank, r, pr.describe())
    if res.turn is not None:
        _bind_fallbacks(eng, res, rank)
    return res


def _install_pair(eng, r, pr, record, fingerprint, recheck):
    """Point the engine at the pair chosen for rank ``r``.

    A relayed pair with a direct candidate at the far end (the checks found no
    direct path in time: a punch that lost a race, a path that opens later)
    starts on the relay and probes the direct path, moving there once the
    peer's packets come that way (``recheck``: ``ERDMA_DIRECT_RECHECK`` > 0).
    The side that sends through its own allocation already knows the peer by
    that candidate (its channel is bound to it); the side that sends to the
    peer's relayed address learns it from the peer's record."""
    if pr.via_relay:
        eng.set_peer(r, pr.remote_addr, pr.remote_port, fingerprint)
        eng.set_peer_relay(r, pr.turn_server[0], pr.turn_server[1], pr.channel,
                           pr.remote_addr, pr.remote_port,
                           relay_first=recheck and pr.remote_type != "relay")
        return
    direct = _direct_candidate(record) if recheck and pr.remote_type == "relay" else None
    if direct is None:
        eng.set_peer(r, pr.remote_addr, pr.remote_port, fingerprint)
        return
    eng.set_peer(r, direct[0], direct[1], fingerprint)
    eng.set_peer_redirect(r, pr.remote_addr, pr.remote_port)


def _direct_candidate(record):
    """The peer's most likely directly reachable address: its best
    server-reflexive candidate, else its best host candidate (None if none)."""
    for ctype in ("srflx", "host"):
        cands = [c for c in record.get("candidates", []) if c.get("type") == ctype]
        if cands:
            best = max(cands, key=lambda c: c.get("priority", 0))
            return str(best["addr"]), int(best["port"])
    return None


def _bind_fallbacks(eng, res, rank):
    """Give every direct peer that has a relay candidate a TURN channel to it, as the
    engine's fallback route: if the direct path goes silent, both ends move to
    relay-to-relay (each sends through its own allocation to the other's)."""
    turn = res.turn
    todo = {}
    for r, pr in res.items():
        if pr.via_relay or pr.remote_type == "relay":
            continue  # already through a relay
        relay = [c for c in res.records[r].get("candidates", []) if c.get("type") == "relay"]
        if relay:
            todo[r] = (str(relay[0]["addr"]), int(relay[0]["port"]))
    if not todo:
        return
    try:
        turn.create_permission(sorted({(a, 0) for a, _ in todo.values()}))
    except NatError as e:
        log.warning("rank %d: no relay fallback (TURN CreatePermission failed: %s)", rank, e)
        return
    for r, addr in sorted(todo.items()):
        try:
            ch = turn.channel_bind(addr)
        except NatError as e:
            log.warning("rank %d: no relay fallback to rank %d (ChannelBind: %s)", rank, r, e)
            continue
        eng.set_peer_relay(r, turn.server[0], turn.server[1], ch, addr[0], addr[1],
                           fallback=True)


class TurnKeeper:
    """Refreshes a TURN allocation, its permissions and channels while the job runs.

    After bootstrap nothing else reads the engine's side channel, so the
    client's transactions have the port to themselves (what ``maintain``
    requires).
    """

    def __init__(self, turn, period: float = 30.0):
        self.turn = turn
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="erdma-turn", daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.wait(self.period):
            try:
                self.turn.maintain()
            except Exception as e:  # a missed refresh is retried next period
                log.warning("TURN refresh failed: %s", e)

    def close(self, timeout: float = 1.0):
        self._stop.set()
        self._thread.join(timeout)
        try:
            self.turn.close(timeout=timeout)
        except Exception:
            pass
