"""atheris harness: the DHT's message decoder and a node's handling of queries and
answers (erdmampi.dht).

Raw bytes, or a JSON message built from the input (so the fuzzer reaches past the
JSON parser), go to ``dht.decode``, which may raise only DhtProtocolError; decoded
messages must have the documented types. Every input is also handed to a live
node's datagram handler (``DhtNode._handle``, the receive loop's body): it may raise
only DhtProtocolError and must keep its storage within its caps.

    python fuzz/py/fuzz_dht.py -max_total_time=60 /tmp/new fuzz/corpus/dht
"""
import base64
import hashlib
import json
import os
import sys

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

with atheris.instrument_imports():
    from erdmampi import dht

_NODE = None
_SIGNER = None
_KEYS = ["y", "t", "id", "q", "a", "c", "r", "e", "tok", "target", "key", "value", "pk",
         "kh", "sig", "token", "rep", "nodes", "values", "trunc"]


def _node():
    global _NODE, _SIGNER
    if _NODE is None:
        _NODE = dht.DhtNode("127.0.0.1", 0, max_bytes=64 << 10, max_source_bytes=16 << 10,
                            max_key_bytes=8 << 10, rate=1e9, burst=1e9)
        _SIGNER = dht.DhtKey(bytes(32))
    return _NODE


def _value(fdp, depth):
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 3 else 5)
    if kind == 0:
        return fdp.ConsumeInt(8)
    if kind == 1:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 80))
    if kind == 2:
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40)).hex()
    if kind == 3:
        return fdp.ConsumeBytes(20).hex().ljust(40, "0")
    if kind == 4:
        return fdp.PickValueInList([None, True, False, 1.5, "", "q", "r", "e", "ping",
                                    "find_node", "find_value", "store", "127.0.0.1",
                                    "evil.example", 65535, 0, -1])
    if kind == 5:
        return base64.b64encode(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 64))).decode()
    if kind in (6, 7):
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {fdp.PickValueInList(_KEYS): _value(fdp, depth + 1)
            for _ in range(fdp.ConsumeIntInRange(0, 6))}


def _check_decoded(m):
    assert m["y"] in ("q", "r", "e") and isinstance(m["t"], str)
    assert isinstance(m["id"], bytes) and len(m["id"]) == dht.ID_BYTES
    if m["y"] == "q":
        assert isinstance(m["q"], str) and isinstance(m["a"], dict)
        for k in ("target", "key", "value", "pk", "kh", "sig"):
            assert k not in m["a"] or isinstance(m["a"][k], bytes)
        assert len(m["a"].get("value", b"")) <= dht.MAX_VALUE
    elif m["y"] == "r":
        r = m["r"]
        for nid, (host, port) in r["nodes"]:
            assert len(nid) == dht.ID_BYTES and isinstance(host, str) and 0 < port < 65536
        for v, sig in r["values"]:
            assert isinstance(v, bytes) and len(sig) == 64


def TestOneInput(data):
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 3)
    if mode == 0:
        raw = fdp.ConsumeBytes(len(data))
    else:
        msg = {"y": fdp.PickValueInList(["q", "r", "e", "x"]), "t": "aabbccddeeff",
               "id": fdp.ConsumeBytes(20).hex().ljust(40, "0")}
        if msg["y"] == "q":
            q = fdp.PickValueInList(["ping", "find_node", "find_value", "store", "other"])
            msg.update(q=q, c=fdp.ConsumeIntInRange(0, 1), a=_value(fdp, 1))
            if mode == 3 and q == "store":
                # a well-formed, signed store, so the storage path runs
                _node()
                key = fdp.ConsumeBytes(8)
                value = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 9000))
                kid = dht.key_id(key, _SIGNER)
                msg["a"] = {"key": kid.hex(), "value": base64.b64encode(value).decode(),
                            "pk": _SIGNER.public.hex(), "kh": hashlib.sha256(key).hexdigest(),
                            "sig": _SIGNER.sign(kid, value).hex(),
                            "token": _NODE._token(("127.0.0.1", 9)),
                            "rep": fdp.ConsumeIntInRange(0, 1)}
        else:
            msg["r" if msg["y"] == "r" else "e"] = _value(fdp, 1)
            if fdp.ConsumeBool():
                msg["tok"] = _value(fdp, 2)
        for _ in range(fdp.ConsumeIntInRange(0, 2)):
            msg[fdp.PickValueInList(_KEYS)] = _value(fdp, 1)
        raw = json.dumps(msg).encode()
    try:
        m = dht.decode(raw)
    except dht.DhtProtocolError:
        m = None
    if m is not None:
        _check_decoded(m)
    node = _node()
    try:
        node._handle(raw, ("127.0.0.1", 9))
    except dht.DhtProtocolError:
        pass
    with node._lock:
        assert node._bytes <= node.max_bytes
        assert all(b <= node.max_source_bytes for b in node._by_source.values())
        for item in node._data.values():
            assert len(item.vals) <= dht.MAX_VALUES_PER_KEY
            assert item.nbytes <= node.max_key_bytes


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
