"""Small UDP tools the WAN bed runs inside its namespaces (``python -m
erdmampi.testing.udptool CMD``):

* ``echo --port P``: echo every datagram back (prints ``ready``).
* ``ping HOST --port P --count N --size S --interval SEC``: JSON ``{"rtt_ms": [...],
  "sent": N}`` (probes without an answer within ``--timeout`` are left out).
* ``sink --port P --count N --idle SEC``: count distinct sequence numbers until N
  arrived or nothing came for SEC; JSON ``{"received": K}``.
* ``blast HOST --port P --count N --size S --pps R``: send N numbered datagrams.
"""
import argparse
import json
import socket
import struct
import sys
import time


def _echo(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", a.port))
    print("ready", flush=True)
    while True:
        data, peer = s.recvfrom(65536)
        s.sendto(data, peer)


def _ping(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((a.host, a.port))
    s.settimeout(a.timeout)
    rtts = []
    pad = b"\0" * max(0, a.size - 12)
    for i in range(a.count):
        t0 = time.perf_counter_ns()
        s.send(struct.pack("!IQ", i, t0) + pad)
        deadline = time.monotonic() + a.timeout
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except socket.timeout:
                break
            seq, ts = struct.unpack_from("!IQ", data)
            if seq == i:
                rtts.append((time.perf_counter_ns() - ts) / 1e6)
                break
        time.sleep(a.interval)
    print(json.dumps({"rtt_ms": rtts, "sent": a.count}))


def _sink(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", a.port))
    print("ready", flush=True)
    seen = set()
    s.settimeout(None)
    while len(seen) < a.count:
        try:
            data = s.recv(65536)
        except socket.timeout:
            break
        seen.add(struct.unpack_from("!I", data)[0])
        s.settimeout(a.idle)
    print(json.dumps({"received": len(seen)}), flush=True)


def _blast(a):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((a.host, a.port))
    pad = b"\0" * max(0, a.size - 4)
    t0 = time.monotonic()
    for i in range(a.count):
        ahead = t0 + i / a.pps - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        s.send(struct.pack("!I", i) + pad)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m erdmampi.testing.udptool")
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("echo")
    e.add_argument("--port", type=int, default=7)
    p = sub.add_parser("ping")
    p.add_argument("host")
    p.add_argument("--port", type=int, default=7)
    p.add_argument("--count", type=int, default=20)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--interval", type=float, default=0.01)
    p.add_argument("--timeout", type=float, default=5.0)
    k = sub.add_parser("sink")
    k.add_argument("--port", type=int, default=9)
    k.add_argument("--count", type=int, required=True)
    k.add_argument("--idle", type=float, default=2.0)
    b = sub.add_parser("blast")
    b.add_argument("host")
    b.add_argument("--port", type=int, default=9)
    b.add_argument("--count", type=int, required=True)
    b.add_argument("--size", type=int, default=200)
    b.add_argument("--pps", type=float, default=2000)
    a = ap.parse_args(argv)
    {"echo": _echo, "ping": _ping, "sink": _sink, "blast": _blast}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
