"""atheris harness: the rendezvous store's frame codec, server and client reply parser
(erdmampi.rendezvous, erdmampi.launcher.store_server).

Each input is, by its first byte, either raw bytes or a run of well-formed
request frames built from it (so the fuzzer reaches the operations), sent to
a server connection over a real socketpair and served by the server's own read
path (``_readable``: frame limits, buffers, dispatch, waiters), on a
connection that has or has not authenticated. The server may answer or close
the connection, never raise; afterwards its spaces stay within their quotas
and nothing of the connection is left behind. The same bytes also go to
``unpack_fields`` (only StoreError; what it accepts re-encodes to the same
bytes) and, as a server's reply, to the client's ``read_frame`` (only
StoreError; never a body over its limit).

    python fuzz/py/fuzz_store.py -max_total_time=60 /tmp/new fuzz/corpus/store
"""
import logging
import os
import selectors
import socket
import sys
import time

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

with atheris.instrument_imports():
    from erdmampi import rendezvous as rz
    try:
        from erdmampi.launcher import store_server as ss
    except ImportError:      # a source tree that is not installed: launcher/ is the package
        import importlib.util
        _root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
        _spec = importlib.util.spec_from_file_location(
            "erdmampi_launcher_store_server", os.path.join(_root, "launcher", "store_server.py"))
        ss = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(ss)

logging.getLogger("erdmampi.discovery").setLevel(logging.CRITICAL)   # refusals are expected

_LIMITS = dict(max_keys=16, max_bytes=32 << 10, max_total_bytes=128 << 10, max_spaces=4)
_SPACE = b"fuzz-space-0000"
_SERVER = None
_KEYS = [b"k", b"ep/0", b"ep/1", b"n", b"", b"\xff" * 3]


def _server():
    global _SERVER
    if _SERVER is None:
        _SERVER = ss.StoreServer("127.0.0.1", 0, **_LIMITS)   # never started: driven here
        with _SERVER._lock:
            _SERVER._spaces[_SPACE] = {"data": {}, "key": bytes(32), "used": time.monotonic(),
                                       "bytes": 0}
    return _SERVER


def _frames(fdp):
    out = []
    for _ in range(fdp.ConsumeIntInRange(1, 8)):
        op = fdp.ConsumeIntInRange(0, 11)
        key = (fdp.PickValueInList(_KEYS) if fdp.ConsumeBool()
               else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 4)))
        num = fdp.PickValueInList([b"0", b"1", b"-1", b"5", b"x", b"9" * 70, b"", b"20"])
        fields = {
            rz.OP_SET: lambda: [key, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 3000))],
            rz.OP_GET: lambda: [key, num],
            rz.OP_ADD: lambda: [key, num],
            rz.OP_WAIT: lambda: [num] + [fdp.PickValueInList(_KEYS)
                                         for _ in range(fdp.ConsumeIntInRange(0, 3))],
            rz.OP_CHECK: lambda: [key],
            rz.OP_DELETE: lambda: [key],
            rz.OP_AUTH: lambda: [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 140))],
            rz.OP_PROVE: lambda: [fdp.ConsumeBytes(32), fdp.ConsumeBytes(64),
                                  fdp.ConsumeBytes(32)][:fdp.ConsumeIntInRange(0, 4)],
        }.get(op, lambda: [fdp.ConsumeBytes(8)])()
        out.append(rz.encode_frame(op, fields))
    return b"".join(out)


def _drain(sock):
    try:
        while sock.recv(1 << 16):
            pass
    except (BlockingIOError, InterruptedError, ConnectionResetError):
        pass


def _serve(srv, data, authenticated):
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    conn = ss._Conn(a, ("fuzz", 0), time.monotonic())
    if authenticated:
        conn.space = _SPACE
    with srv._lock:
        srv._conns.add(conn)
        srv._per_ip[conn.ip] = srv._per_ip.get(conn.ip, 0) + 1
    srv._set_events(conn, selectors.EVENT_READ)
    try:
        try:
            b.sendall(data)
        except BlockingIOError:      # more than the socket buffer: the rest is cut off
            pass
        b.shutdown(socket.SHUT_WR)
        for _ in range(len(data) + 16):
            if conn.sock is None or conn.wait is not None:
                break
            srv._readable(conn)
            _drain(b)
            if conn.out:
                srv._flush(conn)
    finally:
        srv._close(conn)
        b.close()
    with srv._lock:
        assert not srv._conns and not srv._per_ip and not srv._waiters and not srv._nwaiting
        assert srv._total <= _LIMITS["max_total_bytes"]
        for sp in list(srv._spaces.values()) + [{"data": srv._data, "bytes": srv._open_bytes}]:
            assert len(sp["data"]) <= _LIMITS["max_keys"]
            assert sp["bytes"] <= _LIMITS["max_bytes"]
            assert sp["bytes"] == sum(len(k) + len(v) + ss._KEY_OVERHEAD
                                      for k, v in sp["data"].items())
        if srv._total > _LIMITS["max_total_bytes"] // 2:     # start afresh now and then
            srv._data.clear()
            srv._open_bytes = 0
            for sp in srv._spaces.values():
                sp["data"].clear()
                sp["bytes"] = 0
            srv._total = 0


class _ReplySock:
    """What a (hostile) server sends, as the client's socket sees it."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def settimeout(self, t):
        pass

    def recv(self, n):
        chunk = self.data[self.pos:self.pos + max(1, min(n, 7))]   # short reads
        self.pos += len(chunk)
        return chunk


def TestOneInput(data):
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    authenticated = bool(mode & 1)
    raw = _frames(fdp) if mode & 2 else fdp.ConsumeBytes(len(data))

    try:
        code, fields = rz.unpack_fields(raw)
        assert rz.pack_fields(code, fields) == raw
    except rz.StoreError:
        pass

    limit = rz.MAX_FRAME_UNAUTH
    try:
        reply = rz.read_frame(_ReplySock(raw), deadline=time.monotonic() + 10, limit=limit)
    except rz.StoreError:
        reply = None
    if reply is not None:
        assert 0 <= reply[0] < 256 and sum(4 + len(f) for f in reply[1]) < limit

    _serve(_server(), raw, authenticated)


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
