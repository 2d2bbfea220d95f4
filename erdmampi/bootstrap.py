"""Start this rank's engine from the environment contract (docs/design.md).

Reads rank/size (erdmarun's ERDMA_*, or Slurm / Open MPI / MPICH-PMI
variables), publishes this rank's QUIC endpoint and certificate fingerprint
in the rendezvous store, reads everyone else's and connects the full mesh.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time

from . import config as _config
from ._engine import Engine, cpu_settle

_RANK_SIZE_VARS = [
    ("ERDMA_RANK", "ERDMA_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
]

_world = None
_info: dict = {}
_turn_keeper = None


def _nat_config(env):
    """NAT traversal settings (ERDMA_STUN / ERDMA_TURN / ERDMA_NAT), or None."""
    if not any(env.get(v) for v in ("ERDMA_STUN", "ERDMA_TURN", "ERDMA_NAT")):
        return None  # the common case imports nothing of erdmampi.nat
    from .nat.paths import nat_config
    return nat_config(env)


def _first_server(cfg):
    from .nat.paths import first_server
    return first_server(cfg)


def _cfg(name: str, default=None, env=None):
    """A declared variable (erdmampi/config.py), parsed and validated."""
    return _config.get(name, env, default)


def rank_and_size(env=os.environ) -> tuple[int, int]:
    """(rank, size) from the first launcher whose variables are set; (0, 1) if none."""
    for rk, sk in _RANK_SIZE_VARS:
        if rk in env and sk in env:
            try:
                rank, size = int(env[rk]), int(env[sk])
            except ValueError:
                raise ValueError(f"{rk}/{sk} must be integers, got {env[rk]!r}/{env[sk]!r}") from None
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f"{rk}={rank} is not a rank of {sk}={size}")
            return rank, size
    return 0, 1


def _host_id() -> str:
    """Names this machine (not just this hostname): hostname plus boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{socket.gethostname()}/{f.read().strip()[:8]}"
    except OSError:
        return socket.gethostname()


# Engine.create tuning keywords and their variables (docs/design.md)
_TUNING_ENV = {
    "stream_window": "ERDMA_STREAM_WINDOW", "conn_window": "ERDMA_CONN_WINDOW",
    "max_stream_window": "ERDMA_MAX_STREAM_WINDOW", "max_conn_window": "ERDMA_MAX_CONN_WINDOW",
    "sock_buf": "ERDMA_SOCK_BUF", "data_streams": "ERDMA_DATA_STREAMS", "lanes": "ERDMA_LANES",
    "chunk_size": "ERDMA_CHUNK", "shm_eager_limit": "ERDMA_SHM_EAGER_LIMIT",
    "shm_bulk_cma_min": "ERDMA_SHM_BULK_CMA", "shm_p2p_cma_min": "ERDMA_SHM_P2P_CMA",
    "shm_p2p_split_min": "ERDMA_SHM_P2P_SPLIT",
    "unexpected_max": "ERDMA_UNEXPECTED_MAX", "recv_alloc_max": "ERDMA_RECV_ALLOC_MAX",
    "shm_unexpected_max": "ERDMA_SHM_UNEXPECTED_MAX",
}


def _env_size(name: str, env=None):
    """A size variable (K/M/G suffixes); None if unset."""
    return _cfg(name, None, env)


def _pktio_opts(env) -> dict:
    """Packet I/O backend keywords (ERDMA_PKTIO=udp|dpdk, ERDMA_DPDK_*; docs/dpdk.md)."""
    kind = _cfg("ERDMA_PKTIO", env=env)
    if kind == "udp":
        return {}
    if kind == "dpdk" and not env.get("ERDMA_BIND"):
        raise ValueError("ERDMA_PKTIO=dpdk needs ERDMA_BIND: the DPDK endpoint's own IPv4 "
                         "address (one the kernel does not have, on the port's subnet)")
    return dict(pktio=kind, dpdk_eal=env.get("ERDMA_DPDK_EAL", ""),
                dpdk_port=_cfg("ERDMA_DPDK_PORT", env=env),
                dpdk_queue=_cfg("ERDMA_DPDK_QUEUE", env=env),
                dpdk_prefix=_cfg("ERDMA_DPDK_PREFIX", env=env),
                dpdk_poll_us=_cfg("ERDMA_DPDK_POLL_US", env=env),
                dpdk_gateway=env.get("ERDMA_DPDK_GATEWAY", ""),
                dpdk_neigh=env.get("ERDMA_DPDK_NEIGH", ""))


def _route_addr(host: str, port: int) -> str:
    """The local address that routes to the rendezvous host."""
    from .nat.port import route_source
    return route_source(host, port) or "127.0.0.1"


def _require_secret(env, rank: int, size: int) -> None:
    """Fail closed: bootstrapping through a rendezvous without a job secret lets
    anyone who reaches it forge the records (and pin its own certificate as a
    rank), so it needs an explicit opt-out."""
    from . import jobauth
    if jobauth.load_secret(env) is not None:
        return
    if not jobauth.insecure(env):
        raise RuntimeError(
            f"rank {rank} of {size}: no job secret. Without one, anyone who reaches the "
            f"rendezvous can read and forge this job's records and join it as a rank. Give "
            f"every rank the same secret: ERDMA_JOB_SECRET=<hex> or ERDMA_JOB_SECRET_FILE="
            f"<file> (make one with: python -m erdmampi.jobauth; erdmarun does this for its "
            f"own jobs), or set ERDMA_INSECURE=1 (erdmarun --insecure) to run without "
            f"authentication")
    if rank == 0:
        sys.stderr.write("erdmampi: warning: ERDMA_INSECURE=1: bootstrapping without a job "
                         "secret; anyone who reaches the rendezvous can read and forge the "
                         "job's records\n")
        sys.stderr.flush()


def init_world() -> Engine:
    """Create and connect COMM_WORLD's engine (idempotent)."""
    global _world
    if _world is not None:
        return _world
    env = os.environ
    t_start = time.monotonic()
    errors, _ = _config.validate(env)
    if errors:
        raise _config.ConfigError("; ".join(errors))
    rank, size = rank_and_size(env)
    rdv = env.get("ERDMA_RENDEZVOUS")
    host_id = env.get("ERDMA_HOST") or _host_id()
    opts = dict(
        cc=_cfg("ERDMA_CC", env=env),
        eager_limit=_cfg("ERDMA_EAGER_LIMIT", env=env),
        idle_timeout=_cfg("ERDMA_TIMEOUT", env=env),
        connect_timeout=_cfg("ERDMA_CONNECT_TIMEOUT", env=env),
        max_udp_payload=_cfg("ERDMA_MAX_UDP_PAYLOAD", env=env),
        spin_us=_cfg("ERDMA_SPIN_US", env=env),
        verbose=_cfg("ERDMA_VERBOSE", env=env),
        **{name: _cfg(var, env=env) for name, var in _TUNING_ENV.items()},
        **_pktio_opts(env),
    )
    hosts = [host_id]
    if size == 1:
        eng = Engine.create(0, 1, bind=env.get("ERDMA_BIND", "127.0.0.1"), **opts)
        eng.connect()
    else:
        if not (rdv or env.get("ERDMA_DHT")):
            raise RuntimeError(
                f"rank {rank} of {size}: no rendezvous address. Start the job with erdmarun, "
                "or set ERDMA_RENDEZVOUS=host:port of a running store "
                "(erdmarun --serve-rendezvous HOST:PORT) or ERDMA_DHT=host:port of DHT peers")
        _require_secret(env, rank, size)
        from .discovery import job_id, open_store
        jobid = job_id(env)
        nat = _nat_config(env)
        store = open_store(env, timeout=opts["connect_timeout"])
        try:
            if env.get("ERDMA_BIND"):
                bind = env["ERDMA_BIND"]
            elif nat is not None and _first_server(nat):
                from .nat.paths import bind_address
                bind = bind_address(nat) or _route_addr(*_first_server(nat))
            elif rdv or env.get("ERDMA_DHT"):
                # the address that routes to the rendezvous (or the first DHT peer)
                first = rdv or env["ERDMA_DHT"].split(",")[0]
                rhost, _, rport = first.strip().rpartition(":")
                bind = _route_addr(rhost.strip("[]"), int(rport))
            else:
                bind = "0.0.0.0"
            if nat is not None:
                opts.update(keepalive=_cfg("ERDMA_KEEPALIVE", 15.0, env),
                            path_timeout=_cfg("ERDMA_PATH_TIMEOUT", env=env))
            eng = Engine.create(rank, size, bind=bind, port=_cfg("ERDMA_PORT", env=env), **opts)
            addr, _, port = eng.local_addr.rpartition(":")
            store.set(f"ep/{rank}", json.dumps({"addr": addr.strip("[]"), "port": int(port),
                                                "fp": eng.fingerprint, "host": host_id}).encode())
            hosts, fps = [], {}
            # one deadline for all the records: a slow (or hostile) store cannot
            # stretch the bootstrap to size x ERDMA_CONNECT_TIMEOUT
            deadline = time.monotonic() + opts["connect_timeout"]
            for r in range(size):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"rank {rank} of {size}: the rendezvous records of ranks "
                        f"{r}..{size - 1} did not all arrive within ERDMA_CONNECT_TIMEOUT="
                        f"{opts['connect_timeout']:g} s (store {rdv or env.get('ERDMA_DHT')})")
                rec = json.loads(store.get(f"ep/{r}", timeout=left))
                hosts.append(rec["host"])
                fps[r] = rec["fp"]
                _info.setdefault("endpoints", {})[r] = f"{rec['addr']}:{rec['port']}"
                if r != rank and nat is None:
                    eng.set_peer(r, rec["addr"], rec["port"], rec["fp"])
            if nat is not None:
                global _turn_keeper
                from .nat.paths import TurnKeeper, install_paths
                res = install_paths(eng, store, rank, size, nat,
                                    {r: fp for r, fp in fps.items() if r != rank},
                                    opts["connect_timeout"])
                _info["paths"] = {r: pr.describe() for r, pr in res.items()}
                if res.turn is not None:
                    _turn_keeper = TurnKeeper(res.turn)
            local = [r for r in range(size) if hosts[r] == host_id]
            if len(local) > 1 and _cfg("ERDMA_SHM", env=env):
                eng.shm_setup(jobid, local, _cfg("ERDMA_SHM_RING", env=env),
                              cma=_cfg("ERDMA_SHM_CMA", env=env))
            eng.connect()
        finally:
            store.close()
    local = [r for r in range(size) if hosts[r] == host_id]
    _info.update(
        host=host_id, hosts=hosts, local_rank=local.index(rank), local_size=len(local),
        appnum=_cfg("ERDMA_APPNUM", env=env),
        universe_size=_cfg("ERDMA_UNIVERSE_SIZE", size, env),
        bootstrap_seconds=time.monotonic() - t_start,
    )
    # the records' ChaCha20-Poly1305 (OpenSSL, in the cryptography wheel)
    # leaves the AVX upper halves in use: np.empty then took 2x as long
    cpu_settle()
    _world = eng
    return eng


def world_info() -> dict:
    """appnum, universe_size, local_rank, local_size, host, hosts (by world rank)."""
    if _world is None:
        init_world()
    return dict(_info)


def shutdown_world(timeout: float = 10.0) -> None:
    global _turn_keeper
    if _turn_keeper is not None:
        _turn_keeper.close()
        _turn_keeper = None
    if _world is not None:
        _world.shutdown(timeout)
