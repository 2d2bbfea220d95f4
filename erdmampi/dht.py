"""A compact Kademlia DHT over UDP (pure Python, threads, JSON messages).

Used for serverless discovery: each site's ``erdmarun --dht`` runs a node,
bootstrapped from any node already known; the job's rendezvous records are
stored on the ``K`` nodes whose ids are closest (XOR metric) to the key's id.

Every node may be hostile, and so may anyone who can send it a datagram:

* **Values are signed and keys bound to the signer** (as BEP 44 does for
  mutable items): a key's id is ``SHA-1(PK || SHA-256(key))`` for the
  publisher's Ed25519 public key ``PK`` (:class:`DhtKey`), and each value
  carries ``Ed25519(SK, "erdma-dht/1" \\0 KEYID VALUE)``. A node stores only
  values that verify under a key id bound to their key; a reader checks every
  value it is given. Nobody without the publisher's key can put a value where
  readers look, so forged values cannot push out the genuine one. erdmampi
  derives the key from the job secret (:mod:`erdmampi.discovery`).
* **Write tokens** (as BEP 5 does): every answer carries ``"tok"``, an HMAC of
  the asker's address (IP and port) under a secret that rotates every
  ``TOKEN_ROTATE`` s (the current and the previous secret are accepted). A
  ``store`` is refused without a valid token, so it comes from the address
  that got the token: nobody stores with a forged source address.
* **No amplification**: until a source presents a valid token (``"token"`` in
  the query arguments) its answers are at most ``AMPLIFICATION`` (3) times the
  bytes of its query, as in QUIC: values are left out first, then contacts;
  the answer says ``"trunc": 1`` and the asker repeats the query with the
  token it just got. Only nodes that presented a token or answered a query
  of ours (a ping, for a node that asked without a token) enter the routing table.
* **Rate limits**: a token bucket per source address (``rate`` queries/s,
  ``burst``), in a table of at most ``MAX_SOURCES`` sources; queries over the
  limit are dropped.
* **Bounded storage**: at most ``MAX_VALUES_PER_KEY`` values and
  ``max_key_bytes`` per key (a signer's new value pushes out its own oldest),
  ``max_source_bytes`` per source IP and ``max_bytes`` in all; a store over a
  cap is refused, values expire after ``ttl`` s unless their publisher
  republishes them; a republish round copies at most ``REPLICATE_PER_ROUND``
  values held for others.
* Malformed datagrams raise :class:`DhtProtocolError` in :func:`decode` and
  are dropped; addresses in answers must be IP literals (no name lookups); a
  lookup sends at most ``LOOKUP_QUERIES`` queries, however many ever closer
  contacts the answers name.

Values are opaque bytes; erdmampi stores only sealed records
(:mod:`erdmampi.jobauth`), which readers authenticate again.

Protocol: one JSON object per UDP datagram (never pickle)::

    query     {"y": "q", "t": TXID, "q": NAME, "id": NODEID, "a": {...}, "c": 0|1}
    response  {"y": "r", "t": TXID, "id": NODEID, "r": {...}, "tok": TOKEN}
    error     {"y": "e", "t": TXID, "id": NODEID, "e": "message", "tok": TOKEN}

    ping        {}                             -> {}
    find_node   {"target": ID}                 -> {"nodes": [[ID, ip, port], ...]}
    find_value  {"key": ID}                    -> {"values": [[b64, SIG], ...], "nodes": ...}
    store       {"key": ID, "value": b64, "pk": PK, "kh": KH, "sig": SIG,
                 "rep": 0|1}                   -> {}

Each query's arguments may carry ``"token"`` (the asker's token from an
earlier answer of this node; ``store`` must). Ids are 160-bit hex, ``PK``
(32 bytes), ``KH`` (SHA-256 of the key) and ``SIG`` (64 bytes) hex.
``"rep": 1`` marks a holder's copy (it does not restart the value's ttl, only
the publisher's own stores do). ``"c": 1`` marks a client node (it queries and stores but is never put into
routing tables, e.g. a short-lived rank process). Contacts are learnt with the
address a datagram came from, so nodes behind a NAT are reached through their
mapping.

Kademlia parts: 160 k-buckets of ``K`` contacts (least recently seen first; a
full bucket pings its oldest contact and replaces it only if it is dead),
iterative ``FIND_NODE``/``FIND_VALUE`` with ``ALPHA`` queries in flight,
``STORE`` on the ``K`` closest nodes, values expiring after ``ttl`` unless
republished: a node republishes the values it published every ``republish``
seconds and re-replicates what it holds, so values survive nodes leaving.
"""
from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time

__all__ = ["DhtNode", "DhtStore", "DhtKey", "DhtError", "DhtProtocolError", "decode",
           "key_id", "K", "ALPHA"]

K = 8                     # bucket size and replication factor
ALPHA = 3                 # parallel queries per lookup round
ID_BYTES = 20
MAX_DATAGRAM = 60000
MAX_VALUE = 8192          # bytes of one value
MAX_REPLY_VALUES = 40000  # base64 bytes of values in one reply (it must fit a datagram)
MAX_VALUES_PER_KEY = 16
MAX_KEY_BYTES = 64 * 1024           # stored bytes per key (values and their overhead)
MAX_SOURCE_BYTES = 2 * 1024 * 1024  # stored bytes per source IP
MAX_BYTES = 32 * 1024 * 1024        # stored bytes in all
VALUE_OVERHEAD = 192      # bytes a stored value is charged beyond its own (signature, books)
AMPLIFICATION = 3         # answer bytes per query byte for a source without a token
RATE = 500.0              # queries/s per source address
BURST = 1000              # queries a source may send at once
LOOKUP_QUERIES = 64       # queries one lookup may send (hostile answers cannot prolong it)
MAX_SOURCES = 4096        # rate-limit buckets (and remembered tokens)
TOKEN_ROTATE = 300.0      # seconds between write-token secrets
REPLICATE_PER_ROUND = 64  # values held for others that one republish round copies on
DEAD_FOR = 30.0           # seconds a node that did not answer is skipped in lookups
_SIG_CONTEXT = b"erdma-dht/1\0"
_OPEN_CONTEXT = b"erdma-dht-open/1\0"
_QUERIES = ("ping", "find_node", "find_value", "store")

log = logging.getLogger("erdmampi.discovery")


class DhtError(RuntimeError):
    """The DHT could not be joined or used."""


class DhtProtocolError(ValueError):
    """A datagram is not a well-formed DHT message."""


# -- keys and signatures --------------------------------------------------------

def key_id(key, public_key) -> bytes:
    """The 160-bit id of ``key`` published by ``public_key``: SHA-1(PK || SHA-256(key))."""
    return _bound_id(_pk_bytes(public_key), _key_hash(key))


def _key_hash(key) -> bytes:
    if isinstance(key, str):
        key = key.encode("utf-8")
    return hashlib.sha256(bytes(key)).digest()


def _bound_id(pk: bytes, kh: bytes) -> bytes:
    return hashlib.sha1(pk + kh).digest()


def _pk_bytes(public_key) -> bytes:
    pk = public_key.public if isinstance(public_key, DhtKey) else bytes(public_key)
    if len(pk) != 32:
        raise ValueError("a DHT public key is 32 bytes (Ed25519)")
    return pk


def _verify(pk: bytes, kid: bytes, value: bytes, sig: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    try:
        Ed25519PublicKey.from_public_bytes(pk).verify(sig, _SIG_CONTEXT + kid + value)
    except (InvalidSignature, ValueError):
        return False
    return True


class DhtKey:
    """The Ed25519 key that signs a publisher's values (its public half names its keys).

    :param seed: 32 bytes (the same seed gives the same key); None: a fresh random key.
    """

    def __init__(self, seed=None):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        if seed is None:
            self._sk = Ed25519PrivateKey.generate()
        else:
            seed = bytes(seed)
            if len(seed) != 32:
                raise ValueError("a DHT key seed is 32 bytes")
            self._sk = Ed25519PrivateKey.from_private_bytes(seed)
        self.public = self._sk.public_key().public_bytes(serialization.Encoding.Raw,
                                                         serialization.PublicFormat.Raw)

    @classmethod
    def open(cls, name) -> "DhtKey":
        """A key anyone who knows ``name`` can derive (and so forge values with):
        for jobs without a secret, which are unauthenticated anyway."""
        name = name.encode() if isinstance(name, str) else bytes(name)
        return cls(hashlib.sha256(_OPEN_CONTEXT + name).digest())

    def sign(self, kid: bytes, value: bytes) -> bytes:
        return self._sk.sign(_SIG_CONTEXT + kid + value)

    def __repr__(self):
        return f"DhtKey({self.public.hex()[:16]}...)"


# -- the wire codec ----------------------------------------------------------------

def _hexbytes(x, n, what):
    if not isinstance(x, str) or len(x) != 2 * n:
        raise DhtProtocolError(f"{what} must be {n} bytes of hex")
    try:
        return bytes.fromhex(x)
    except ValueError:
        raise DhtProtocolError(f"{what} is not hex") from None


def _b64(x, limit, what):
    if not isinstance(x, str) or len(x) > (limit + 2) // 3 * 4:
        raise DhtProtocolError(f"{what} must be base64 of at most {limit} bytes")
    try:
        out = base64.b64decode(x, validate=True)
    except (binascii.Error, ValueError):
        raise DhtProtocolError(f"{what} is not base64") from None
    if len(out) > limit:
        raise DhtProtocolError(f"{what} is longer than {limit} bytes")
    return out


def _short_str(x, limit, what):
    if not isinstance(x, str) or len(x) > limit:
        raise DhtProtocolError(f"{what} must be a string of at most {limit} characters")
    return x


def _token_str(x):
    if (not isinstance(x, str) or len(x) > 64 or not x.isascii()
            or not all(c in "0123456789abcdef" for c in x)):
        raise DhtProtocolError("a token is at most 64 lowercase hex digits")
    return x


def _contact(n):
    if not isinstance(n, list) or len(n) != 3:
        raise DhtProtocolError("a contact is [id, ip, port]")
    nid = _hexbytes(n[0], ID_BYTES, "contact id")
    host = _short_str(n[1], 45, "contact address")
    try:
        ipaddress.ip_address(host)             # a literal: never a name to resolve
    except ValueError:
        raise DhtProtocolError("contact address is not an IP address") from None
    port = n[2]
    if type(port) is not int or not 0 < port < 65536:
        raise DhtProtocolError("contact port out of range")
    return nid, (host, port)


def _args(q, a):
    if not isinstance(a, dict):
        raise DhtProtocolError("query arguments must be an object")
    out = {}
    if "token" in a and a["token"] is not None:
        out["token"] = _token_str(a["token"])
    if q == "find_node":
        out["target"] = _hexbytes(a.get("target"), ID_BYTES, "target")
    elif q == "find_value":
        out["key"] = _hexbytes(a.get("key"), ID_BYTES, "key")
    elif q == "store":
        out["key"] = _hexbytes(a.get("key"), ID_BYTES, "key")
        out["value"] = _b64(a.get("value"), MAX_VALUE, "value")
        out["pk"] = _hexbytes(a.get("pk"), 32, "pk")
        out["kh"] = _hexbytes(a.get("kh"), 32, "kh")
        out["sig"] = _hexbytes(a.get("sig"), 64, "sig")
        out["rep"] = bool(a.get("rep"))
    return out


def _result(r):
    if not isinstance(r, dict):
        raise DhtProtocolError("a response's result must be an object")
    out = {"trunc": bool(r.get("trunc"))}
    nodes = r.get("nodes", [])
    if not isinstance(nodes, list) or len(nodes) > 2 * K:
        raise DhtProtocolError(f"nodes must be a list of at most {2 * K} contacts")
    out["nodes"] = [_contact(n) for n in nodes]
    values = r.get("values", [])
    if not isinstance(values, list) or len(values) > MAX_VALUES_PER_KEY:
        raise DhtProtocolError(f"values must be a list of at most {MAX_VALUES_PER_KEY}")
    vals = []
    for v in values:
        if not isinstance(v, list) or len(v) != 2:
            raise DhtProtocolError("a value is [base64, signature]")
        vals.append((_b64(v[0], MAX_VALUE, "value"), _hexbytes(v[1], 64, "signature")))
    out["values"] = vals
    return out


def decode(data: bytes) -> dict:
    """Parse and check one datagram.

    Returns ``{"y", "t", "id"(bytes), ...}`` with, for a query, ``"q"``, ``"a"``
    (arguments as bytes: ``target``/``key``/``value``/``pk``/``kh``/``sig``,
    ``token`` str) and ``"c"`` (bool); for a response ``"r"`` (``nodes`` as
    ``[(id, (ip, port))]``, ``values`` as ``[(value, sig)]``, ``trunc``); for an
    error ``"e"``; and ``"tok"`` (str or None) on both.

    :raises DhtProtocolError: anything malformed (never another exception).
    """
    if not isinstance(data, (bytes, bytearray)) or len(data) > MAX_DATAGRAM:
        raise DhtProtocolError("a DHT datagram is at most 60000 bytes")
    try:
        msg = json.loads(bytes(data))
    except (ValueError, RecursionError) as e:      # UnicodeDecodeError is a ValueError
        raise DhtProtocolError(f"not JSON: {e}") from None
    if not isinstance(msg, dict):
        raise DhtProtocolError("a DHT message is a JSON object")
    y = msg.get("y")
    out = {"y": y, "t": _short_str(msg.get("t", ""), 32, "transaction id"),
           "id": _hexbytes(msg.get("id"), ID_BYTES, "node id")}
    if y == "q":
        q = out["q"] = _short_str(msg.get("q"), 32, "query name")
        out["a"] = _args(q, msg.get("a") or {})
        out["c"] = bool(msg.get("c"))
        return out
    if y not in ("r", "e"):
        raise DhtProtocolError("y must be q, r or e")
    tok = msg.get("tok")
    out["tok"] = None if tok is None else _token_str(tok)
    if y == "r":
        out["r"] = _result(msg.get("r"))
    else:
        out["e"] = _short_str(msg.get("e", ""), 200, "error")
    return out


def _encode(msg) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


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
    __slots__ = ("event", "reply", "addr")

    def __init__(self, addr):
        self.event = threading.Event()
        self.reply = None
        self.addr = addr


class _Item:
    """The values held under one key id, all signed by the key bound to it."""
    __slots__ = ("pk", "kh", "vals", "nbytes")

    def __init__(self, pk, kh):
        self.pk, self.kh = pk, kh
        self.vals = {}            # value -> [sig, stored_at, source ip]; oldest first
        self.nbytes = 0


def _cost(value):
    return len(value) + VALUE_OVERHEAD


class DhtNode:
    """One Kademlia node.

    :param host, port: UDP address to bind (port 0: a free one).
    :param client: a client node (not added to others' routing tables).
    :param rpc_timeout: seconds to wait for one answer.
    :param republish: seconds between republishing rounds.
    :param ttl: seconds a stored value lives without being republished.
    :param max_bytes, max_source_bytes, max_key_bytes: storage caps (all values,
        values stored from one IP address, values of one key), each value charged
        its length plus ``VALUE_OVERHEAD``.
    :param rate, burst: queries per second (and at once) answered per source address.
    """

    def __init__(self, host="0.0.0.0", port=0, client=False, rpc_timeout=1.0,
                 republish=30.0, ttl=3600.0, node_id=None, max_bytes=MAX_BYTES,
                 max_source_bytes=MAX_SOURCE_BYTES, max_key_bytes=MAX_KEY_BYTES,
                 rate=RATE, burst=BURST):
        self.id = node_id or os.urandom(ID_BYTES)
        self.client = client
        self.rpc_timeout = rpc_timeout
        self.republish = republish
        self.ttl = ttl
        self.max_bytes = max_bytes
        self.max_source_bytes = max_source_bytes
        self.max_key_bytes = max_key_bytes
        self.rate, self.burst = float(rate), float(burst)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self._sock.bind((host, port))
        except OSError as e:
            self._sock.close()
            raise DhtError(f"cannot bind the DHT node to {host}:{port}: {e.strerror}") from None
        self._sock.settimeout(0.5)
        self._lock = threading.Lock()
        self._buckets = [[] for _ in range(ID_BYTES * 8)]
        self._data = {}           # key id -> _Item
        self._bytes = 0           # charged bytes of all values held
        self._by_source = {}      # source ip -> charged bytes of the values it stored
        self._own = {}            # key id -> (DhtKey, key hash, set(values)) this node published
        self._pending = {}        # txid -> _Pending
        self._tokens = collections.OrderedDict()   # addr -> our token at that node
        self._buckets_rl = collections.OrderedDict()  # source addr -> [allowance, last]
        self._rl_swept = 0.0
        self._secrets = [os.urandom(32), os.urandom(32)]   # current, previous
        self._rotated = time.monotonic()
        self._closed = False
        self._stop = threading.Event()
        self._checking = set()    # contacts being pinged for eviction
        self._probing = set()     # nodes being pinged before they enter the table
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

    def put(self, key, value, signer) -> int:
        """Store ``value`` under ``key``, signed by ``signer`` (a :class:`DhtKey`), on the
        K closest nodes; returns how many took it."""
        value = bytes(value)
        if len(value) > MAX_VALUE:
            raise ValueError(f"DHT values are limited to {MAX_VALUE} bytes")
        if not isinstance(signer, DhtKey):
            raise TypeError("put needs the DhtKey that signs the value")
        kh = _key_hash(key)
        kid = _bound_id(signer.public, kh)
        with self._lock:
            self._own.setdefault(kid, (signer, kh, set()))[2].add(value)
        return self._publish(kid, signer.public, kh, value, signer.sign(kid, value))

    def get_all(self, key, public_key, timeout=0.0) -> list:
        """Every value that ``public_key``'s holder stored under ``key`` (newest first),
        waiting up to ``timeout`` s; values whose signature does not verify are dropped.

        :raises TimeoutError: when none was found in time.
        """
        pk = _pk_bytes(public_key)
        kid = _bound_id(pk, _key_hash(key))
        deadline = time.monotonic() + (timeout or 0.0)
        delay = 0.05
        while True:
            values = self._find_values(kid, pk)
            if values:
                return values
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"DHT key {key!r} not found within {timeout or 0:g} s")
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.5)

    def get(self, key, public_key, timeout=0.0) -> bytes:
        return self.get_all(key, public_key, timeout)[0]

    def contacts(self) -> list:
        """``[(id, (host, port)), ...]`` of the routing table."""
        with self._lock:
            return [(c.id, c.addr) for b in self._buckets for c in b]

    def stored(self) -> int:
        """Number of keys held by this node."""
        with self._lock:
            return len(self._data)

    def stored_bytes(self) -> int:
        """Bytes of the values held (the storage caps count these plus overhead)."""
        with self._lock:
            return sum(len(v) for item in self._data.values() for v in item.vals)

    def held_values(self) -> list:
        """Every value this node holds (for inspection)."""
        with self._lock:
            return [v for item in self._data.values() for v in item.vals]

    def forget(self, key, public_key) -> bool:
        """Stop republishing ``key`` and drop this node's copy; True if it published it."""
        kid = key_id(key, public_key)
        with self._lock:
            found = self._own.pop(kid, None) is not None
            item = self._data.pop(kid, None)
            if item is not None:
                for v in list(item.vals):
                    self._unkeep(item, v)
        return found

    def republish_now(self):
        """One republish round (also run every ``republish`` seconds): what this node
        published, and up to ``REPLICATE_PER_ROUND`` of the values it holds for others
        (those copied least recently), so that what strangers store costs it bounded work."""
        self._expire()
        now = time.monotonic()
        with self._lock:
            own = [(kid, signer.public, kh, v, signer.sign(kid, v))
                   for kid, (signer, kh, vals) in self._own.items() for v in vals]
            held = sorted(((rec[3], kid, v) for kid, item in self._data.items()
                           if kid not in self._own for v, rec in item.vals.items()),
                          key=lambda x: x[0])[:REPLICATE_PER_ROUND]
            copies = []
            for _, kid, v in held:
                item = self._data[kid]
                item.vals[v][3] = now
                copies.append((kid, item.pk, item.kh, v, item.vals[v][0]))
        for args in own:
            self._publish(*args)
        for args in copies:
            self._publish(*args, replica=True)

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

    def _keep(self, kid, pk, kh, value, sig, source=None, refresh=True):
        """Hold a verified value; None if kept, else why not. ``source``: the IP it
        came from (None: this node), charged against its cap; ``refresh``: a store
        from the publisher (not a replica) restarts the value's ttl."""
        cost = _cost(value)
        now = time.monotonic()
        with self._lock:
            item = self._data.get(kid)
            if item is not None and value in item.vals:
                if refresh:                      # a replica does not extend a value's life
                    rec = item.vals.pop(value)
                    rec[1] = now
                    item.vals[value] = rec       # dicts keep insertion order: newest last
                return None
            if cost > self.max_key_bytes:
                return "value too large for a key"
            evict, freed = [], 0                  # the signer's own oldest values
            if item is not None:
                for v in item.vals:
                    if (len(item.vals) - len(evict) < MAX_VALUES_PER_KEY
                            and item.nbytes - freed + cost <= self.max_key_bytes):
                        break
                    evict.append(v)
                    freed += _cost(v)
            if self._bytes - freed + cost > self.max_bytes:
                return "storage full"
            if source is not None and \
                    self._by_source.get(source, 0) + cost > self.max_source_bytes:
                return "storage quota of this source used up"
            if item is None:
                item = self._data[kid] = _Item(pk, kh)
            for v in evict:
                self._unkeep(item, v)
            item.vals[value] = [sig, now, source, now]   # ..., last copied to others
            item.nbytes += cost
            self._bytes += cost
            if source is not None:
                self._by_source[source] = self._by_source.get(source, 0) + cost
        return None

    def _unkeep(self, item, value):
        """Drop one value (lock held)."""
        rec = item.vals.pop(value)
        cost = _cost(value)
        item.nbytes -= cost
        self._bytes -= cost
        src = rec[2]
        if src is not None:
            left = self._by_source.get(src, 0) - cost
            if left > 0:
                self._by_source[src] = left
            else:
                self._by_source.pop(src, None)

    def _expire(self):
        cut = time.monotonic() - self.ttl
        with self._lock:
            for kid in list(self._data):
                item = self._data[kid]
                for v in [v for v, rec in item.vals.items() if rec[1] < cut]:
                    self._unkeep(item, v)
                if not item.vals:
                    del self._data[kid]

    def _local_values(self, kid):
        """``[(value, sig)]`` held under ``kid``, newest first, not expired."""
        cut = time.monotonic() - self.ttl
        with self._lock:
            item = self._data.get(kid)
            if item is None:
                return []
            return [(v, rec[0]) for v, rec in reversed(item.vals.items()) if rec[1] >= cut]

    def _publish(self, kid, pk, kh, value, sig, replica=False):
        nodes = self._lookup(kid)
        stored = 0
        targets = nodes[:K]
        mine = len(nodes) < K or _dist(self.id, kid) < _dist(nodes[K - 1].id, kid)
        if not self.client and mine:
            self._keep(kid, pk, kh, value, sig, refresh=not replica)  # one of the K closest
            stored += 1
            targets = nodes[:K - 1]
        args = {"key": kid.hex(), "value": base64.b64encode(value).decode(), "pk": pk.hex(),
                "kh": kh.hex(), "sig": sig.hex()}
        if replica:
            args["rep"] = 1
        for _ in range(2):        # they answered the lookup just now: a silence is a lost packet
            replies = self._rpc_many([(c.addr, "store", args) for c in targets])
            stored += sum(r is not None for r in replies)
            targets = [c for c, r in zip(targets, replies) if r is None]
            if not targets:
                break
        if not stored:
            self._keep(kid, pk, kh, value, sig, refresh=not replica)  # alone: hold it
        return stored

    def _find_values(self, kid, pk):
        _, values = self._lookup(kid, want_value=True, pk=pk)
        out = [v for v, _ in self._local_values(kid)]
        for v in values:
            if v not in out:
                out.append(v)
        return out

    # Private: write tokens and rate limits

    def _token(self, addr, secret=None):
        with self._lock:
            if time.monotonic() - self._rotated > TOKEN_ROTATE:
                self._secrets = [os.urandom(32), self._secrets[0]]
                self._rotated = time.monotonic()
            secret = secret or self._secrets[0]
        return hmac.new(secret, f"{addr[0]}|{addr[1]}".encode(),
                        hashlib.sha256).hexdigest()[:32]

    def _valid_token(self, addr, token):
        if not token:
            return False
        current = self._token(addr)
        return (hmac.compare_digest(current, token)
                or hmac.compare_digest(self._token(addr, self._secrets[1]), token))

    def _allow(self, addr):
        """Token bucket per source address; the table holds at most MAX_SOURCES, and
        sources beyond share one bucket until idle ones (full again) are swept out."""
        now = time.monotonic()
        with self._lock:
            table = self._buckets_rl
            b = table.get(addr)
            if b is None:
                if len(table) >= MAX_SOURCES and now - self._rl_swept > 1.0:
                    self._rl_swept = now
                    for a in [a for a, (allow, last) in table.items()
                              if allow + (now - last) * self.rate >= self.burst]:
                        del table[a]
                if len(table) >= MAX_SOURCES:
                    addr = None                  # the overflow bucket
                    b = table.get(None)
                if b is None:
                    b = table[addr] = [self.burst, now]
            allow = min(self.burst, b[0] + (now - b[1]) * self.rate)
            b[1] = now
            if allow < 1.0:
                b[0] = allow
                return False
            b[0] = allow - 1.0
            return True

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

    def _probe(self, nid, addr):
        """A node without a token asked us something: ping it, and its answer (to our
        txid, so from its real address) puts it in the routing table. A few at a time."""
        with self._lock:
            b = self._bucket(nid)
            if (b is None or len(b) >= K or any(c.id == nid for c in b)
                    or len(self._probing) >= 2 * ALPHA or nid in self._probing):
                return
            self._probing.add(nid)
        threading.Thread(target=self._probe_run, args=(nid, addr), daemon=True).start()

    def _probe_run(self, nid, addr):
        try:
            self._rpc(addr, "ping", {})
        finally:
            with self._lock:
                self._probing.discard(nid)

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

    def _lookup(self, target, want_value=False, pk=None):
        """Iterative FIND_NODE (or FIND_VALUE): the K closest live nodes (and the values
        that verify under ``pk``)."""
        short = {c.id: c for c in self._closest(target)}
        queried, alive, values = set(), {}, []
        while len(queried) < LOOKUP_QUERIES:
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
                    for v, sig in r["values"]:
                        if v not in values and _verify(pk, target, v, sig):
                            values.append(v)
                for nid, addr in r["nodes"][:K]:
                    if nid != self.id and nid not in short and nid not in queried \
                            and not self._recently_dead(nid):
                        short[nid] = _Contact(nid, addr)
            if want_value and values:
                break
        nodes = sorted(alive.values(), key=lambda c: _dist(c.id, target))[:K]
        return (nodes, values) if want_value else nodes

    # Private: RPC

    def _send(self, addr, msg):
        try:
            self._sock.sendto(_encode(msg), addr)
        except OSError:
            pass

    def _rpc(self, addr, q, args):
        return self._rpc_many([(addr, q, args)])[0]

    def _rpc_many(self, calls):
        """Send the queries together, wait for the answers (None for no answer or an
        error). An answer cut short for want of a token is asked again with it."""
        out = self._rpc_round(calls)
        again = [i for i, r in enumerate(out) if r is not None and r["trunc"]]
        if again:
            for i, r in zip(again, self._rpc_round([calls[i] for i in again])):
                out[i] = r
        return out

    def _rpc_round(self, calls):
        waits = []
        for addr, q, args in calls:
            tx = os.urandom(6).hex()
            p = _Pending(addr)
            with self._lock:
                self._pending[tx] = p
                token = self._tokens.get(addr)
            waits.append((tx, p))
            if token:
                args = dict(args, token=token)
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
                data, addr = self._sock.recvfrom(MAX_DATAGRAM + 1)
            except socket.timeout:
                continue
            except OSError:
                if self._closed:
                    return
                continue
            try:
                self._handle(data, addr[:2])
            except DhtProtocolError as e:    # a stranger's garbage must not stop the node
                log.debug("DHT: dropped a bad datagram from %s: %s", addr, e)
            except Exception as e:
                log.warning("DHT: error handling a datagram from %s: %r", addr, e)

    def _handle(self, data, addr):
        msg = decode(data)
        nid, y, tx = msg["id"], msg["y"], msg["t"]
        if y in ("r", "e"):
            with self._lock:
                p = self._pending.get(tx)
                if p is not None and msg["tok"]:
                    self._tokens[addr] = msg["tok"]
                    self._tokens.move_to_end(addr)
                    while len(self._tokens) > MAX_SOURCES:
                        self._tokens.popitem(last=False)
            if p is not None:
                if y == "r":
                    p.reply = msg["r"]
                p.event.set()
                self._seen(nid, addr)      # it answered our txid: its address is real
            return
        if self.client or not self._allow(addr):
            return                      # clients answer nothing; over the rate: dropped
        q, a = msg["q"], msg["a"]
        proven = self._valid_token(addr, a.get("token"))
        if proven and not msg["c"]:
            self._seen(nid, addr)
        elif not msg["c"]:
            self._probe(nid, addr)
        head = {"t": tx, "id": self.id.hex(), "tok": self._token(addr)}
        reply = {}
        if q == "ping":
            pass
        elif q == "find_node":
            reply["nodes"] = [c.wire() for c in self._closest(a["target"]) if c.id != nid]
        elif q == "find_value":
            kid = a["key"]
            values, room = [], MAX_REPLY_VALUES
            for v, sig in self._local_values(kid):          # newest first, as many as fit
                enc = base64.b64encode(v).decode()
                if len(enc) > room:
                    break
                values.append([enc, sig.hex()])
                room -= len(enc)
            if values:
                reply["values"] = values
            reply["nodes"] = [c.wire() for c in self._closest(kid) if c.id != nid]
        elif q == "store":
            why = self._store(a, addr, proven)
            if why:
                self._reply(addr, dict(head, y="e", e=why), len(data), proven)
                return
        else:
            self._reply(addr, dict(head, y="e", e="unknown query"), len(data), proven)
            return
        self._reply(addr, dict(head, y="r", r=reply), len(data), proven)

    def _store(self, a, addr, proven):
        """Check and keep a stored value; None if kept, else why it was refused."""
        if not proven:
            return "store needs a valid token (from an answer of this node)"
        kid, pk, kh = a["key"], a["pk"], a["kh"]
        if _bound_id(pk, kh) != kid:
            return "key id is not bound to the signer's key"
        if not _verify(pk, kid, a["value"], a["sig"]):
            return "bad signature"
        return self._keep(kid, pk, kh, a["value"], a["sig"], source=addr[0],
                          refresh=not a["rep"])

    def _reply(self, addr, msg, asked, proven):
        """Send an answer; to a source without a token, at most AMPLIFICATION times the
        query's bytes: values go first, then contacts (the answer says trunc)."""
        data = _encode(msg)
        limit = AMPLIFICATION * asked
        if not proven and len(data) > limit and msg["y"] == "r":
            r = msg["r"] = {"trunc": 1, "nodes": list(msg["r"].get("nodes", ()))}
            data = _encode(msg)
            while len(data) > limit and r["nodes"]:
                # drop about as many contacts as the excess needs, then one at a time
                r["nodes"] = r["nodes"][:-max(1, (len(data) - limit) // 70)]
                data = _encode(msg)
        if not proven and len(data) > limit:
            return
        try:
            self._sock.sendto(data, addr)
        except OSError:
            pass

    def _maintain(self):
        next_round = time.monotonic() + self.republish
        next_expiry = time.monotonic() + min(10.0, self.ttl)
        while not self._stop.wait(0.2):
            now = time.monotonic()
            if now >= next_expiry and not self._closed:
                self._expire()
                next_expiry = now + min(10.0, self.ttl)
            if now >= next_round and not self._closed:
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
    :param signer: the :class:`DhtKey` that signs (and names) the values; the
        readers of the same records need the same key. None: ``DhtKey.open(prefix)``,
        which anyone who knows the prefix can derive (no protection from forgers).

    There is no atomic ``add`` (a DHT has no single owner of a key): it raises
    :class:`DhtError`; ``delete`` forgets only what this node published.
    """

    def __init__(self, node, prefix="", timeout=60.0, owns_node=False, signer=None):
        self.node = node
        self.prefix = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        self.timeout = timeout
        self.owns_node = owns_node
        self.signer = signer if signer is not None else DhtKey.open(self.prefix)

    def __repr__(self):
        return f"DhtStore({self.node!r})"

    def _k(self, key):
        return self.prefix + (key.encode() if isinstance(key, str) else bytes(key))

    def set(self, key, value):
        if isinstance(value, str):
            value = value.encode()
        self.node.put(self._k(key), value, self.signer)

    def get_all(self, key, timeout=None):
        return self.node.get_all(self._k(key), self.signer.public,
                                 self.timeout if timeout is None else timeout)

    def get(self, key, timeout=None):
        return self.get_all(key, timeout)[0]

    def check(self, keys):
        keys = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        try:
            for k in keys:
                self.get_all(k, 0)
        except TimeoutError:
            return False
        return True

    def add(self, key, n=1):
        raise DhtError("a DHT has no atomic counter: give each site its ranks explicitly "
                       "(erdmarun --ranks A-B)")

    def delete(self, key):
        return self.node.forget(self._k(key), self.signer)

    def close(self):
        if self.owns_node:
            self.node.close()
