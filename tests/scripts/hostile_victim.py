"""A real engine (rank 0 of 2) driven over stdin, for tests/test_hostile_peer.py.

It runs in its own process so that a crash shows as a signal and its memory
can be measured.  argv[1]: JSON of Engine.create keywords plus "peer_fp"
(the fingerprint rank 1 must present).  It prints {"host", "port"} and
connects; then every stdin line is a JSON command and gets one JSON line back:

  {"op": "irecv", "tag": T, "cap": N}        post a receive (cap None: allocating)
  {"op": "isend", "tag": T, "n": N, "sync": B}
  {"op": "wait", "h": H, "timeout": S}        -> done, error, nbytes, sha; frees H
  {"op": "abort", "h": H}                     cancel and free H
  {"op": "stats"} / {"op": "rss"} / {"op": "peer_error"} / {"op": "quit"}
"""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from erdmampi import _engine  # noqa: E402
from erdmampi._engine import Engine, EngineError  # noqa: E402

CTX = 7


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    kw = json.loads(sys.argv[1])
    peer_fp = kw.pop("peer_fp")
    kw.setdefault("connect_timeout", 15.0)
    kw.setdefault("idle_timeout", 30.0)
    eng = Engine.create(0, 2, bind="127.0.0.1", port=0, **kw)
    host, port = eng.local_addr.rsplit(":", 1)
    eng.set_peer(1, "127.0.0.1", 9, peer_fp)
    print(json.dumps({"host": host, "port": int(port), "fp": eng.fingerprint}), flush=True)
    eng.connect()
    print(json.dumps({"connected": True}), flush=True)
    reqs = {}
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        out = {}
        if op == "irecv":
            h = len(reqs) + 1
            if cmd.get("cap") is None:
                reqs[h] = (eng.irecv_alloc(1, cmd["tag"], CTX), None)
            else:
                buf = bytearray(cmd["cap"] or 1)
                cbuf = _engine.ffi.from_buffer(buf)
                addr = int(_engine.ffi.cast("uintptr_t", cbuf))
                reqs[h] = (eng.irecv(addr, cmd["cap"], 1, cmd["tag"], CTX, keep=(buf, cbuf)),
                           buf)
            out["h"] = h
        elif op == "isend":
            h = len(reqs) + 1
            buf = bytearray(bytes(range(256)) * (cmd["n"] // 256 + 1))[:cmd["n"]] or bytearray(1)
            cbuf = _engine.ffi.from_buffer(buf)
            addr = int(_engine.ffi.cast("uintptr_t", cbuf))
            reqs[h] = (eng.isend(addr, cmd["n"], 1, cmd["tag"], CTX, sync=cmd.get("sync", False),
                                 keep=(buf, cbuf)), None)
            out["h"] = h
        elif op == "wait":
            req, buf = reqs.pop(cmd["h"])
            try:
                st = req.wait(cmd.get("timeout", 10.0))
            except EngineError as exc:
                out.update(done=exc.code != _engine.ERR_TIMEOUT, error=exc.code)
                if exc.code == _engine.ERR_TIMEOUT:
                    reqs[cmd["h"]] = (req, buf)  # still pending
                    print(json.dumps(out), flush=True)
                    continue
            else:
                data = bytes(req.take()) if buf is None and st.error == 0 else \
                    bytes(buf[:st.nbytes]) if buf is not None else b""
                out.update(done=True, error=st.error, nbytes=st.nbytes,
                           sha=hashlib.sha256(data).hexdigest())
            req.free()  # the engine must hold nothing that points at it now
        elif op == "abort":
            req, _ = reqs.pop(cmd["h"])
            req.abort()
            req.free()
        elif op == "stats":
            out = eng.stats()
        elif op == "rss":
            out["rss"] = rss()
        elif op == "peer_error":
            out["error"] = eng.peer_error(1)
        elif op == "quit":
            print(json.dumps({"bye": True}), flush=True)
            os._exit(0)  # no graceful shutdown: the peer may be anything
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
