"""What a rank says about itself: start-up lines and a statistics dump.

``ERDMA_VERBOSE=1`` (as ``NCCL_DEBUG=INFO``): at start-up every rank prints
one line: version, rank, pid, host, bind address, congestion control,
compression mode, timeouts, and how it reaches each peer (shared memory,
direct QUIC, relayed through TURN), then with ``ERDMA_VERBOSE=2`` one line per
peer (address, NAT candidate pair, RTT).

``ERDMA_STATS=1``: when the rank finalizes it prints the engine's counters
(bytes, messages, packets, chunks), each peer's route and QUIC figures
(smoothed/min RTT, congestion window, packets lost and resent, probe
timeouts, delivery rate), the TURN relay's counters (packets, moves between
the direct path and the relay), and the
compression counters (bytes in, bytes out, ratio).

Every line goes to stderr, tagged ``[rank N]``.
"""
import os
import sys

from . import config
from .discovery import format_ranks

__all__ = ["startup_lines", "stats_lines", "report_startup", "report_stats", "verbosity"]


def verbosity(env=os.environ) -> int:
    return config.get("ERDMA_VERBOSE", env)


def _stats_wanted(env=os.environ) -> bool:
    return config.get("ERDMA_STATS", env)


def _routes(eng):
    routes = {}
    for r in range(eng.size):
        if r == eng.rank:
            continue
        try:
            routes[r] = eng.peer_route(r)
        except Exception:
            routes[r] = "unknown"
    return routes


def _compress_mode():
    try:
        from . import compression
        return compression.default_mode()
    except Exception:
        return "unknown"


def startup_lines(eng, info, env=os.environ, level=1):
    from . import __version__
    routes = _routes(eng)
    by_route = {}
    for r, how in routes.items():
        by_route.setdefault(how, []).append(r)
    peers = "; ".join(f"{how} {format_ranks(rs)}" for how, rs in sorted(by_route.items())) or "none"
    lines = [f"erdmampi {__version__}: rank {eng.rank} of {eng.size}, pid {os.getpid()}, "
             f"host {info.get('host', '?')}, bind {eng.local_addr}, "
             f"cc {env.get('ERDMA_CC', 'auto')}, compression {_compress_mode()}, "
             f"timeout {env.get('ERDMA_TIMEOUT', '60')} s; peers: {peers}"]
    if level >= 2:
        endpoints = info.get("endpoints", {})
        paths = info.get("paths", {})
        for r, how in sorted(routes.items()):
            st = eng.peer_stat(r)
            rtt = f", srtt {st['srtt_us'] / 1000:.2f} ms" if st["connections"] else ""
            where = paths.get(r) or endpoints.get(r, "")
            lines.append(f"  peer {r}: {how}{' ' + where if where else ''}"
                         f", {st['connections']} QUIC connection(s){rtt}")
    return lines


def stats_lines(eng):
    st = eng.stats()
    lines = [f"erdmampi statistics of rank {eng.rank}: "
             f"sent {st['bytes_sent']} bytes in {st['msgs_sent']} messages "
             f"({st['pkts_sent']} packets, {st['chunks_sent']} chunks); "
             f"received {st['bytes_recv']} bytes in {st['msgs_recv']} messages "
             f"({st['pkts_recv']} packets, {st['chunks_recv']} chunks); "
             f"{st['unexpected']} unexpected"]
    for r, how in sorted(_routes(eng).items()):
        p = eng.peer_stat(r)
        if p["connections"]:
            lines.append(f"  peer {r}: {how}, {p['connections']} QUIC connection(s), srtt "
                         f"{p['srtt_us'] / 1000:.3f} ms, min rtt {p['min_rtt_us'] / 1000:.3f} ms,"
                         f" cwnd {p['cwnd']} bytes, {p['lost_packets']} packets lost and resent,"
                         f" {p['pto_count']} probe timeouts, delivery "
                         f"{p['delivery_rate_bps'] / 1e6:.1f} Mbit/s"
                         + (", lost" if p["lost"] else ""))
        else:
            lines.append(f"  peer {r}: {how}" + (", lost" if p["lost"] else ""))
    if st["relay_sent"] or st["relay_recv"] or st["to_relay"] or st["to_direct"]:
        # each move is also logged as it happens (ERDMA_VERBOSE=1)
        lines.append(f"  TURN relay: {st['relay_sent']} packets sent, {st['relay_recv']} "
                     f"received; {st['to_relay']} move(s) to the relay, {st['to_direct']} "
                     f"back to the direct path ({st['direct_probes']} probes of it)")
    try:
        from . import compression
        c = compression.stats()
        if c["messages"]:
            ratio = c["bytes_in"] / c["bytes_out"] if c["bytes_out"] else 0.0
            lines.append(f"  compression: {c['calls']} calls, {c['bytes_in']} bytes in, "
                         f"{c['bytes_out']} bytes out (ratio {ratio:.2f})")
        else:
            lines.append("  compression: no compressed messages")
    except Exception:
        pass
    return lines


def _write(rank, lines):
    try:
        sys.stderr.write("".join(f"[rank {rank}] {ln}\n" for ln in lines))
        sys.stderr.flush()
    except Exception:
        pass


def report_startup(eng, info, env=os.environ):
    level = verbosity(env)
    if level >= 1 and eng is not None:
        _write(eng.rank, startup_lines(eng, info, env, level))


def report_stats(eng, env=os.environ):
    if _stats_wanted(env) and eng is not None:
        _write(eng.rank, stats_lines(eng))
