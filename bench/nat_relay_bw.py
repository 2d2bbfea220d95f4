"""One QUIC connection's throughput between two NAT-bed sites: direct, through
coturn over UDP, and from a UDP-blocked site through coturn over TCP and TLS
(the datagram<->stream shim of erdmampi/nat/turn_stream.py); and, as the
yardstick for the relayed settings, what coturn forwards of a plain UDP flow
(`coturn-flow`: 1452-byte ChannelData messages from a symmetric-NAT site to a
public host, sent by bench/udpflow.c with sendmmsg as fast as one core can,
counted by its receiver: MB/s of UDP payload that arrived).

    sudo python -m bench.nat_relay_bw [--mib 64] [--msg-mib 4] [--runs 3] [--rates 0,100mbit]

``--rates``: each rate is a bed of its own in which the sending site's uplink
(its router's public side) is limited with tbf, so the link, not the shared
CPU, sets what a flow can carry; the plain UDP flow and QUIC then meet the
same bottleneck.  ``0`` leaves the bed unshaped (CPU-bound on a small machine).

Each setting is a two-rank job (one `erdmarun --rendezvous` per site); rank
``--sender`` (0) sends ``--mib`` MiB in ``--msg-mib`` MiB messages to the other
(after a warm-up message), which answers with one byte; MB/s = bytes / time of the whole
exchange.  Prints one line per run and a JSON summary.  Needs root, nft,
coturn and openssl (the NAT bed).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERDMARUN = [sys.executable, "-m", "erdmampi.launcher"]
RDV_PORT = 7412

SETTINGS = {
    # name: (site kinds, TURN URI per site ("udp" = the plain form), TLS port)
    "direct": (("full_cone", "full_cone"), ("udp", "udp")),
    "relay-udp": (("symmetric", "symmetric"), ("udp", "udp")),
    "relay-tcp": (("udp_blocked", "full_cone"), ("tcp", "udp")),
    "relay-tls": (("udp_blocked", "full_cone"), ("tls", "udp")),
    "coturn-flow": (("symmetric", "none"), None),
}
FLOW_SRC = os.path.join(ROOT, "bench", "udpflow.c")
FLOW_PORT = 40000


def _flow_exe(tmpdir):
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("nat_relay_bw: no C compiler for bench/udpflow.c")
    exe = os.path.join(tmpdir, "udpflow")
    subprocess.run([cc, "-O2", "-Wall", "-o", exe, FLOW_SRC], check=True)
    return exe


def run_flow(bed, seconds=4.0, payload=1452):
    """coturn-flow: MB/s of UDP payload coturn delivered to the public host."""
    from erdmampi.nat.port import SocketPort
    from erdmampi.nat.turn import TurnClient
    from erdmampi.testing.natbed import TURN_PASSWORD, TURN_USER
    exe = _flow_exe(str(bed.tmpdir))
    dst = bed.host(1).addr
    rx = bed.popen((1, 0), [exe, "recv", dst, FLOW_PORT, seconds], stdout=subprocess.PIPE,
                   text=True)
    assert rx.stdout.readline().strip() == "ready"
    sock = bed.socket((0, 0))
    try:
        turn = TurnClient(SocketPort(sock=sock), bed.turn_server, TURN_USER, TURN_PASSWORD)
        turn.allocate()
        turn.create_permission([(dst, 0)])
        ch = turn.channel_bind((dst, FLOW_PORT))
        tx = bed.popen((0, 0), [exe, "send", sock.fileno(), *bed.turn_server, ch, payload,
                                seconds + 1.0], stdout=subprocess.PIPE, text=True,
                       pass_fds=[sock.fileno()])
        sent = tx.communicate(timeout=60)[0].split()
        got = rx.communicate(timeout=60)[0].split()
    finally:
        sock.close()
    n_sent, secs_sent = int(sent[1]), float(sent[3])
    return {"mb_s": float(got[4]), "route": "relay", "paths": {},
            "offered_mb_s": round(n_sent * payload / secs_sent / 1e6, 1),
            "datagrams": int(got[2])}


def rank_main(mib: int, msg_mib: int, sender: int = 0):
    import numpy as np

    from erdmampi import MPI, bootstrap
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    other = 1 - sender
    buf = np.ones(msg_mib << 20, np.uint8) if rank == sender else np.empty(msg_mib << 20, np.uint8)
    n = max(1, mib // msg_mib)
    one = np.zeros(1, np.uint8)
    for it in range(2):                    # a warm-up message, then the timed run
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(1 if it == 0 else n):
            if rank == sender:
                comm.Send(buf, dest=other)
            else:
                comm.Recv(buf, source=sender)
        if rank == sender:
            comm.Recv(one, source=other)
        else:
            comm.Send(one, dest=sender)
        dt = time.perf_counter() - t0
    route = bootstrap._world.peer_route(1 - rank)
    if rank == sender:
        print("NATBW " + json.dumps({"mb_s": n * (msg_mib << 20) / dt / 1e6, "route": route,
                                     "paths": bootstrap.world_info().get("paths", {})}),
              flush=True)


def run_setting(bed, name, mib, msg_mib, secret_file, rdv, sender=0):
    from erdmampi.testing.natbed import TURN_PASSWORD, TURN_USER
    (_, transports) = SETTINGS[name]
    h, port = bed.turn_server
    cert, _ = bed.tls_cert()
    jobid = "bw" + secrets.token_hex(4)
    procs = []
    for site, tr in enumerate(transports):
        env = dict(os.environ, PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
                   ERDMA_HOST=f"bw-site{site}", ERDMA_CONNECT_TIMEOUT="40",
                   ERDMA_STUN=",".join(f"{a}:{b}" for a, b in bed.stun_servers))
        env.pop("ERDMA_JOB_SECRET", None)
        env["ERDMA_TURN"] = {
            "udp": f"{TURN_USER}:{TURN_PASSWORD}@{h}:{port}",
            "tcp": f"turn:{TURN_USER}:{TURN_PASSWORD}@{h}:{port}?transport=tcp",
            "tls": f"turns:{TURN_USER}:{TURN_PASSWORD}@{h}:443"}[tr]
        if tr == "tls":
            env["ERDMA_TURN_CA"] = cert
        argv = [*ERDMARUN, "--rendezvous", rdv, "--job-id", jobid, "-n", "2", "--ranks",
                f"{site}-{site}", "--secret-file", str(secret_file), "--connect-timeout", "40",
                "--timeout", "180", sys.executable, "-m", "bench.nat_relay_bw", "--rank",
                "--mib", str(mib), "--msg-mib", str(msg_mib),
                "--sender", str(sender)]
        procs.append(bed.popen((site, 0), argv, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    text = "\n".join(outs)
    m = re.search(r"NATBW (\{.*\})", text)
    if not m or any(p.returncode for p in procs):
        raise RuntimeError(f"{name}: the job failed:\n{text[-3000:]}")
    return json.loads(m.group(1))


def run_in_bed(name, rate_bit, a):
    """One run of setting ``name`` in a bed of its own (the sending site's
    uplink shaped to ``rate_bit`` unless 0)."""
    from erdmampi.testing.natbed import NatBed
    kinds, _ = SETTINGS[name]
    with NatBed(list(kinds)) as bed:
        if rate_bit:
            bed.shape_uplink(0 if name == "coturn-flow" else a.sender, rate_bit)
        bed.start_turn(tls_port=443)
        rdv = f"198.18.0.2:{RDV_PORT}"
        secret = bed.tmpdir / "secret"
        secret.write_text(secrets.token_hex(16))
        secret.chmod(0o600)
        p = bed.popen("pub", [*ERDMARUN, "--serve-rendezvous", rdv, "--require-auth",
                              "--admit-file", str(secret)],
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        p.stdout.readline()
        if name == "coturn-flow":
            return run_flow(bed)
        return run_setting(bed, name, a.mib, a.msg_mib, secret, rdv, a.sender)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--msg-mib", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--rates", default="0",
                    help="comma list of the sending site's uplink rates (tbf), e.g. 0,100mbit,400mbit; "
                    "0 = unshaped (default)")
    ap.add_argument("--sender", type=int, default=0, choices=(0, 1),
                    help="the sending rank: 0 (site 0: the UDP-blocked one where there is "
                    "one; its data goes up the TCP/TLS stream) or 1 (down the stream)")
    a = ap.parse_args(argv)
    if a.rank:
        return rank_main(a.mib, a.msg_mib, a.sender)
    from erdmampi.testing.wan import parse_rate
    rates = [(r.strip(), parse_rate(r.strip()) if r.strip() not in ("", "0") else 0)
             for r in a.rates.split(",")]
    results = {}
    for rnd in range(a.runs):                 # settings alternated, one run each per round
        for rname, rbit in rates:
            for name in a.settings.split(","):
                key = name if not rbit else f"{name}@{rname}"
                r = run_in_bed(name, rbit, a)
                results.setdefault(key, []).append(round(r["mb_s"], 1))
                extra = f" (offered {r['offered_mb_s']} MB/s)" if "offered_mb_s" in r else ""
                print(f"round {rnd} {key:18s} {r['mb_s']:7.1f} MB/s  route={r['route']} "
                      f"{r['paths']}{extra}", flush=True)
    print(json.dumps({"mib": a.mib, "msg_mib": a.msg_mib, "sender": a.sender,
                      "rates": a.rates, "MB/s": results,
                      "best": {k: max(v) for k, v in results.items()}}))


if __name__ == "__main__":
    main()
