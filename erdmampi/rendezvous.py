"""Rendezvous key-value store: wire protocol and client (pure Python, stdlib only).

Ranks publish their addresses under ``<jobid>/...`` keys and read the others'
(Gloo ``Store`` semantics: ``set``/``get``/``add``/``wait``/``check``/``delete``).
The server lives in :mod:`erdmampi.launcher.store_server`; both sides use the
encoding defined here and nothing else.

Wire protocol (TCP, one persistent connection per client, request/response)::

    frame    := u32 length (big endian) | body          (length = len(body))
    request  := u8 op | field*                           field := u32 length | bytes
    response := u8 status | field*

Requests and their fields (keys are UTF-8, values opaque bytes):

    ==========  ================================  ==========================
    op          request fields                    OK response fields
    ==========  ================================  ==========================
    1 SET       key, value                        (none)
    2 GET       key, timeout_ms (ASCII decimal)   value
    3 ADD       key, delta (ASCII decimal)        new value (ASCII decimal)
    4 WAIT      timeout_ms, key...                (none)
    5 CHECK     key...                            b"1" or b"0"
    6 DELETE    key                               b"1" (existed) or b"0"
    7 PING      (none)                            (none)
    8 AUTH      namespace                         nonce (32 bytes)
    9 PROVE     public_key, signature             (none)
    ==========  ================================  ==========================

Status is 0 OK, 1 TIMEOUT (fields: the missing keys), 2 ERROR (field: message).
A negative ``timeout_ms`` means "wait forever". ``ADD`` stores its counter as
ASCII decimal, so ``get`` of a counter returns e.g. ``b"3"``.

Job authentication (optional; :mod:`erdmampi.jobauth` makes the keys). A
connection starts in the server's *open* space, shared by every client that
does not authenticate (jobs without a secret). ``AUTH namespace`` followed by
``PROVE public_key signature`` (an Ed25519 signature of
``"erdma-store-auth/1" \0 namespace \0 nonce``) moves the connection into the
job's own space: the first successful PROVE for a namespace registers its
public key; later ones must use the same key. From then on every operation of
that connection acts on the job's space only, which no other connection can
read or write. A failed PROVE answers ERROR and closes the connection. A
server started with ``require_auth`` refuses every data operation from a
connection that has not authenticated.

Admission. A server given admission secrets (``admit=``, ``--admit-file``)
lets a PROVE create a *new* job space only when it carries a third field,
``HMAC-SHA256(k_admit, "erdma-store-admit/1" \0 namespace \0 nonce \0
public_key)`` with ``k_admit`` derived from one of those secrets
(:meth:`erdmampi.jobauth.JobKeys.admit_tag`; a job's own secret admits it).
A stranger can then neither create a space nor store anything.

Limits. A frame is refused (and the connection closed) above
:data:`MAX_FRAME_UNAUTH` (64 KiB) before the connection authenticated and
above :data:`MAX_FRAME` (16 MiB) after; the client refuses replies above
:data:`MAX_FRAME` too. Neither side allocates a claimed length up front: a
frame's buffer grows as its bytes arrive. Every client call has one overall
deadline (the store's ``timeout``; for a blocking GET/WAIT its own timeout
plus :data:`REPLY_SLACK` seconds at most), which a server trickling bytes
cannot extend.
"""
import socket
import struct
import threading
import time

__all__ = ["Store", "StoreError", "StoreAuthError", "encode_frame", "read_frame", "pack_fields",
           "unpack_fields", "frame_length", "OP_NAMES", "MAX_FRAME", "MAX_FRAME_UNAUTH"]

OP_SET, OP_GET, OP_ADD, OP_WAIT, OP_CHECK, OP_DELETE, OP_PING, OP_AUTH, OP_PROVE = range(1, 10)
OP_NAMES = {OP_SET: "SET", OP_GET: "GET", OP_ADD: "ADD", OP_WAIT: "WAIT",
            OP_CHECK: "CHECK", OP_DELETE: "DELETE", OP_PING: "PING", OP_AUTH: "AUTH",
            OP_PROVE: "PROVE"}
ST_OK, ST_TIMEOUT, ST_ERROR = 0, 1, 2

#: Largest frame either side accepts from an authenticated peer.
MAX_FRAME = 16 << 20
#: Largest frame the server accepts before a connection has authenticated.
MAX_FRAME_UNAUTH = 64 << 10
#: Most seconds a blocking GET/WAIT's reply may come after its own timeout.
REPLY_SLACK = 10.0
_CHUNK = 64 << 10

_U32 = struct.Struct(">I")


class StoreError(RuntimeError):
    """The store answered with an error, or the connection broke."""


class StoreAuthError(StoreError):
    """The store refused the job's proof of its secret (or refused to admit it)."""


# -- encoding (shared with launcher/store_server.py) -------------------------

def pack_fields(code, fields=()):
    """Body of a request/response: ``u8 code`` then length-prefixed fields."""
    parts = [bytes((code,))]
    for f in fields:
        f = bytes(f)
        parts.append(_U32.pack(len(f)))
        parts.append(f)
    return b"".join(parts)


def unpack_fields(body):
    """Inverse of :func:`pack_fields`: returns ``(code, [field, ...])``."""
    if not body:
        raise StoreError("empty frame")
    code = body[0]
    fields = []
    view = memoryview(body)
    pos, end = 1, len(body)
    while pos < end:
        if pos + 4 > end:
            raise StoreError("truncated field header")
        (n,) = _U32.unpack_from(body, pos)
        pos += 4
        if pos + n > end:
            raise StoreError("truncated field")
        fields.append(bytes(view[pos:pos + n]))
        pos += n
    return code, fields


def encode_frame(code, fields=()):
    body = pack_fields(code, fields)
    return _U32.pack(len(body)) + body


def frame_length(head, limit=MAX_FRAME):
    """Body length from a 4-byte frame header; :class:`StoreError` outside 1..limit."""
    (n,) = _U32.unpack(head)
    if n == 0 or n > limit:
        raise StoreError(f"bad frame length {n} (at most {limit})")
    return n


def _recv_exact(sock, n, deadline=None, what="reply"):
    """n bytes, the buffer growing as they arrive (never a claimed length up front).

    ``None`` on EOF before the first byte; ``b""`` on EOF after some. With a
    ``deadline`` (monotonic) the whole read must end by then, however the
    bytes trickle in: :class:`TimeoutError` otherwise.
    """
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no complete {what} in time")
            sock.settimeout(left)
        try:
            chunk = sock.recv(min(n - len(buf), _CHUNK))
        except socket.timeout:
            raise TimeoutError(f"no complete {what} in time") from None
        if not chunk:
            return None if not buf else b""
        buf += chunk
    return bytes(buf)


def read_frame(sock, deadline=None, limit=MAX_FRAME):
    """Read one frame; returns ``(code, fields)`` or ``None`` on a clean EOF.

    :param deadline: ``time.monotonic()`` value by which the whole frame must
        have arrived (:class:`TimeoutError` otherwise); None: the socket's own timeout.
    :param limit: largest body accepted (:class:`StoreError` above it, before
        reading the body).
    """
    head = _recv_exact(sock, 4, deadline)
    if head is None:
        return None
    if len(head) != 4:
        raise StoreError("connection closed inside a frame header")
    n = frame_length(head, limit)
    body = _recv_exact(sock, n, deadline)
    if body is None or len(body) != n:
        raise StoreError("connection closed inside a frame")
    return unpack_fields(body)


def _key_bytes(key):
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key)
    raise TypeError(f"store key must be str or bytes, not {type(key).__name__}")


def _ms(timeout):
    if timeout is None or timeout == float("inf"):
        return b"-1"
    return str(max(0, int(timeout * 1000))).encode()


def parse_address(addr):
    """``"host:port"`` (``"[v6]:port"`` too) -> ``(host, port)``."""
    if not isinstance(addr, str) or ":" not in addr:
        raise ValueError(f"rendezvous address must be 'host:port', got {addr!r}")
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port)
    except ValueError:
        raise ValueError(f"rendezvous address {addr!r}: port is not a number") from None
    if not host or not 0 < port < 65536:
        raise ValueError(f"rendezvous address {addr!r} is not a valid host:port")
    return host, port


# -- client ------------------------------------------------------------------

class Store:
    """Client of the rendezvous store.

    :param host: server host name or address.
    :param port: server TCP port.
    :param prefix: prepended to every key (the launcher uses ``ERDMA_JOBID + "/"``).
    :param timeout: default seconds for connecting and for blocking ``get``/``wait``.
    :param auth: None (the server's open space), or an object with ``namespace``
        (bytes), ``public_key`` (32 bytes) and ``sign(nonce) -> bytes``
        (:meth:`erdmampi.jobauth.JobKeys.store_auth`): every connection proves
        the job before its first operation.

    One persistent TCP connection serves all calls; the object is thread-safe.
    While one thread blocks in ``get``/``wait``, other threads get an extra
    connection of their own, so a ``set`` from another thread is never stuck
    behind a blocking ``get``.
    """

    def __init__(self, host, port, prefix="", timeout=60.0, auth=None):
        self.auth = auth
        self.host = host
        self.port = int(port)
        self.prefix = _key_bytes(prefix)
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._idle = []          # connected sockets not in use
        self._all = set()
        self._closed = False
        self._put(self._connect(self.timeout))

    @classmethod
    def from_address(cls, addr, prefix="", timeout=60.0, auth=None):
        host, port = parse_address(addr)
        return cls(host, port, prefix=prefix, timeout=timeout, auth=auth)

    def __repr__(self):
        return f"Store({self.host!r}, {self.port}, prefix={self.prefix.decode(errors='replace')!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- public API --

    def set(self, key, value):
        """Store ``value`` (bytes-like, or str encoded as UTF-8) under ``key``."""
        if isinstance(value, str):
            value = value.encode("utf-8")
        self._call(OP_SET, [self._k(key), bytes(value)])

    def get(self, key, timeout=None):
        """Value of ``key``, waiting until it is set.

        :raises TimeoutError: when the key does not appear within ``timeout``
            seconds (default: the store's timeout).
        """
        t = self.timeout if timeout is None else timeout
        st, fields = self._call(OP_GET, [self._k(key), _ms(t)], timeout=t)
        if st == ST_TIMEOUT:
            raise TimeoutError(f"rendezvous store {self.host}:{self.port}: key "
                               f"{self._name(key)!r} did not appear within {t:g} s")
        return fields[0]

    def add(self, key, n=1):
        """Atomically add ``n`` to the integer counter ``key`` (0 if absent); returns the new value."""
        if not isinstance(n, int):
            raise TypeError(f"add() needs an int, not {type(n).__name__}")
        _, fields = self._call(OP_ADD, [self._k(key), str(n).encode()])
        try:
            return int(fields[0])
        except ValueError:
            raise StoreError(f"{self._where()}: ADD answered a non-integer") from None

    def wait(self, keys, timeout=None):
        """Block until all ``keys`` exist.

        :raises TimeoutError: naming the keys still missing after ``timeout`` seconds.
        """
        keys = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        t = self.timeout if timeout is None else timeout
        st, fields = self._call(OP_WAIT, [_ms(t)] + [self._k(k) for k in keys], timeout=t)
        if st == ST_TIMEOUT:
            missing = [f[len(self.prefix):].decode(errors="replace") for f in fields]
            raise TimeoutError(f"rendezvous store {self.host}:{self.port}: keys "
                               f"{missing} did not appear within {t:g} s")

    def check(self, keys):
        """True when all ``keys`` exist (does not wait)."""
        keys = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        _, fields = self._call(OP_CHECK, [self._k(k) for k in keys])
        return fields[0] == b"1"

    def delete(self, key):
        """Remove ``key``; returns True when it existed."""
        _, fields = self._call(OP_DELETE, [self._k(key)])
        return fields[0] == b"1"

    def ping(self):
        self._call(OP_PING, [])

    def close(self):
        with self._lock:
            self._closed = True
            socks, self._all = list(self._all), set()
            self._idle = []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass

    # Private

    def _k(self, key):
        return self.prefix + _key_bytes(key)

    @staticmethod
    def _name(key):
        return key.decode(errors="replace") if isinstance(key, (bytes, bytearray)) else key

    def _where(self):
        return f"rendezvous store {self.host}:{self.port}"

    def _connect(self, timeout):
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                s = socket.create_connection((self.host, self.port),
                                             timeout=max(0.1, deadline - time.monotonic()))
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError as e:
                if time.monotonic() + delay >= deadline:
                    raise ConnectionError(f"cannot reach the rendezvous store at "
                                          f"{self.host}:{self.port} within {timeout:g} s: {e}") from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            if self.auth is not None:
                try:
                    # the handshake shares the connect deadline (at least a few seconds)
                    self._authenticate(s, max(deadline, time.monotonic() + 5.0))
                except BaseException:
                    s.close()
                    raise
            s.settimeout(None)
            return s

    def _authenticate(self, sock, deadline):
        """AUTH + PROVE on a fresh connection, all before ``deadline``."""
        where = self._where()
        try:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            sock.sendall(encode_frame(OP_AUTH, [self.auth.namespace]))
            reply = read_frame(sock, deadline)
            if reply is not None and reply[0] == ST_OK and reply[1]:
                nonce = reply[1][0]
                proof = [self.auth.public_key, self.auth.sign(nonce)]
                admit = getattr(self.auth, "admit_tag", None)
                if admit is not None:
                    proof.append(admit(nonce))
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                sock.sendall(encode_frame(OP_PROVE, proof))
                reply = read_frame(sock, deadline)
        except TimeoutError:
            raise StoreError(f"{where}: no answer to job authentication within the "
                             f"timeout ({self.timeout:g} s)") from None
        except OSError as e:
            raise StoreError(f"{where}: authentication failed: {e}") from e
        if reply is None:
            raise StoreError(f"{where} closed the connection during authentication")
        if reply[0] != ST_OK:
            msg = reply[1][0].decode(errors="replace") if reply[1] else "refused"
            if "unknown store operation" in msg:
                msg += " (a store without job authentication: upgrade it, or join without a secret)"
            raise StoreAuthError(f"{where}: job authentication refused: {msg}")

    def _put(self, sock):
        with self._lock:
            if self._closed:
                sock.close()
                return
            self._all.add(sock)
            self._idle.append(sock)

    def _take(self):
        while True:
            with self._lock:
                if self._closed:
                    raise StoreError("store client is closed")
                if not self._idle:
                    break
                s = self._idle.pop()
            if _alive(s):
                return s
            self._drop(s)        # the server closed it while idle (e.g. its idle timeout)
        s = self._connect(self.timeout)
        with self._lock:
            self._all.add(s)
        return s

    def _drop(self, sock):
        with self._lock:
            self._all.discard(sock)
        try:
            sock.close()
        except OSError:
            pass

    def _call(self, op, fields, timeout=0.0):
        """One request; the reply must be complete by one deadline: the store's
        timeout, or for a blocking op its own ``timeout`` plus :data:`REPLY_SLACK`."""
        frame = encode_frame(op, fields)
        limit = MAX_FRAME if self.auth is not None else MAX_FRAME_UNAUTH
        if len(frame) - 4 > limit:
            raise StoreError(f"{self._where()}: {OP_NAMES[op]} request of {len(frame) - 4} "
                             f"bytes is over the store's limit of {limit} bytes"
                             + ("" if self.auth is not None else
                                " for jobs without a secret (a job secret raises it to "
                                f"{MAX_FRAME} bytes)"))
        wait = None if timeout is None or timeout == float("inf") else max(timeout, 0.0)
        budget = None if wait is None else (self.timeout if not wait
                                            else wait + min(REPLY_SLACK, self.timeout))
        sock = self._take()
        deadline = None if budget is None else time.monotonic() + budget
        try:
            sock.settimeout(None if deadline is None else max(0.01, deadline - time.monotonic()))
            sock.sendall(frame)
            reply = read_frame(sock, deadline)
            if reply is None:
                raise StoreError(f"{self._where()} closed the connection")
        except TimeoutError:
            self._drop(sock)
            raise StoreError(f"{self._where()}: no complete answer to {OP_NAMES[op]} within "
                             f"{budget:g} s (server too slow or not a rendezvous store)") from None
        except StoreError as e:
            self._drop(sock)
            if str(e).startswith("rendezvous store"):
                raise
            raise StoreError(f"{self._where()}: {OP_NAMES[op]}: {e}") from None
        except OSError as e:
            self._drop(sock)
            raise StoreError(f"{self._where()}: {OP_NAMES[op]} failed: {e}") from e
        except BaseException:
            self._drop(sock)     # e.g. KeyboardInterrupt mid-frame: stream state unknown
            raise
        self._put(sock)
        status, rfields = reply
        if status == ST_ERROR:
            msg = rfields[0].decode(errors="replace") if rfields else "unknown error"
            raise StoreError(f"{self._where()}: {msg}")
        if status not in (ST_OK, ST_TIMEOUT) or (status == ST_OK and op in _NEED_FIELD
                                                 and not rfields):
            raise StoreError(f"{self._where()}: malformed answer to {OP_NAMES[op]}")
        return status, rfields


_NEED_FIELD = {OP_GET, OP_ADD, OP_CHECK, OP_DELETE}


def _alive(sock):
    """False when an idle connection was closed (or written to) by the server."""
    try:
        sock.settimeout(0)
        try:
            sock.recv(1, socket.MSG_PEEK)     # data or EOF: unusable either way
            return False
        except (BlockingIOError, InterruptedError):
            return True
    except OSError:
        return False
