"""A malicious but authenticated rank, for tests of the engine's frame parser.

``Victim`` starts a real engine (rank 0 of 2) in its own process
(tests/scripts/hostile_victim.py) and drives it over a pipe; ``EvilPeer`` is
rank 1: an aioquic client (tests/quic_peer.py) that presents the certificate
the victim expects and then writes arbitrary bytes: any frame header, any
interleaving, truncated frames, on the control stream (0) or on its own
unidirectional data streams (which carry CHUNK frames, docs/wire.md).
"""
from __future__ import annotations

import asyncio
import json
import os
import struct
import subprocess
import sys
import time

from quic_peer import (HELLO, Identity, client, configuration)

EAGER, RTS, CTS, DATA, CHUNK, RATE = 2, 3, 4, 5, 6, 7
FLAG_SYNC, FLAG_CMA, FLAG_CHUNKS, FLAG_SPLIT = 1, 2, 4, 16
CTX = 7
RAW = struct.Struct("<BBHIQQQ")   # type, flags, 0, ctx, bytes 8..15, len, id
HERE = os.path.dirname(os.path.abspath(__file__))


def frame(type: int, *, flags: int = 0, ctx: int = CTX, tag: int = 0, aux: int = 0,
          off: int | None = None, length: int = 0, id: int = 0, payload: bytes = b"") -> bytes:
    """One frame, any field any value (bytes 8..15: tag and aux, or a CHUNK's offset)."""
    mid = off if off is not None else (tag & 0xFFFFFFFF) | ((aux & 0xFFFFFFFF) << 32)
    return RAW.pack(type & 0xFF, flags & 0xFF, 0, ctx & 0xFFFFFFFF, mid & (2**64 - 1),
                    length & (2**64 - 1), id & (2**64 - 1)) + bytes(payload)


class Victim:
    """The engine under attack, in a child process."""

    def __init__(self, peer_fp: str, **engine_kw):
        kw = dict(engine_kw, peer_fp=peer_fp)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "scripts", "hostile_victim.py"), json.dumps(kw)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = json.loads(self._line(20.0))
        self.host, self.port = first["host"], first["port"]
        self.fingerprint = first["fp"]

    def _line(self, timeout: float) -> str:
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise TimeoutError("the victim did not answer within %.0f s" % timeout)
        line = self.proc.stdout.readline()
        if not line:
            raise ConnectionError(f"the victim exited ({self.proc.wait()}): {self.stderr()}")
        return line

    def wait_connected(self, timeout: float = 20.0) -> None:
        assert json.loads(self._line(timeout)) == {"connected": True}

    def call(self, timeout: float = 30.0, **cmd) -> dict:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line(timeout))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return ""
        return self.proc.stderr.read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
                self.proc.wait(5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


class EvilPeer:
    """Rank 1 as an aioquic client that writes whatever it is told to."""

    def __init__(self, proto):
        self.proto = proto
        self.quic = proto._quic
        self._streams: list[int] = []

    def send(self, data: bytes, stream: int = 0, end: bool = False) -> None:
        """Bytes on the control stream (0) or on our data stream number ``stream`` (1..)."""
        sid = 0 if stream == 0 else self.data_stream(stream)
        self.quic.send_stream_data(sid, data, end_stream=end)
        self.proto.transmit()

    def data_stream(self, k: int) -> int:
        while len(self._streams) < k:
            self._streams.append(self.quic.get_next_available_stream_id(is_unidirectional=True))
        return self._streams[k - 1]

    def reset(self, stream: int) -> None:
        sid = 0 if stream == 0 else self.data_stream(stream)
        self.quic.reset_stream(sid, 1)
        self.proto.transmit()

    def hello(self) -> None:
        self.send(frame(HELLO, ctx=1, length=2))

    async def next_frame(self, type: int, timeout: float = 10.0):
        """The next frame of this type the engine sends (others are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            f = await asyncio.wait_for(self.proto.frames.get(), max(0.01, deadline - time.monotonic()))
            if f is None or isinstance(f, Exception):
                raise ConnectionError(f"the engine closed the connection: {f!r}")
            if f.type == type:
                return f

    async def closed(self, timeout: float) -> bool:
        """Whether the engine ends the connection within ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self.proto.wait_closed(), timeout)
            return True
        except asyncio.TimeoutError:
            return self.proto.terminated is not None


async def attack(victim: Victim, identity: Identity, scenario, timeout: float = 40.0):
    """Connect to the victim as rank 1 and run ``await scenario(peer)``."""
    cfg = configuration(True, identity, idle_timeout=30.0)
    cfg.max_stream_data = cfg.max_data = 1 << 24

    async def run():
        async with client(victim.host, victim.port, cfg) as proto:
            peer = EvilPeer(proto)
            peer.hello()
            await peer.next_frame(HELLO)
            await asyncio.to_thread(victim.wait_connected)
            return await scenario(peer)

    return await asyncio.wait_for(run(), timeout)
