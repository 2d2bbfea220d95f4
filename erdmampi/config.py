"""Every ERDMA_* environment variable, declared once: name, kind, default,
unit, when it is read, and what it does.

``get(name)`` parses and validates a variable; a bad value raises
:class:`ConfigError` (a ``ValueError``) that names the variable and the values
it accepts.  ``validate(env)`` checks every ERDMA_* variable of an
environment at once (erdmarun runs it before starting ranks, each rank at
start-up).  ``python -m erdmampi.config`` prints the reference table of
``docs/config.md``; a test fails when the code reads a name declared nowhere
here.

Kinds: ``int``; ``size`` (bytes, ``K``/``M``/``G`` suffixes, binary);
``seconds`` (a positive number); ``fraction`` (a number in [0, 1]); ``bool`` (1/0, yes/no, true/false, on/off);
``choice``; ``str`` (free text: addresses, lists, paths).
"""
from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass

__all__ = ["Var", "VARS", "ConfigError", "get", "parse", "validate", "markdown", "declared"]


class ConfigError(ValueError):
    """A variable's value is not one it accepts."""


@dataclass(frozen=True)
class Var:
    name: str
    kind: str
    default: object
    meaning: str
    read: str = "start-up"        # start-up, import, launcher, per call
    choices: tuple = ()
    lo: "float | None" = None
    hi: "float | None" = None
    prefix: bool = False          # the name is a prefix (ERDMA_COLL_<NAME>)
    aliases: tuple = ()           # choice: (other spelling, the choice it means), ...
    topic: str = "other"


def _v(topic, *rows):
    return [Var(*row[:4], **dict(row[4] if len(row) > 4 else {}), topic=topic) for row in rows]


_BOOL = "1/0, yes/no, true/false, on/off"

VARS_LIST = (
    _v("launcher contract (set by erdmarun)",
       ("ERDMA_RANK", "int", None, "rank in COMM_WORLD", {"lo": 0}),
       ("ERDMA_SIZE", "int", None, "ranks in COMM_WORLD", {"lo": 1}),
       ("ERDMA_RENDEZVOUS", "str", None, "host:port of the job's rendezvous store"),
       ("ERDMA_JOBID", "str", None, "the job's id (prefix of its rendezvous keys)"),
       ("ERDMA_LOCAL_RANK", "int", None, "rank among the ranks on the same host", {"lo": 0}),
       ("ERDMA_LOCAL_SIZE", "int", None, "ranks on the same host", {"lo": 1}),
       ("ERDMA_APPNUM", "int", 0, "MPI_APPNUM", {"lo": 0}),
       ("ERDMA_UNIVERSE_SIZE", "int", None, "MPI_UNIVERSE_SIZE (total slots)", {"lo": 1}),
       ("ERDMA_LAUNCHER_PID", "int", None, "pid of the ranks' launcher: the one process (with "
        "its descendants) a rank lets read its memory for shared-memory copies", {"lo": 1}),
       ("ERDMA_SSH", "str", "ssh -o BatchMode=yes", "command erdmarun starts remote ranks with",
        {"read": "launcher"})),
    _v("start-up and failure detection",
       ("ERDMA_TIMEOUT", "seconds", 60.0, "seconds without traffic (QUIC) or heartbeat "
        "(shared memory) before a peer counts as dead"),
       ("ERDMA_CONNECT_TIMEOUT", "seconds", 60.0, "seconds for the rendezvous and the QUIC "
        "handshakes (and, with erdmarun joining, for the other sites)"),
       ("ERDMA_HELLO_TIMEOUT", "seconds", 10.0, "seconds an accepted connection has to finish "
        "its handshake and name its rank"),
       ("ERDMA_BIND", "str", None, "address of the rank's UDP socket (default: the one routing "
        "to the rendezvous)"),
       ("ERDMA_PORT", "int", 0, "UDP port of the rank's socket (0: any)", {"lo": 0, "hi": 65535}),
       ("ERDMA_HOST", "str", None, "host identity: ranks with the same one share memory "
        "(default: hostname and boot id)"),
       ("ERDMA_ABORT_ON_EXCEPTION", "bool", True, "an uncaught exception aborts the job "
        "(0: Python's plain exit)", {"read": "import of MPI"}),
       ("ERDMA_STACK_DUMP", "bool", True, "print stacks and pending operations on SIGUSR1",
        {"read": "import of MPI"})),
    _v("messages and waiting",
       ("ERDMA_EAGER_LIMIT", "size", 65536, "bytes up to which a message is sent at once; "
        "same on every rank", {"lo": 0}),
       ("ERDMA_SPIN_US", "int", 50, "microseconds a waiting call polls before it sleeps",
        {"lo": 0}),
       ("ERDMA_UNEXPECTED_MAX", "size", None, "unexpected-message bytes held per peer before "
        "its sending is held back (default 64M)", {"lo": 1 << 16}),
       ("ERDMA_RECV_ALLOC_MAX", "size", None, "largest message a receive without a buffer "
        "accepts (default: physical memory)", {"lo": 1})),
    _v("ranks on one host",
       ("ERDMA_SHM", "bool", True, "shared memory between ranks of one host (0: QUIC over "
        "loopback)"),
       ("ERDMA_SHM_RING", "size", 2 << 20, "bytes of each shared-memory ring (a power of two)",
        {"lo": 4096}),
       ("ERDMA_SHM_UNEXPECTED_MAX", "size", None, "unexpected-message bytes held per rank "
        "of this host while this rank waits on no peer; beyond, its sends wait for room in "
        "the ring (default 1M; ERDMA_UNEXPECTED_MAX while a receive, probe or send waits)",
        {"lo": 1 << 16}),
       ("ERDMA_SHM_EAGER_LIMIT", "size", None, "bytes up to which a message goes into the "
        "peer's ring (default 1M)", {"lo": 0}),
       ("ERDMA_SHM_CMA", "bool", True, "large messages as one process_vm_readv copy (0: "
        "through the ring)"),
       ("ERDMA_SHM_CMA_BOUNCE", "choice", "auto", "a CMA copy whose destination lies 1-63 "
        "bytes after its source modulo the page goes through a buffer of the reader (the "
        "kernel's copy stalls there on AMD CPUs): auto (if a read of 256 KiB at start-up "
        "shows the stall), on or off", {"choices": ("auto", "on", "off")}),
       ("ERDMA_SHM_DEMOTE", "choice", "auto", "lines written for a rank of this host (ring "
        "bytes, flags) go to the shared cache at once with CLDEMOTE, where the reader finds "
        "them sooner: auto (if the CPU has the instruction), on (a no-op elsewhere) or off",
        {"choices": ("auto", "on", "off")}),
       ("ERDMA_SHM_BULK_CMA", "size", None, "a collective's block to a rank of this host "
        "goes by one process_vm_readv copy from this size, below ERDMA_SHM_EAGER_LIMIT "
        "(default: measured at start-up; 0: never)", {"lo": 0}),
       ("ERDMA_SHM_P2P_CMA", "size", None, "a point-to-point message to a rank of this host "
        "below ERDMA_SHM_P2P_SPLIT goes by one process_vm_readv copy of its receiver from "
        "this size (default 0: never; faster only for a buffer sent again unchanged)",
        {"lo": 0}),
       ("ERDMA_SHM_P2P_SPLIT", "size", None, "a point-to-point message to a rank of this host "
        "from this size is copied half by its receiver, half by its sender at once, with CMA "
        "(default 16K; 0: never)", {"lo": 0})),
    _v("between hosts (QUIC)",
       ("ERDMA_CC", "choice", "auto", "congestion control", {"choices": (
           "auto", "cubic", "reno", "bbr", "bbr2")}),
       ("ERDMA_STREAM_WINDOW", "size", None, "initial QUIC stream window (16M)", {"lo": 1 << 16}),
       ("ERDMA_CONN_WINDOW", "size", None, "initial QUIC connection window (32M)",
        {"lo": 1 << 16}),
       ("ERDMA_MAX_STREAM_WINDOW", "size", None, "ceiling of the stream window (256M)",
        {"lo": 1 << 16}),
       ("ERDMA_MAX_CONN_WINDOW", "size", None, "ceiling of the connection window (1G)",
        {"lo": 1 << 16}),
       ("ERDMA_PACE", "bool", False, "BBR paths: the engine paces each connection's bursts "
        "at BBR's rate (default off: ngtcp2's pacing lets back-to-back bursts through at the "
        "congestion window's pace; on for the torch backend, whose traffic comes in bursts)"),
       ("ERDMA_PACE_LEARN", "bool", True, "a QUIC connection that paces (ERDMA_PACE, or a "
        "ceiling) keeps below 1.25 x the rate its packets reach the peer at, which the peer "
        "reports (RATE frames): bursts no longer overflow the bottleneck's queue"),
       ("ERDMA_MAX_PACING_RATE", "size", 0, "bytes per second: ceiling of each QUIC "
        "connection's pacing rate, as Linux's SO_MAX_PACING_RATE (e.g. 11M for a 100 Mbit/s "
        "uplink); set, the engine paces BBR connections (0: no ceiling)", {"lo": 0}),
       ("ERDMA_SOCK_BUF", "size", None, "UDP socket buffer bytes (16M)", {"lo": 0}),
       ("ERDMA_DATA_STREAMS", "int", None, "QUIC streams per peer for large payloads (4; 0: "
        "the control stream)", {"lo": 0, "hi": 16}),
       ("ERDMA_CHUNK", "size", None, "payload bytes per chunk on a data stream (512K)",
        {"lo": 4096}),
       ("ERDMA_LANES", "int", None, "QUIC connections per peer (0: automatic)",
        {"lo": 0, "hi": 8}),
       ("ERDMA_MAX_UDP_PAYLOAD", "size", 0, "QUIC packet size (0: by path)",
        {"lo": 0, "hi": 65527}),
       ("ERDMA_KEEPALIVE", "seconds", None, "idle seconds before a QUIC PING (default "
        "ERDMA_TIMEOUT/4, 15 with NAT traversal; 0: off)", {"lo": 0}),
       ("ERDMA_WAN_EAGER_HEAD", "size", 16 << 20, "between hosts, a two-rank Allreduce or "
        "Bcast and a direct Allgather of up to this many bytes go as eager pieces (no "
        "rendezvous round trip); same on every rank", {"read": "per call", "lo": 0}),
       ("ERDMA_PATH_LOG_MS", "int", 1000, "with ERDMA_VERBOSE=2: milliseconds between path "
        "reports", {"lo": 1})),
    _v("collectives",
       ("ERDMA_COLL_", "str", None, "ERDMA_COLL_<NAME>=<algorithm> forces an algorithm, e.g. "
        "ERDMA_COLL_ALLREDUCE=ring; same on every rank", {"prefix": True, "read": "per call"}),
       ("ERDMA_SCHED_MIN", "size", 256 << 10, "smallest vector run as a chunked C schedule; "
        "same on every rank", {"read": "per call", "lo": 0}),
       ("ERDMA_SCHED_CHUNK", "size", 0, "chunk bytes of those schedules (0: automatic); same "
        "on every rank", {"read": "per call", "lo": 0}),
       ("ERDMA_BULK_ROOT_PART", "fraction", None, "fixed work share of the two-rank shared-memory "
        "Bcast (for measurements)", {"read": "import"}),
       ("ERDMA_BULK_PULL_PART", "fraction", None, "fixed work share of the two-rank shared-memory "
        "Alltoall (for measurements)", {"read": "import"})),
    _v("torch backend (erdmampi.torch)",
       ("ERDMA_TORCH_LANES", "int", 2, "communicators (each with its worker thread) an erdma "
        "process group runs its collectives on: operation i on lane i % lanes, so independent "
        "collectives (DDP's buckets) overlap; 1: all in issue order on one; same on every rank",
        {"read": "process group creation", "lo": 1, "hi": 8})),
    _v("compression",
       ("ERDMA_COMPRESS", "choice", "auto", "compression of collective traffic",
        {"choices": ("off", "auto", "lossless", "bf16", "int8", "int4"), "read": "import",
         "aliases": (("0", "off"), ("none", "off"), ("no", "off"), ("false", "off"),
                     ("1", "lossless"), ("on", "lossless"), ("yes", "lossless"),
                     ("true", "lossless"))}),
       ("ERDMA_COMPRESS_CHUNK", "size", 1 << 20, "input bytes per pipelined chunk; same on "
        "every rank", {"read": "import", "lo": 64}),
       ("ERDMA_COMPRESS_MIN", "size", 64 << 10, "auto: smallest vector compressed; same on "
        "every rank", {"read": "import", "lo": 0}),
       ("ERDMA_LINK_BW", "str", None, "link bandwidth in bits/s (e.g. 10G) the auto policy "
        "assumes (default: estimated)", {"read": "per call"})),
    _v("finding peers, secrets, NATs",
       ("ERDMA_DHT", "str", None, "host:port,... of DHT peers to find the job's records through"),
       ("ERDMA_DHT_BIND", "str", "0.0.0.0:0", "UDP address of the rank's DHT node"),
       ("ERDMA_JOB_SECRET", "str", None, "the job secret, hex (at least 128 bits)"),
       ("ERDMA_JOB_SECRET_FILE", "str", None, "a file holding the job secret"),
       ("ERDMA_INSECURE", "bool", False, "run without a job secret (with a warning) and let an "
        "empty fingerprint accept any certificate"),
       ("ERDMA_STUN", "str", None, "STUN servers, host:port,..."),
       ("ERDMA_TURN", "str", None, "a TURN relay: user:password@host:port (UDP), "
        "turn:user:password@host:port[?transport=tcp] or turns:user:password@host:port "
        "(TLS over TCP, default port 5349)"),
       ("ERDMA_TURN_CA", "str", None, "CA file the turns: server's certificate must chain "
        "to (default: the system's CAs)"),
       ("ERDMA_TURN_INSECURE", "bool", False, "accept any certificate from the turns: "
        "server (no verification)"),
       ("ERDMA_NAT", "str", None, "NAT traversal: 1 host candidates only, 0 off"),
       ("ERDMA_NAT_TIMEOUT", "seconds", 15.0, "seconds for the connectivity checks with one "
        "peer"),
       ("ERDMA_PATH_TIMEOUT", "seconds", 5.0, "silence before a direct path moves to the relay"),
       ("ERDMA_DIRECT_RECHECK", "seconds", 8.0, "on the relay after the direct path fell "
        "silent: the longest gap between probes of the direct path (the first after 0.25 s, "
        "then twice as late each time); a probe the peer answers moves QUIC back to the "
        "direct path. 0: stay on the relay", {"lo": 0}),
       ("ERDMA_PKTIO", "choice", "udp", "packet I/O backend", {"choices": ("udp", "dpdk")}),
       ("ERDMA_DPDK_EAL", "str", "", "DPDK EAL arguments"),
       ("ERDMA_DPDK_PORT", "int", 0, "DPDK port id", {"lo": 0}),
       ("ERDMA_DPDK_QUEUE", "int", 0, "DPDK queue id", {"lo": 0}),
       ("ERDMA_DPDK_PREFIX", "int", 24, "prefix length of the DPDK endpoint's subnet",
        {"lo": 0, "hi": 32}),
       ("ERDMA_DPDK_POLL_US", "int", 200, "microseconds between DPDK polls when idle",
        {"lo": 0}),
       ("ERDMA_DPDK_GATEWAY", "str", "", "IPv4 gateway of the DPDK endpoint"),
       ("ERDMA_DPDK_NEIGH", "str", "", "static neighbours ip=mac,... of the DPDK endpoint"),
       ("ERDMA_DPDK_COPY", "bool", False, "copy each packet into an mbuf instead of writing "
        "in place"),
       ("ERDMA_DPDK_TEST_NOBUF_EVERY", "int", 0, "tests only: fail every Nth mbuf allocation",
        {"lo": 0})),
    _v("diagnostics",
       ("ERDMA_VERBOSE", "int", 0, "1: a start-up line per rank and the engine's diagnostics; "
        "2: also per peer, and path reports", {"lo": 0}),
       ("ERDMA_STATS", "bool", False, "print each rank's traffic counters when it finalizes",
        {"read": "MPI.Finalize"}),
       ("ERDMA_CC_LOG", "bool", False, "log ngtcp2's congestion-control events"),
       ("ERDMA_CC_LOG_ALL", "bool", False, "with ERDMA_CC_LOG: log every ngtcp2 line"),
       ("ERDMA_TRACE_MSGS", "int", 0, "record the first N point-to-point messages each rank "
        "posts (send/receive, peer, tag, bytes, context; Engine.trace_take reads them); "
        "0: off", {"lo": 0, "hi": 1 << 32}),
       ("ERDMA_PROGRESS", "bool", True, "progress bars of benchmarks and test beds",
        {"read": "per call"})),
    _v("test beds and tools",
       ("ERDMA_CACHE_DIR", "str", None, "where the WAN bed keeps what it builds",
        {"read": "per call"}),
       ("ERDMA_WAN_STATE", "str", "/run/erdmampi-wan-cc.json", "the WAN bed's saved "
        "congestion-control settings", {"read": "import"}),
       ("ERDMA_TEST_TIMEOUT", "seconds", 300.0, "scripts/test.sh: seconds per test",
        {"read": "tests"}),
       ("ERDMA_SUITE_CACHE", "str", None, "where the mpi4py suite's sdist is kept "
        "(~/.cache/erdmampi)", {"read": "tests"}),
       ("ERDMA_FUZZ_SECONDS", "seconds", None, "seconds each fuzz target runs in "
        "tests/test_fuzz.py", {"read": "tests"}),
       ("ERDMA_FUZZ_BUILD", "str", None, "where fuzz/build.sh puts the fuzzers (build/fuzz)",
        {"read": "tests"}),
       ("ERDMA_REFERENCE", "str", None, "tests: run a script on mpi4py instead (mpi4py)",
        {"read": "tests"}),
       ("ERDMA_FAKE_HOSTS", "bool", False, "tests: ranks of one host act as separate hosts "
        "for the compression policy", {"read": "tests"})),
)

VARS = {v.name: v for group in VARS_LIST for v in group}
_PREFIXES = [v for v in VARS.values() if v.prefix]

_SCALE = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def declared(name: str) -> "Var | None":
    """The declaration that covers ``name`` (prefix declarations included)."""
    if name in VARS:
        return VARS[name]
    for v in _PREFIXES:
        if name.startswith(v.name) and len(name) > len(v.name):
            return v
    return None


def _accepts(v: Var) -> str:
    if v.kind == "bool":
        return _BOOL
    if v.kind == "choice":
        same = {}
        for alias, choice in v.aliases:
            same.setdefault(choice, []).append(alias)
        also = ", ".join("/".join(a) + " = " + c for c, a in same.items())
        return ", ".join(v.choices) + (f" (also {also})" if also else "")
    if v.kind == "fraction":
        return "a number from 0 to 1"
    if v.kind == "size":
        base = "a size in bytes (4096, 64K, 16M, 1G)"
    elif v.kind == "seconds":
        base = ("a number of seconds, 0 for off" if v.lo == 0
                else "a positive number of seconds")
        return base
    elif v.kind == "int":
        base = "an integer"
    else:
        return "text"
    rng = []
    if v.lo is not None:
        rng.append(f">= {v.lo:g}")
    if v.hi is not None:
        rng.append(f"<= {v.hi:g}")
    return base + (f" ({', '.join(rng)})" if rng else "")


def parse(v: Var, text: str, name: "str | None" = None):
    """The value of ``text`` for variable ``v``; ConfigError naming it if bad."""
    name = name or v.name
    raw = text
    text = text.strip()

    def bad():
        return ConfigError(f"{name}={raw!r} is not valid: expected {_accepts(v)}")

    if v.kind == "bool":
        t = text.lower()
        if t in ("1", "yes", "true", "on"):
            return True
        if t in ("0", "no", "false", "off"):
            return False
        raise bad()
    if v.kind == "choice":
        t = dict(v.aliases).get(text.lower(), text.lower())
        if t in v.choices:
            return t
        raise bad()
    if v.kind == "str":
        return text
    try:
        if v.kind == "size":
            t = text.upper().removesuffix("IB").removesuffix("B")
            scale = _SCALE.get(t[-1:], 1)
            val = float(t[:-1] if scale > 1 else t) * scale
            if val != int(val):
                raise ValueError
            val = int(val)
        elif v.kind == "int":
            val = int(text)
        elif v.kind == "fraction":
            val = float(text)
            if not 0.0 <= val <= 1.0:
                raise ValueError
        elif v.kind == "seconds":
            val = float(text)
            if not (val > 0 or (val == 0 and v.lo == 0)):   # lo=0: 0 turns it off
                raise ValueError
        else:
            raise AssertionError(v.kind)
    except (ValueError, OverflowError):
        raise bad() from None
    if (v.lo is not None and val < v.lo) or (v.hi is not None and val > v.hi):
        raise bad()
    return val


#: defaults that a layer chose for this process over the declared ones (prefer())
_PREFERRED: dict = {}


def prefer(name: str, value) -> None:
    """Make ``value`` the default of ``name`` in this process: a layer's
    choice (the torch backend paces its connections); a value in the
    environment still wins."""
    if declared(name) is None:
        raise KeyError(f"{name} is not a declared erdmampi variable (erdmampi/config.py)")
    _PREFERRED[name] = value


def get(name: str, env=None, default=None):
    """The parsed value of ``name`` in ``env`` (os.environ), else its default
    (or ``default`` when given): the one a layer preferred (:func:`prefer`),
    else the declared one."""
    env = os.environ if env is None else env
    v = declared(name)
    if v is None:
        raise KeyError(f"{name} is not a declared erdmampi variable (erdmampi/config.py)")
    text = env.get(name)
    if text is None or not text.strip():
        if default is not None:
            return default
        return _PREFERRED.get(name, v.default)
    return parse(v, text, name)


def validate(env=None):
    """``(errors, warnings)`` for every ERDMA_* variable in ``env``: a bad value
    is an error; an unknown name a warning with the nearest declared one."""
    env = os.environ if env is None else env
    errors, warnings = [], []
    for name in sorted(k for k in env if k.startswith("ERDMA_")):
        v = declared(name)
        if v is None:
            near = difflib.get_close_matches(name, list(VARS), n=1, cutoff=0.8)
            warnings.append(f"{name} is not an erdmampi variable"
                            + (f" (did you mean {near[0]}?)" if near else ""))
            continue
        if env[name].strip():
            try:
                parse(v, env[name], name)
            except ConfigError as e:
                errors.append(str(e))
    return errors, warnings


def _fmt_default(v: Var) -> str:
    if v.default is None:
        return "-"
    if v.kind == "bool":
        return "1" if v.default else "0"
    if v.kind == "size" and isinstance(v.default, int) and v.default:
        for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
            if v.default % scale == 0:
                return f"{v.default // scale}{unit}"
    if isinstance(v.default, float) and v.default.is_integer():
        return f"{v.default:g}"
    return str(v.default) if v.default != "" else '""'


def markdown() -> str:
    """The reference table (docs/config.md), from the declarations."""
    out = ["# Configuration: every ERDMA_* variable", "",
           "Generated from `erdmampi/config.py` by `python -m erdmampi.config > "
           "docs/config.md`; a test checks that it is current and that the code reads no "
           "undeclared name. A bad value stops the rank (and `erdmarun`, which checks "
           "its environment and `--env` values before starting ranks) with an error "
           "naming the variable and what it accepts. The guide to the knobs that matter "
           "is [guide/tuning.md](guide/tuning.md).", "",
           "Kinds: *size* takes bytes with K/M/G suffixes (binary); *seconds* a positive "
           "number; *bool* " + _BOOL + ". *Read*: when the value is read (`start-up`: "
           "when the rank starts its engine).", ""]
    for group in VARS_LIST:
        out += [f"## {group[0].topic.capitalize()}", "",
                "| variable | kind | default | read | meaning |", "|---|---|---|---|---|"]
        for v in group:
            kind = v.kind + (f": {', '.join(v.choices)}" if v.choices else "")
            name = f"`{v.name}<NAME>`" if v.prefix else f"`{v.name}`"
            out.append(f"| {name} | {kind} | {_fmt_default(v)} | {v.read} | {v.meaning} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
