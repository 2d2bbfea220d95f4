"""A compact Kademlia DHT over UDP (pure Python, threads, JSON messages).

Used for serverless discovery: each site's ``erdmarun --dht`` runs a node,
bootstrapped from any node already known; the job's rendezvous records are
stored on the ``K`` nodes whose ids are closest (XOR metric) to the key's id.
Values are opaque bytes: erdmampi stores only sealed records
(:mod:`erdmampi.jobauth`), so a node that forges or alters a value is found
out by the reader, and a key may hold several values (a forger cannot hide
the real one by overwriting it: the reader tries each).

Protocol: one JSON object per UDP datagram (never pickle)::

    query     {"y": "q", "t": TXID, "q": NAME, "id": NODEID, "a": {...}, "c": 0|1}
    response  {"y": "r", "t": TXID, "id": NODEID, "r": {...}}
    error     {"y": "e", "t": TXID, "id": NODEID, "e": "message"}

    ping        {}                             -> {}
    find_node   {"target": ID}                 -> {"nodes": [[ID, host, port], ...]}
    find_value  {"key": ID}                    -> {"values": [b64, ...]} and/or {"nodes": ...}
    store       {"key": ID, "value": b64}      -> {}

Ids are 160-bit, hex; a key's id is SHA-1 of the key. ``"c": 1`` marks a
client node (it queries and stores but is never put into routing tables, e.g.
a short-lived rank process). Contacts are learnt with the address a datagram
came from, so nodes behind a NAT are reached through their mapping.

Kademlia parts: 160 k-buckets of ``K`` contacts (least recently seen first; a
full bucket pings its oldest contact and replaces it only if it is dead),
iterative ``FIND_NODE``/``FIND_VALUE`` with ``ALPHA`` queries in flight,
``STORE`` on the ``K`` closest nodes, values expiring after ``ttl`` unless
republished: a node republishes the values it published every ``republish``
seconds and re-replicates what it holds, so values survive nodes leaving.
"""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import socket
import threading
import time

__all__ = ["DhtNode", "DhtStore", "DhtError", "key_id", "K", "ALPHA"]

K = 8                     # bucket size and replication factor
ALPHA = 3                 # parallel queries per lookup round
ID_BYTES = 20
MAX_DATAGRAM = 60000
MAX_VALUE = 8192          # bytes of one value
MAX_REPLY_VALUES = 40000  # base64 bytes of values in one reply (it must fit a datagram)
MAX_VALUES_PER_KEY = 16
MAX_KEYS = 100000
DEAD_FOR = 30.0           # seconds a node that did not answer is skipped in lookups

log = logging.getLogger("erdmampi.discovery")


class DhtError(RuntimeError):
    """The DHT could not be joined or used."""


def key_id(key) -> bytes:
    """The 160-bit id of a key (SHA-1)."""
    if isinstance(key, str):
        key = key.encode("utf-8")
    return hashlib.sha1(bytes(key)).digest()


def _int(b: bytes) -> int:
    return int.from_bytes(b, "big")


def _dist(a: bytes, b: bytes) -> int:
    return _int(a) ^ _int(b)


def parse_peers(text) -> list:
    """``"h:p,h:p"`` (or a list) -> ``[(host, port), ...]``."""
    if not text:
        return []
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append(item)
            continue
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"DHT peer must be host:port, got {item!r}")
        out.append((host.strip("[]"), int(port)))
    return out


class _Contact:
    __slots__ = ("id", "addr", "seen")

    def __init__(self, nid, addr):
        self.id = nid
        self.addr = addr
        self.seen = time.monotonic()

    def wire(self):
        return [self.id.hex(), self.addr[0], self.addr[1]]


class _Pending:
    __slots__ = ("event", "reply")

    def __init__(self):
        self.event = threading.Event()
        self.reply = None


class DhtNode:
    """One Kademlia node.

    :param host, port: UDP address to bind (port 0: a free one).
    :param client: a client node (not added to others' routing tables).
    :param rpc_timeout: seconds to wait for one answer.
    :param republish: seconds between republishing rounds.
    :param ttl: seconds a stored value lives without being republished.
    """

    def __init__(self, host="0.0.0.0", port=0, client=False, rpc_timeout=1.0,
                 republish=30.0, ttl=3600.0, node_id=None):
        self.id = node_id or os.urandom(ID_BYTES)
        self.client = client
        self.rpc_timeout = rpc_timeout
        self.republish = republish
        self.ttl = ttl
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise DhtError(f"cannot bind the DHT node to {host}:{port}: {e.strerror}") from None
        self._sock.settimeout(0.5)
        self._lock = threading.Lock()
        self._buckets = [[] for _ in range(ID_BYTES * 8)]
        self._data = {}           # key id -> {value: stored_at}
        self._own = {}            # key id -> set(values) this node published
        self._pending = {}        # txid -> _Pending
        self._closed = False
        self._stop = threading.Event()
        self._checking = set()    # contacts being pinged for eviction
        self._dead = {}           # node id -> when it last failed to answer
        self._threads = [threading.Thread(target=self._recv_loop, name="erdma-dht-recv",
                                          daemon=True),
                         threading.Thread(target=self._maintain, name="erdma-dht-maint",
                                          daemon=True)]
        for t in self._threads:
            t.start()

    @property
    def address(self):
        return self._sock.getsockname()[:2]

    def __repr__(self):
        h, p = self.address
        return f"DhtNode({h}:{p}, id={self.id.hex()[:8]}, client={self.client})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- public --

    def bootstrap(self, peers, timeout=30.0):
        """Join through ``peers`` (``[(host, port)]`` or ``"h:p,..."``).

        Retries until one answers (they may start later than this node), then
        looks up its own id to fill the routing table.

        :raises TimeoutError: when no peer answered within ``timeout`` seconds.
        """
        peers = [p for p in parse_peers(peers) if not self._is_self(p)]
        if not peers:
            return 0
        deadline = time.monotonic() + timeout
        answered = 0
        while True:
            replies = self._rpc_many([(p, "ping", {}) for p in peers])
            answered = sum(r is not None for r in replies)
            if answered or time.monotonic() >= deadline:
                break
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if not answered:
            raise TimeoutError(f"no DHT peer answered within {timeout:g} s "
                               f"(tried {', '.join(f'{h}:{p}' for h, p in peers)})")
        self._lookup(self.id)
        return answered

    def put(self, key, value) -> int:
        """Store ``value`` under ``key`` on the K closest nodes; returns how many took it."""
        value = bytes(value)
        if len(value) > MAX_VALUE:
            raise ValueError(f"DHT values are limited to {MAX_VALUE} bytes")
        kid = key_id(key)
        with self._lock:
            self._own.setdefault(kid, set()).add(value)
        return self._publish(kid, value)

    def get_all(self, key, timeout=0.0) -> list:
        """Every value stored under ``key`` (newest first), waiting up to ``timeout`` s.

        :raises TimeoutError: when none was found in time.
        """
        kid = key_id(key)
        deadline = time.monotonic() + (timeout or 0.0)
        delay = 0.05
        while True:
            values = self._find_values(kid)
            if values:
                return values
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"DHT key {key!r} not found within {timeout or 0:g} s")
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)

    def get(self, key, timeout=0.0) -> bytes:
        return self.get_all(key, timeout)[0]

    def contacts(self) -> list:
        """``[(id, (host, port)), ...]`` of the routing table."""
        with self._lock:
            return [(c.id, c.addr) for b in self._buckets for c in b]

    def stored(self) -> int:
        """Number of keys held by this node."""
        with self._lock:
            return len(self._data)

    def republish_now(self):
        """One republish round (also run every ``republish`` seconds)."""
        with self._lock:
            own = [(k, list(v)) for k, v in self._own.items()]
            now = time.monotonic()
            for kid in [k for k, vals in self._data.items()
                        if all(now - t > self.ttl for t in vals.values())]:
                del self._data[kid]
            held = [(k, list(v)) for k, v in self._data.items() if k not in self._own]
        for kid, values in own + held:
            for v in values:
                self._publish(kid, v)

    def close(self):
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        with self._lock:
            for p in self._pending.values():
                p.event.set()
        host, port = self.address
        try:                                     # wake the receiver
            self._sock.sendto(b"", ("127.0.0.1" if host in ("0.0.0.0", "") else host, port))
        except OSError:
            pass
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(2.0)
        self._sock.close()

    # Private: storage

    def _keep(self, kid, value):
        with self._lock:
            vals = self._data.get(kid)
            if vals is None:
                if len(self._data) >= MAX_KEYS:
                    return False
                vals = self._data[kid] = {}
            vals.pop(value, None)
            vals[value] = time.monotonic()       # dicts keep insertion order: newest last
            while len(vals) > MAX_VALUES_PER_KEY:
                del vals[next(iter(vals))]
        return True

    def _local_values(self, kid):
        with self._lock:
            vals = self._data.get(kid)
            return list(reversed(list(vals))) if vals else []

    def _publish(self, kid, value):
        nodes = self._lookup(kid)
        stored = 0
        targets = nodes[:K]
        mine = len(nodes) < K or _dist(self.id, kid) < _dist(nodes[K - 1].id, kid)
        if not self.client and mine:
            self._keep(kid, value)          # this node is one of the K closest itself
            stored += 1
            targets = nodes[:K - 1]
        b64 = base64.b64encode(value).decode()
        for _ in range(2):        # they answered the lookup just now: a silence is a lost packet
            replies = self._rpc_many([(c.addr, "store", {"key": kid.hex(), "value": b64})
                                      for c in targets])
            stored += sum(r is not None for r in replies)
            targets = [c for c, r in zip(targets, replies) if r is None]
            if not targets:
                break
        if not stored:
            self._keep(kid, value)        # alone so far: hold it, republish spreads it
        return stored

    def _find_values(self, kid):
        _, values = self._lookup(kid, want_value=True)
        out = self._local_values(kid)
        for v in values:
            if v not in out:
                out.append(v)
        return out

    # Private: routing table

    def _is_self(self, addr):
        host, port = self.address
        return port == addr[1] and addr[0] in (host, "127.0.0.1", "localhost")

    def _bucket(self, nid):
        d = _dist(self.id, nid)
        return self._buckets[d.bit_length() - 1] if d else None

    def _seen(self, nid, addr):
        """Update the routing table with a node we heard from."""
        if nid == self.id:
            return
        self._dead.pop(nid, None)
        ping_old = None
        with self._lock:
            b = self._bucket(nid)
            if b is None:
                return
            for i, c in enumerate(b):
                if c.id == nid:
                    del b[i]
                    c.addr, c.seen = addr, time.monotonic()
                    b.append(c)
                    return
            if len(b) < K:
                b.append(_Contact(nid, addr))
                return
            oldest = b[0]
            if oldest.id not in self._checking:
                self._checking.add(oldest.id)
                ping_old = oldest
        if ping_old is not None:
            threading.Thread(target=self._evict_check, args=(ping_old, nid, addr),
                             daemon=True).start()

    def _evict_check(self, oldest, nid, addr):
        alive = self._rpc(oldest.addr, "ping", {}) is not None
        with self._lock:
            self._checking.discard(oldest.id)
            b = self._bucket(oldest.id)
            if not alive and b is not None and oldest in b:
                b.remove(oldest)
                if len(b) < K:
                    b.append(_Contact(nid, addr))

    def _forget(self, contact):
        with self._lock:
            self._dead[contact.id] = time.monotonic()
            if len(self._dead) > 4 * K * 20:
                cut = time.monotonic() - DEAD_FOR
                self._dead = {k: t for k, t in self._dead.items() if t > cut}
            b = self._bucket(contact.id)
            if b is not None:
                for c in b:
                    if c.id == contact.id:
                        b.remove(c)
                        break

    def _recently_dead(self, nid):
        t = self._dead.get(nid)
        return t is not None and time.monotonic() - t < DEAD_FOR

    def _closest(self, target, n=K):
        with self._lock:
            allc = [c for b in self._buckets for c in b]
        allc.sort(key=lambda c: _dist(c.id, target))
        return allc[:n]

    def _lookup(self, target, want_value=False):
        """Iterative FIND_NODE (or FIND_VALUE): the K closest live nodes (and values)."""
        short = {c.id: c for c in self._closest(target)}
        queried, alive, values = set(), {}, []
        while True:
            ranked = sorted(short.values(), key=lambda c: _dist(c.id, target))[:K]
            batch = [c for c in ranked if c.id not in queried][:ALPHA]
            if not batch:
                break
            q = "find_value" if want_value else "find_node"
            arg = {"key" if want_value else "target": target.hex()}
            replies = self._rpc_many([(c.addr, q, arg) for c in batch])
            for c, r in zip(batch, replies):
                queried.add(c.id)
                if r is None:
                    short.pop(c.id, None)
                    self._forget(c)
                    continue
                alive[c.id] = c
                if want_value:
                    for v in r.get("values", [])[:MAX_VALUES_PER_KEY]:
                        try:
                            v = base64.b64decode(v, validate=True)
                        except (ValueError, TypeError):
                            continue
                        if v not in values:
                            values.append(v)
                for n in r.get("nodes", [])[:K]:
                    try:
                        nid, addr = bytes.fromhex(n[0]), (str(n[1]), int(n[2]))
                    except (ValueError, TypeError, IndexError):
                        continue
                    if len(nid) == ID_BYTES and nid != self.id and nid not in short \
                            and nid not in queried and not self._recently_dead(nid):
                        short[nid] = _Contact(nid, addr)
            if want_value and values:
                break
        nodes = sorted(alive.values(), key=lambda c: _dist(c.id, target))[:K]
        return (nodes, values) if want_value else nodes

    # Private: RPC

    def _send(self, addr, msg):
        try:
            self._sock.sendto(json.dumps(msg, separators=(",", ":")).encode(), addr)
        except OSError:
            pass

    def _rpc(self, addr, q, args):
        return self._rpc_many([(addr, q, args)])[0]

    def _rpc_many(self, calls):
        """Send the queries together, wait for the answers (None for no answer)."""
        waits = []
        for addr, q, args in calls:
            tx = os.urandom(6).hex()
            p = _Pending()
            with self._lock:
                self._pending[tx] = p
            waits.append((tx, p))
            self._send(addr, {"y": "q", "t": tx, "q": q, "id": self.id.hex(), "a": args,
                              "c": 1 if self.client else 0})
        deadline = time.monotonic() + self.rpc_timeout
        out = []
        for tx, p in waits:
            p.event.wait(max(0.0, deadline - time.monotonic()))
            with self._lock:
                self._pending.pop(tx, None)
            out.append(p.reply)
        return out

    def _recv_loop(self):
        while not self._closed:
            try:
                data, addr = self._sock.recvfrom(MAX_DATAGRAM)
            except socket.timeout:
                continue
            except OSError:
                if self._closed:
                    return
                continue
            try:
                self._handle(data, addr)
            except Exception as e:      # a stranger's garbage must not stop the node
                log.debug("DHT: dropped a bad datagram from %s: %s", addr, e)

    def _handle(self, data, addr):
        msg = json.loads(data)
        if not isinstance(msg, dict):
            return
        nid = bytes.fromhex(msg["id"])
        if len(nid) != ID_BYTES:
            return
        y, tx = msg.get("y"), str(msg.get("t", ""))
        if y in ("r", "e"):
            with self._lock:
                p = self._pending.get(tx)
            if p is not None:
                if y == "r" and isinstance(msg.get("r"), dict):
                    p.reply = msg["r"]
                p.event.set()
                self._seen(nid, addr)
            return
        if y != "q":
            return
        if not msg.get("c"):
            self._seen(nid, addr)
        if self.client:
            return                      # clients answer nothing
        q, a = msg.get("q"), msg.get("a") or {}
        reply = {}
        if q == "ping":
            pass
        elif q == "find_node":
            reply["nodes"] = [c.wire() for c in self._closest(bytes.fromhex(a["target"]))
                              if c.id != nid]
        elif q == "find_value":
            kid = bytes.fromhex(a["key"])
            values, room = [], MAX_REPLY_VALUES
            for v in self._local_values(kid):          # newest first, as many as fit
                enc = base64.b64encode(v).decode()
                if len(enc) > room:
                    break
                values.append(enc)
                room -= len(enc)
            if values:
                reply["values"] = values
            reply["nodes"] = [c.wire() for c in self._closest(kid) if c.id != nid]
        elif q == "store":
            kid = bytes.fromhex(a["key"])
            value = base64.b64decode(a["value"], validate=True)
            if len(kid) != ID_BYTES or len(value) > MAX_VALUE or not self._keep(kid, value):
                self._send(addr, {"y": "e", "t": tx, "id": self.id.hex(), "e": "refused"})
                return
        else:
            self._send(addr, {"y": "e", "t": tx, "id": self.id.hex(), "e": "unknown query"})
            return
        self._send(addr, {"y": "r", "t": tx, "id": self.id.hex(), "r": reply})

    def _maintain(self):
        next_round = time.monotonic() + self.republish
        while not self._stop.wait(0.2):
            if time.monotonic() >= next_round and not self._closed:
                try:
                    self.republish_now()
                except Exception as e:
                    log.debug("DHT: republish failed: %s", e)
                next_round = time.monotonic() + self.republish


class DhtStore:
    """The store interface (``set``/``get``/``get_all``/``check``/``close``) over a DHT node.

    :param node: a :class:`DhtNode` (already bootstrapped).
    :param prefix: prepended to every key.
    :param timeout: default seconds for ``get``.
    :param owns_node: close the node with the store.

    There is no atomic ``add`` (a DHT has no single owner of a key): it raises
    :class:`DhtError`; ``delete`` forgets only what this node published.
    """

    def __init__(self, node, prefix="", timeout=60.0, owns_node=False):
        self.node = node
        self.prefix = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        self.timeout = timeout
        self.owns_node = owns_node

    def __repr__(self):
        return f"DhtStore({self.node!r})"

    def _k(self, key):
        return self.prefix + (key.encode() if isinstance(key, str) else bytes(key))

    def set(self, key, value):
        if isinstance(value, str):
            value = value.encode()
        self.node.put(self._k(key), value)

    def get_all(self, key, timeout=None):
        return self.node.get_all(self._k(key), self.timeout if timeout is None else timeout)

    def get(self, key, timeout=None):
        return self.get_all(key, timeout)[0]

    def check(self, keys):
        keys = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        try:
            for k in keys:
                self.node.get_all(self._k(k), 0)
        except TimeoutError:
            return False
        return True

    def add(self, key, n=1):
        raise DhtError("a DHT has no atomic counter: give each site its ranks explicitly "
                       "(erdmarun --ranks A-B)")

    def delete(self, key):
        kid = key_id(self._k(key))
        with self.node._lock:
            found = self.node._own.pop(kid, None) is not None
            self.node._data.pop(kid, None)
        return found

    def close(self):
        if self.owns_node:
            self.node.close()
