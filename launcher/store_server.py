"""Rendezvous store server (one event-loop thread; Gloo ``Store`` semantics).

The wire encoding lives in :mod:`erdmampi.rendezvous`. ``erdmarun`` runs the
server in a thread of its own process; it can also run standalone::

    python -m erdmampi.launcher.store_server --host 0.0.0.0 --port 29500

which prints ``host:port`` on one line once it listens, and serves until
SIGINT/SIGTERM.

Every client may be hostile, so the server holds bounded state per client
and in all: one thread serves every connection (a selector loop; a blocking
GET/WAIT is a registered waiter, not a parked thread), a frame's buffer grows
as its bytes arrive (never the claimed length up front), frames are capped
(:data:`~erdmampi.rendezvous.MAX_FRAME_UNAUTH` before a connection
authenticated, :data:`~erdmampi.rendezvous.MAX_FRAME` after), a frame must
arrive whole within ``read_timeout`` however its bytes trickle in, an idle
connection is closed after ``idle_timeout`` (an unauthenticated one on a
``require_auth`` server after ``auth_timeout``), connections are capped per
source address and in all, and each space holds at most ``max_keys`` keys
and ``max_bytes`` bytes (``max_spaces`` spaces, ``max_total_bytes`` in all).
"""
import argparse
import hmac
import logging
import os
import selectors
import signal
import socket
import sys
import threading
import time

from erdmampi import rendezvous as rz

__all__ = ["StoreServer", "main", "build_parser", "load_admit_file", "LIMITS"]

log = logging.getLogger("erdmampi.discovery")

#: Defaults of the server's limits (constructor keywords, ``--help``).
LIMITS = dict(
    read_timeout=10.0,        # seconds for one frame, first byte to last
    idle_timeout=300.0,       # seconds a connection may sit between requests
    auth_timeout=10.0,        # require_auth: seconds to authenticate after connecting
    write_timeout=30.0,       # seconds for a client to take a reply
    max_conns=4096,           # connections in all (also bounded by RLIMIT_NOFILE)
    max_conns_per_source=256,  # connections from one IP address
    max_keys=65536,           # keys in one space
    max_bytes=64 << 20,       # bytes (keys + values) in one space
    max_spaces=4096,          # authenticated job spaces
    max_total_bytes=1 << 30,  # bytes in all spaces together
    max_waiting=1 << 18,      # keys that blocked GET/WAITs wait for, all connections together
)
_KEY_OVERHEAD = 64            # bytes charged per key on top of its name and value
_ADD_MAX_DIGITS = 64          # an ADD counter and delta fit in this many digits
_MAX_WAIT_KEYS = 4096         # keys in one WAIT
_SWEEP = 0.1                  # seconds between deadline sweeps


class _AuthFailed(Exception):
    """A connection failed to prove its job: answered, then closed."""


class _Conn:
    """Per-connection state."""
    __slots__ = ("sock", "peer", "ip", "inbuf", "need", "head", "frame_t0", "last",
                 "born", "out", "out_t0", "space", "namespace", "nonce", "wait",
                 "closing", "events")

    def __init__(self, sock, peer, now):
        self.sock = sock
        self.peer = peer
        self.ip = peer[0] if isinstance(peer, tuple) else str(peer)
        self.inbuf = bytearray()
        self.need = 4             # bytes still missing of the header or body
        self.head = True          # reading a header (else a body)
        self.frame_t0 = None      # when the current frame's first byte came
        self.last = now           # end of the last request (idle clock)
        self.born = now
        self.out = bytearray()    # reply not yet sent
        self.out_t0 = None
        self.space = None         # authenticated namespace (None: the open space)
        self.namespace = None     # AUTH in progress
        self.nonce = None
        self.wait = None          # (keys, deadline, op, namespace) of a blocked GET/WAIT
        self.closing = False      # close once the reply is out
        self.events = 0


class StoreServer:
    """In-memory key-value store served over TCP.

    :param host: address to bind (``"127.0.0.1"`` for local jobs; a public
        address only when remote ranks must reach it).
    :param port: TCP port; 0 picks a free one (see :attr:`port`).
    :param require_auth: refuse data operations from connections that did not
        prove a job (AUTH/PROVE, see :mod:`erdmampi.rendezvous`); needs ``admit``.
    :param admit: job secrets (bytes or hex) whose jobs may create a space
        here; with any, a PROVE for a new space must carry the admission tag
        of one of them (a stranger cannot create a space). Empty: any job that
        proves a key gets a space (bounded by ``max_spaces``).
    :param job_ttl: seconds after which the space of an authenticated job that
        nobody used is dropped (None: never); lets one long-running server host
        many jobs.
    :param limits: overrides of :data:`LIMITS`.

    Each authenticated job has a space of its own; clients without a job
    secret share the open space (unless ``require_auth``).
    """

    def __init__(self, host="127.0.0.1", port=0, require_auth=False, job_ttl=None,
                 admit=(), **limits):
        unknown = set(limits) - set(LIMITS)
        if unknown:
            raise TypeError(f"unknown store limits: {sorted(unknown)}")
        self.limits = dict(LIMITS, **limits)
        from erdmampi.jobauth import admission_key
        self._admit = [admission_key(k) for k in admit]
        if require_auth and not self._admit:
            raise ValueError("require_auth needs the secrets of the jobs to admit (admit=, "
                             "--admit-file): otherwise any stranger could create a job space")
        self.require_auth = require_auth
        self.job_ttl = job_ttl
        self._data = {}                 # the open space
        self._open_bytes = 0
        self._spaces = {}               # namespace -> {"data", "key", "used", "bytes"}
        self._total = 0                 # bytes in all spaces
        self._waiters = {}              # (namespace, key) -> set of _Conn
        self._nwaiting = 0              # keys registered in _waiters, all connections
        self._lock = threading.RLock()
        self._closed = False
        self._conns = set()
        self._per_ip = {}
        # "::" serves IPv4 clients too, where the system can (dual-stack)
        self._listener = socket.create_server((host, port), backlog=1024,
                                              family=socket.AF_INET6 if ":" in host
                                              else socket.AF_INET, reuse_port=False,
                                              dualstack_ipv6=(host == "::" and
                                                              socket.has_dualstack_ipv6()))
        self._listener.setblocking(False)
        self._max_conns = self._fd_budget(self.limits["max_conns"])
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, "listen")
        self._listening = True
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._dirty = []                # (namespace, key) set from another thread
        self._thread = None
        self._loop_thread = None
        self._done = threading.Event()
        self._shut = False

    @staticmethod
    def _fd_budget(want):
        """Connections the process's descriptor limit allows (raising the soft
        limit towards the hard one when needed)."""
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            need = want + 256
            if soft != resource.RLIM_INFINITY and soft < need:
                new = need if hard == resource.RLIM_INFINITY else min(need, hard)
                try:
                    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
                    soft = new
                except (ValueError, OSError):
                    pass
            if soft != resource.RLIM_INFINITY:
                return min(want, max(16, soft - 128))
        except ImportError:
            pass
        return want

    @property
    def host(self):
        return self._listener.getsockname()[0]

    @property
    def port(self):
        return self._listener.getsockname()[1]

    @property
    def address(self):
        host = self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def start(self):
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, name="erdma-store",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        self._loop_thread = threading.current_thread()
        try:
            self._loop()
        finally:
            self._shutdown()
            self._done.set()

    def close(self):
        """Stop serving; blocked requests are answered TIMEOUT, connections closed.

        Safe from any thread and from a signal handler of the serving thread."""
        with self._lock:
            self._closed = True
        self._wake()
        if self._loop_thread is None:
            self._shutdown()              # never served
        elif self._loop_thread is not threading.current_thread():
            self._done.wait(5)

    def __enter__(self):
        return self.start() if self._thread is None else self

    def __exit__(self, *exc):
        self.close()

    def keys(self, namespace=None):
        """Keys of the open space, or of the job space ``namespace`` (bytes)."""
        with self._lock:
            return list(self._space_data(namespace))

    def jobs(self):
        """Namespaces of the authenticated jobs this server holds."""
        with self._lock:
            return list(self._spaces)

    def connections(self):
        """Number of client connections open now."""
        with self._lock:
            return len(self._conns)

    def inject(self, namespace, key, value):
        """Put a value into a space from inside the server process (wakes waiters)."""
        with self._lock:
            if namespace is not None and namespace not in self._spaces:
                return
            self._store(namespace, key, value, quota=False)
            self._dirty.append((namespace, key))
        self._wake()

    def pending(self):
        """``[(namespace, key), ...]`` that clients are waiting for right now."""
        with self._lock:
            return list(self._waiters)

    # Hooks for subclasses (called with the lock held; must not block)

    def _on_set(self, namespace, key, value):
        pass

    # -- the loop --

    def _wake(self):
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _loop(self):
        next_sweep = time.monotonic() + _SWEEP
        while True:
            with self._lock:
                if self._closed:
                    return
            for key, mask in self._sel.select(timeout=max(0.0, next_sweep - time.monotonic())):
                tag = key.data
                if tag == "listen":
                    self._accept()
                elif tag == "wake":
                    try:
                        while self._wake_r.recv(4096):
                            pass
                    except OSError:
                        pass
                    with self._lock:
                        dirty, self._dirty = self._dirty, []
                        for pk in dirty:
                            self._wake_waiters(*pk)
                else:
                    conn = tag
                    if conn.sock is None:
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._flush(conn)
                    if conn.sock is not None and mask & selectors.EVENT_READ:
                        self._readable(conn)
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + _SWEEP

    def _accept(self):
        for _ in range(64):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:     # e.g. out of descriptors: pause accepting a moment
                log.warning("store: accept failed: %s", e)
                self._pause_listening()
                return
            ip = peer[0] if isinstance(peer, tuple) else str(peer)
            with self._lock:
                full = (len(self._conns) >= self._max_conns
                        or self._per_ip.get(ip, 0) >= self.limits["max_conns_per_source"])
                if not full:
                    now = time.monotonic()
                    conn = _Conn(sock, peer, now)
                    self._conns.add(conn)
                    self._per_ip[ip] = self._per_ip.get(ip, 0) + 1
            if full:
                sock.close()
                continue
            sock.setblocking(False)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
            self._set_events(conn, selectors.EVENT_READ)

    def _pause_listening(self):
        if self._listening:
            self._sel.unregister(self._listener)
            self._listening = False

    def _set_events(self, conn, events):
        if conn.sock is None or events == conn.events:
            return
        if conn.events == 0:
            self._sel.register(conn.sock, events, conn)
        elif events == 0:
            self._sel.unregister(conn.sock)
        else:
            self._sel.modify(conn.sock, events, conn)
        conn.events = events

    def _close(self, conn):
        if conn.sock is None:
            return
        self._set_events(conn, 0)
        try:
            conn.sock.close()
        except OSError:
            pass
        conn.sock = None
        with self._lock:
            self._unwait(conn)
            self._conns.discard(conn)
            n = self._per_ip.get(conn.ip, 0) - 1
            if n > 0:
                self._per_ip[conn.ip] = n
            else:
                self._per_ip.pop(conn.ip, None)
        conn.inbuf = conn.out = None

    def _drop(self, conn):
        """Close a connection that broke the protocol: FIN first, and what it
        already sent drained, so it reads EOF rather than a reset."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            for _ in range(16):
                if not conn.sock.recv(1 << 16):
                    break
        except OSError:
            pass
        self._close(conn)

    def _readable(self, conn):
        if conn.wait is not None or conn.out:
            # one request at a time: only notice a hang-up while blocked or replying
            try:
                if conn.sock.recv(1, socket.MSG_PEEK) == b"":
                    self._close(conn)
                else:
                    self._set_events(conn, selectors.EVENT_WRITE if conn.out else 0)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._close(conn)
            return
        try:
            chunk = conn.sock.recv(min(conn.need, 1 << 16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not chunk:
            self._close(conn)
            return
        if conn.frame_t0 is None:
            conn.frame_t0 = time.monotonic()
        conn.inbuf += chunk
        conn.need -= len(chunk)
        if conn.need:
            return
        if conn.head:
            limit = rz.MAX_FRAME if conn.space is not None else rz.MAX_FRAME_UNAUTH
            try:
                conn.need = rz.frame_length(bytes(conn.inbuf), limit)
            except rz.StoreError as e:
                log.warning("store: dropping %s: %s", _show_peer(conn.peer), e)
                self._drop(conn)
                return
            conn.head = False
            conn.inbuf = bytearray()
            return
        body, conn.inbuf = bytes(conn.inbuf), bytearray()
        conn.head, conn.need, conn.frame_t0 = True, 4, None
        self._request(conn, body)

    def _request(self, conn, body):
        try:
            op, fields = rz.unpack_fields(body)
        except rz.StoreError as e:
            self._reply(conn, rz.ST_ERROR, [str(e).encode()], close=True)
            return
        close = False
        try:
            with self._lock:
                res = self._dispatch(op, fields, conn=conn)
        except _AuthFailed as e:
            res, close = (rz.ST_ERROR, [str(e).encode()]), True
        except Exception as e:  # bad request: answer, keep serving
            res = rz.ST_ERROR, [f"{type(e).__name__}: {e}".encode()]
        if res is not None:      # None: the connection now waits for keys
            self._reply(conn, *res, close=close)

    def _reply(self, conn, status, fields, close=False):
        if conn.sock is None:
            return
        conn.out += rz.encode_frame(status, fields)
        conn.out_t0 = time.monotonic()
        conn.last = conn.out_t0
        conn.closing = conn.closing or close
        self._flush(conn)

    def _flush(self, conn):
        try:
            while conn.out:
                n = conn.sock.send(conn.out)
                del conn.out[:n]
        except (BlockingIOError, InterruptedError):
            self._set_events(conn, selectors.EVENT_WRITE)
            return
        except OSError:
            self._close(conn)
            return
        conn.out_t0 = None
        if conn.closing:
            self._close(conn)
            return
        self._set_events(conn, selectors.EVENT_READ)

    def _sweep(self, now):
        lim = self.limits
        if not self._listening and len(self._conns) < self._max_conns:
            self._sel.register(self._listener, selectors.EVENT_READ, "listen")
            self._listening = True
        expired = []
        with self._lock:
            for conn in self._conns:
                if conn.out_t0 is not None:
                    if now - conn.out_t0 > lim["write_timeout"]:
                        expired.append((conn, None, "did not take its reply"))
                elif conn.wait is not None:
                    deadline = conn.wait[1]
                    if deadline is not None and now >= deadline:
                        expired.append((conn, conn.wait, None))
                elif conn.frame_t0 is not None:
                    if now - conn.frame_t0 > lim["read_timeout"]:
                        expired.append((conn, None, "frame not complete within "
                                        f"{lim['read_timeout']:g} s"))
                elif now - conn.last > lim["idle_timeout"]:
                    expired.append((conn, None, None))
                if (self.require_auth and conn.space is None
                        and now - conn.born > lim["auth_timeout"]):
                    expired.append((conn, None, "did not authenticate within "
                                    f"{lim['auth_timeout']:g} s"))
        for conn, wait, why in expired:
            if conn.sock is None:
                continue
            if wait is not None:
                with self._lock:
                    self._unwait(conn)
                    data = self._space_data(wait[3])
                    missing = [k for k in wait[0] if k not in data]
                self._reply(conn, rz.ST_TIMEOUT, missing)
                continue
            if why:
                log.warning("store: closing the connection of %s: %s",
                            _show_peer(conn.peer), why)
            self._close(conn)

    def _shutdown(self):
        with self._lock:
            if self._shut:
                return
            self._shut = True
            conns = list(self._conns)
        for conn in conns:
            if conn.sock is None:
                continue
            if conn.wait is not None:
                missing = list(conn.wait[0])
                with self._lock:
                    self._unwait(conn)
                try:
                    conn.sock.send(bytes(conn.out) + rz.encode_frame(rz.ST_TIMEOUT, missing))
                except OSError:
                    pass
            self._close(conn)
        try:
            self._sel.close()
        except OSError:
            pass
        for s in (self._listener, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass

    # -- state (with the lock held) --

    def _space_data(self, namespace):
        if namespace is None:
            return self._data
        sp = self._spaces.get(namespace)
        return sp["data"] if sp is not None else {}

    def _store(self, namespace, key, value, quota=True):
        """Set key (quota checked first); raises MemoryError over a quota."""
        if namespace is None:
            data, used = self._data, self._open_bytes
        else:
            sp = self._spaces[namespace]
            data, used = sp["data"], sp["bytes"]
        old = data.get(key)
        delta = len(value) - (len(old) if old is not None else -len(key) - _KEY_OVERHEAD)
        if quota:
            lim = self.limits
            if old is None and len(data) >= lim["max_keys"]:
                raise MemoryError(f"this job's space is full ({lim['max_keys']} keys)")
            if used + delta > lim["max_bytes"]:
                raise MemoryError(f"this job's space is full ({lim['max_bytes']} bytes)")
            if self._total + delta > lim["max_total_bytes"]:
                raise MemoryError("the rendezvous store is full")
        data[key] = value
        self._total += delta
        if namespace is None:
            self._open_bytes += delta
        else:
            self._spaces[namespace]["bytes"] += delta

    def _remove(self, namespace, key):
        data = self._space_data(namespace)
        old = data.pop(key, None)
        if old is None:
            return False
        delta = len(key) + len(old) + _KEY_OVERHEAD
        self._total -= delta
        if namespace is None:
            self._open_bytes -= delta
        else:
            self._spaces[namespace]["bytes"] -= delta
        return True

    def _unwait(self, conn):
        w, conn.wait = conn.wait, None
        if w is None:
            return
        self._nwaiting -= len(w[0])
        for k in w[0]:
            pk = (w[3], k)
            s = self._waiters.get(pk)
            if s is not None:
                s.discard(conn)
                if not s:
                    del self._waiters[pk]

    def _wake_waiters(self, namespace, key):
        conns = self._waiters.get((namespace, key))
        if not conns:
            return
        data = self._space_data(namespace)
        for conn in list(conns):
            if conn.wait is None:
                continue
            keys, _, op, ns = conn.wait
            if all(k in data for k in keys):
                self._unwait(conn)
                self._reply(conn, rz.ST_OK, [data[keys[0]]] if op == rz.OP_GET else [])

    def _block(self, conn, keys, timeout_ms, op, ns):
        """Answer now if all keys exist or the timeout is 0; else register a waiter."""
        data = self._space_data(ns)
        missing = [k for k in keys if k not in data]
        if not missing:
            return rz.ST_OK, ([data[keys[0]]] if op == rz.OP_GET else [])
        if timeout_ms == 0 or self._closed:
            return rz.ST_TIMEOUT, missing
        keys = list(dict.fromkeys(keys))
        if self._nwaiting + len(keys) > self.limits["max_waiting"]:
            raise MemoryError("the rendezvous store has too many blocked requests")
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        conn.wait = (keys, deadline, op, ns)
        self._nwaiting += len(keys)
        for k in keys:
            self._waiters.setdefault((ns, k), set()).add(conn)
        return None

    def _auth(self, op, f, conn):
        if op == rz.OP_AUTH:
            _need(f, 1, "AUTH")
            ns = f[0]
            if not 8 <= len(ns) <= 128:
                raise _AuthFailed("AUTH: bad job namespace")
            conn.namespace, conn.nonce = ns, os.urandom(32)
            return rz.ST_OK, [conn.nonce]
        if len(f) not in (2, 3):
            raise _AuthFailed(f"PROVE takes 2 or 3 fields, got {len(f)}")
        if conn.nonce is None:
            raise _AuthFailed("PROVE without AUTH")
        ns, nonce, conn.nonce = conn.namespace, conn.nonce, None
        from erdmampi.jobauth import admit_tag, verify_challenge
        pub, sig = f[0], f[1]
        sp = self._spaces.get(ns)
        ok = verify_challenge(ns, nonce, pub, sig) and (sp is None or sp["key"] == pub)
        if ok and sp is None and self._admit:
            tag = f[2] if len(f) == 3 else b""
            ok = any(hmac.compare_digest(admit_tag(k, ns, nonce, pub), tag)
                     for k in self._admit)
            if not ok:
                log.warning("store: refused to admit a new job space from %s",
                            _show_peer(conn.peer))
                raise _AuthFailed("job not admitted: this rendezvous store only creates "
                                  "spaces for jobs whose secret it was given (--admit-file)")
        if not ok:
            log.warning("store: refused job authentication from %s for job space %s",
                        _show_peer(conn.peer), ns.decode(errors="replace"))
            raise _AuthFailed("job authentication failed: this client does not hold the "
                              "job's secret")
        now = time.monotonic()
        if sp is None:
            self._expire(now)
            if len(self._spaces) >= self.limits["max_spaces"]:
                raise _AuthFailed("the rendezvous store holds too many jobs")
            sp = self._spaces[ns] = {"data": {}, "key": bytes(pub), "used": now, "bytes": 0}
            log.info("store: job space %s created by %s (%d spaces)",
                     ns.decode(errors="replace")[:16], _show_peer(conn.peer), len(self._spaces))
        else:
            log.info("store: %s joined job space %s", _show_peer(conn.peer),
                     ns.decode(errors="replace")[:16])
        sp["used"] = now
        conn.space = ns
        return rz.ST_OK, []

    def _expire(self, now):
        if self.job_ttl is None:
            return
        for ns in [ns for ns, sp in self._spaces.items()
                   if now - sp["used"] > self.job_ttl]:
            sp = self._spaces.pop(ns)
            self._total -= sp["bytes"]

    def _dispatch(self, op, f, conn):
        if op in (rz.OP_AUTH, rz.OP_PROVE):
            return self._auth(op, f, conn)
        if op == rz.OP_PING:
            return rz.ST_OK, []
        ns = conn.space
        if ns is None:
            if self.require_auth:
                raise PermissionError("this rendezvous store only serves authenticated "
                                      "jobs: set a job secret (ERDMA_JOB_SECRET)")
            data = self._data
        else:
            sp = self._spaces.get(ns)
            if sp is None:      # expired under us: start afresh
                raise PermissionError("the job's space expired on this store")
            sp["used"] = time.monotonic()
            data = sp["data"]
        if op == rz.OP_SET:
            _need(f, 2, "SET")
            self._store(ns, f[0], f[1])
            self._on_set(ns, f[0], f[1])
            self._wake_waiters(ns, f[0])
            return rz.ST_OK, []
        if op == rz.OP_GET:
            _need(f, 2, "GET")
            return self._block(conn, [f[0]], _int(f[1], "GET timeout"), op, ns)
        if op == rz.OP_ADD:
            _need(f, 2, "ADD")
            old = data.get(f[0], b"0")
            try:
                if len(old) > _ADD_MAX_DIGITS or len(f[1]) > _ADD_MAX_DIGITS:
                    raise ValueError
                value = int(old) + int(f[1])
            except ValueError:
                raise ValueError(f"ADD: key {f[0].decode(errors='replace')[:64]!r} holds a "
                                 f"non-integer value, or the delta is not an integer "
                                 f"(at most {_ADD_MAX_DIGITS} digits)") from None
            self._store(ns, f[0], str(value).encode())
            self._wake_waiters(ns, f[0])
            return rz.ST_OK, [data[f[0]]]
        if op == rz.OP_WAIT:
            if not f:
                raise ValueError("WAIT needs a timeout field")
            if len(f) - 1 > _MAX_WAIT_KEYS:
                raise ValueError(f"WAIT takes at most {_MAX_WAIT_KEYS} keys")
            return self._block(conn, f[1:], _int(f[0], "WAIT timeout"), op, ns)
        if op == rz.OP_CHECK:
            return rz.ST_OK, [b"1" if all(k in data for k in f) else b"0"]
        if op == rz.OP_DELETE:
            _need(f, 1, "DELETE")
            return rz.ST_OK, [b"1" if self._remove(ns, f[0]) else b"0"]
        raise ValueError(f"unknown store operation {op}")


def _need(fields, n, name):
    if len(fields) != n:
        raise ValueError(f"{name} takes {n} fields, got {len(fields)}")


def _int(text, what):
    if len(text) > 20:
        raise ValueError(f"{what} is not a number")
    return int(text)


def _show_peer(peer):
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)


def load_admit_file(path):
    """Job secrets (hex, one a line, ``#`` comments) that a store admits."""
    from erdmampi.jobauth import parse_secret
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read the admission file {path!r}: {e.strerror}") from None
    out = []
    for i, line in enumerate(lines, 1):
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(parse_secret(line, f"{path}:{i}"))
    if not out:
        raise ValueError(f"{path}: no job secret in the admission file")
    return out


SERVE_DESCRIPTION = """\
Run a standalone erdmampi rendezvous store: a long-running TCP key-value
store where the ranks of any number of jobs meet (on one machine, across
machines or sites). Prints 'host:port' on one line once it listens and serves
until SIGINT/SIGTERM.

Jobs with a secret (ERDMA_JOB_SECRET, erdmarun --secret-file) prove it when
they connect and get a space of their own that no other client can read or
write; their record names are opaque and their values sealed. Jobs without a
secret share the open space, unless --require-auth refuses them.

Admission: with --require-auth the store creates a job's space only for jobs
whose secret it was given (--admit-file FILE: hex secrets, one a line; give
the same file to the sites with --secret-file, or one secret per team). A
stranger can then neither create a space nor store anything; the store's
operator holds those secrets, so run it where you trust the machine.

Limits (every client may be hostile): frames up to 64 KiB before a connection
authenticated and 16 MiB after; a frame must arrive whole within --read-timeout;
idle connections close after --idle-timeout (unauthenticated ones on a
--require-auth store after --auth-timeout); at most --max-conns connections,
--max-conns-per-source from one address; each job space holds at most
--max-keys keys and --max-bytes bytes, the store --max-spaces job spaces
and --max-total-bytes bytes in all.
"""

SERVE_EPILOG = """\
examples:
  python -m erdmampi.jobauth > job.key            (once; chmod 600)
  %(prog)s --host 0.0.0.0 --port 29500 --require-auth --admit-file job.key
  then on each site:  erdmarun --rendezvous SERVER:29500 --job-id run42 \\
                        --secret-file job.key -n 8 --local-n 4 python train.py
"""


def build_parser(prog="python -m erdmampi.launcher.store_server"):
    p = argparse.ArgumentParser(prog=prog, description=SERVE_DESCRIPTION, epilog=SERVE_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    add_server_options(p)
    return p


def add_server_options(p):
    """--require-auth, --admit-file, --job-ttl and the limits (shared with erdmarun)."""
    p.add_argument("--require-auth", action="store_true",
                   help="serve only jobs that prove a job secret (refuse the open space); "
                        "needs --admit-file")
    p.add_argument("--admit-file", action="append", default=[], metavar="FILE",
                   help="hex job secrets, one a line: only jobs with one of them may create "
                        "a job space (repeatable)")
    p.add_argument("--job-ttl", type=float, default=24 * 3600.0, metavar="SEC",
                   help="drop an authenticated job's records after SEC seconds without "
                        "use (default 86400)")
    for name, kind, what in (
            ("read_timeout", float, "seconds for one frame, first byte to last"),
            ("idle_timeout", float, "seconds a connection may idle between requests"),
            ("auth_timeout", float, "with --require-auth: seconds to authenticate"),
            ("max_conns", int, "connections in all"),
            ("max_conns_per_source", int, "connections from one IP address"),
            ("max_keys", int, "keys in one job space"),
            ("max_bytes", int, "bytes (keys and values) in one job space"),
            ("max_spaces", int, "job spaces"),
            ("max_total_bytes", int, "bytes in all spaces together")):
        default = LIMITS[name]
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=default,
                       metavar="N" if kind is int else "SEC",
                       help=f"{what} (default {default:g})" if kind is float
                       else f"{what} (default {default})")


def server_options(a):
    """(admit secrets, limits) from parsed :func:`add_server_options` arguments."""
    admit = [k for path in a.admit_file for k in load_admit_file(path)]
    if a.require_auth and not admit:
        raise ValueError("--require-auth needs --admit-file FILE (the hex secrets of the jobs "
                         "to admit; make one with: python -m erdmampi.jobauth)")
    limits = {}
    for name in LIMITS:
        v = getattr(a, name, None)
        if v is None:
            continue
        if v <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
        limits[name] = v
    return admit, limits


def serve(host, port, require_auth=False, job_ttl=None, out=sys.stdout, admit=(), **limits):
    """Run a store in the foreground until SIGINT/SIGTERM; returns an exit status."""
    try:
        server = StoreServer(host, port, require_auth=require_auth, job_ttl=job_ttl,
                             admit=admit, **limits)
    except OSError as e:
        sys.stderr.write(f"cannot listen on {host}:{port}: {e.strerror}\n")
        return 1
    if not logging.getLogger().handlers:
        # a standalone store logs joins (INFO) as well as refusals (WARNING)
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    def stop(signum, frame):
        server.close()

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    print(server.address, file=out, flush=True)
    try:
        server.serve_forever()
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        server.close()
    return 0


def main(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if a.job_ttl is not None and a.job_ttl <= 0:
        a.job_ttl = None
    try:
        admit, limits = server_options(a)
    except ValueError as e:
        p.error(str(e))
    return serve(a.host, a.port, a.require_auth, a.job_ttl, admit=admit, **limits)


if __name__ == "__main__":
    sys.exit(main())
