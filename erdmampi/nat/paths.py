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
import threading

from erdmampi.nat import NatError
from erdmampi.nat.agent import NatConfig, establish

__all__ = ["nat_config", "install_paths", "TurnKeeper", "parse_hostport"]

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


def _parse_turn(text: str) -> tuple[str, int, str, str]:
    """``user:password@host[:port]`` (the password may itself contain ':')."""
    cred, at, addr = text.strip().rpartition("@")
    user, colon, password = cred.partition(":")
    if not at or not colon or not user:
        raise ValueError(f"ERDMA_TURN={text!r}: want user:password@host[:port]")
    host, port = parse_hostport(addr, "ERDMA_TURN")
    return host, port, user, password


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
    cfg.turn = _parse_turn(turn) if turn else None
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


def install_paths(eng, store, rank: int, size: int, cfg: NatConfig, fingerprints: dict,
                  timeout: float):
    """Run the checks with every peer, then point the engine at the chosen paths.

    :param fingerprints: ``{rank: certificate fingerprint}`` from the authenticated
        records; QUIC pins them whichever path a peer is reached by.
    :returns: the agent's :class:`~erdmampi.nat.agent.NatResult` (``.turn`` is the
        TURN client to keep alive when a peer is relayed, else None).
    """
    from erdmampi.nat.engine_port import EnginePort

    if cfg.turn is not None:
        eng.add_turn_server(cfg.turn[0], cfg.turn[1])

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
    for r, pr in sorted(res.items()):
        eng.set_peer(r, pr.remote_addr, pr.remote_port, fingerprints[r])
        if pr.via_relay:
            eng.set_peer_relay(r, pr.turn_server[0], pr.turn_server[1], pr.channel,
                               pr.remote_addr, pr.remote_port)
        log.info("rank %d -> rank %d: %s", rank, r, pr.describe())
    if res.turn is not None:
        _bind_fallbacks(eng, res, rank)
    return res


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
