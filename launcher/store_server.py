"""Rendezvous store server (threaded TCP; Gloo ``Store`` semantics).

The wire encoding lives in :mod:`erdmampi.rendezvous`. ``erdmarun`` runs the
server in a thread of its own process; it can also run standalone::

    python -m erdmampi.launcher.store_server --host 0.0.0.0 --port 29500

which prints ``host:port`` on one line once it listens, and serves until
SIGINT/SIGTERM.
"""
import argparse
import logging
import os
import signal
import socket
import socketserver
import sys
import threading
import time

from erdmampi import rendezvous as rz

__all__ = ["StoreServer", "main", "build_parser"]

log = logging.getLogger("erdmampi.discovery")


class _Conn:
    """Per-connection state: the space it acts on (None: the open space)."""
    __slots__ = ("space", "namespace", "nonce", "peer")

    def __init__(self, peer=None):
        self.space = None
        self.namespace = None
        self.nonce = None
        self.peer = peer


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        store = self.server.store
        conn = _Conn(self.client_address)
        while True:
            try:
                req = rz.read_frame(sock)
            except (OSError, rz.StoreError):
                return
            if req is None:
                return
            close = False
            try:
                status, fields = store._dispatch(*req, conn=conn)
            except _AuthFailed as e:
                status, fields, close = rz.ST_ERROR, [str(e).encode()], True
            except Exception as e:  # bad request: answer, keep serving
                status, fields = rz.ST_ERROR, [f"{type(e).__name__}: {e}".encode()]
            try:
                sock.sendall(rz.encode_frame(status, fields))
            except OSError:
                return
            if close:
                return


class _AuthFailed(Exception):
    """A connection failed to prove its job: answered, then closed."""


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


class StoreServer:
    """In-memory key-value store served over TCP.

    :param host: address to bind (``"127.0.0.1"`` for local jobs, ``"0.0.0.0"`` for remote ones).
    :param port: TCP port; 0 picks a free one (see :attr:`port`).
    :param require_auth: refuse data operations from connections that did not
        prove a job (AUTH/PROVE, see :mod:`erdmampi.rendezvous`).
    :param job_ttl: seconds after which the space of an authenticated job that
        nobody used is dropped (None: never); lets one long-running server host
        many jobs.

    Each authenticated job has a space of its own; clients without a job
    secret share the open space.
    """

    def __init__(self, host="127.0.0.1", port=0, require_auth=False, job_ttl=None):
        self._data = {}                 # the open space
        self._spaces = {}               # namespace -> {"data": {}, "key": pubkey, "used": t}
        self._pending = {}              # (namespace or None, key) -> number of waiters
        self.require_auth = require_auth
        self.job_ttl = job_ttl
        self._cond = threading.Condition()
        self._closed = False
        self._server = _TCPServer((host, port), _Handler)
        self._server.store = self
        self._thread = None

    @property
    def host(self):
        return self._server.server_address[0]

    @property
    def port(self):
        return self._server.server_address[1]

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def start(self):
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.2},
                                        name="erdma-store", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self):
        self._server.serve_forever(poll_interval=0.2)

    def close(self):
        """Stop serving and wake every blocked request (they answer TIMEOUT)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
        self._server.server_close()

    def __enter__(self):
        return self.start() if self._thread is None else self

    def __exit__(self, *exc):
        self.close()

    def keys(self, namespace=None):
        """Keys of the open space, or of the job space ``namespace`` (bytes)."""
        with self._cond:
            return list(self._space_data(namespace))

    def jobs(self):
        """Namespaces of the authenticated jobs this server holds."""
        with self._cond:
            return list(self._spaces)

    def inject(self, namespace, key, value):
        """Put a value into a space from inside the server process (wakes waiters)."""
        with self._cond:
            self._space_data(namespace)[key] = value
            self._cond.notify_all()

    def pending(self):
        """``[(namespace, key), ...]`` that clients are waiting for right now."""
        with self._cond:
            return list(self._pending)

    # Hooks for subclasses (called with the lock held; must not block)

    def _on_set(self, namespace, key, value):
        pass

    # Private

    def _space_data(self, namespace):
        if namespace is None:
            return self._data
        sp = self._spaces.get(namespace)
        return sp["data"] if sp is not None else {}

    def _wait_for(self, data, keys, timeout_ms, namespace=None):
        """Wait under the lock until all keys exist; returns the missing ones."""
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        registered = []
        try:
            while True:
                missing = [k for k in keys if k not in data]
                if not missing or self._closed:
                    return missing
                if not registered:
                    for k in missing:
                        pk = (namespace, k)
                        self._pending[pk] = self._pending.get(pk, 0) + 1
                        registered.append(pk)
                if deadline is None:
                    self._cond.wait(1.0)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return missing
                    self._cond.wait(left)
        finally:
            for pk in registered:
                n = self._pending.get(pk, 0) - 1
                if n > 0:
                    self._pending[pk] = n
                else:
                    self._pending.pop(pk, None)

    def _auth(self, op, f, conn):
        if op == rz.OP_AUTH:
            _need(f, 1, "AUTH")
            ns = f[0]
            if not 8 <= len(ns) <= 128:
                raise _AuthFailed("AUTH: bad job namespace")
            conn.namespace, conn.nonce = ns, os.urandom(32)
            return rz.ST_OK, [conn.nonce]
        _need(f, 2, "PROVE")
        if conn.nonce is None:
            raise _AuthFailed("PROVE without AUTH")
        ns, nonce, conn.nonce = conn.namespace, conn.nonce, None
        from erdmampi.jobauth import verify_challenge
        pub, sig = f
        sp = self._spaces.get(ns)
        ok = verify_challenge(ns, nonce, pub, sig) and (sp is None or sp["key"] == pub)
        if not ok:
            log.warning("store: refused job authentication from %s for job space %s",
                        conn.peer, ns.decode(errors="replace"))
            raise _AuthFailed("job authentication failed: this client does not hold the "
                              "job's secret")
        now = time.monotonic()
        if sp is None:
            self._expire(now)
            sp = self._spaces[ns] = {"data": {}, "key": bytes(pub), "used": now}
        sp["used"] = now
        conn.space = ns
        return rz.ST_OK, []

    def _expire(self, now):
        if self.job_ttl is None:
            return
        for ns in [ns for ns, sp in self._spaces.items()
                   if now - sp["used"] > self.job_ttl]:
            del self._spaces[ns]

    def _dispatch(self, op, f, conn=None):
        with self._cond:
            if op in (rz.OP_AUTH, rz.OP_PROVE):
                if conn is None:
                    raise ValueError("AUTH needs a connection")
                return self._auth(op, f, conn)
            if op == rz.OP_PING:
                return rz.ST_OK, []
            ns = conn.space if conn is not None else None
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
                data[f[0]] = f[1]
                self._on_set(ns, f[0], f[1])
                self._cond.notify_all()
                return rz.ST_OK, []
            if op == rz.OP_GET:
                _need(f, 2, "GET")
                missing = self._wait_for(data, [f[0]], int(f[1]), ns)
                if missing:
                    return rz.ST_TIMEOUT, missing
                return rz.ST_OK, [data[f[0]]]
            if op == rz.OP_ADD:
                _need(f, 2, "ADD")
                old = data.get(f[0], b"0")
                try:
                    value = int(old) + int(f[1])
                except ValueError:
                    raise ValueError(f"ADD: key {f[0].decode(errors='replace')!r} "
                                     f"holds a non-integer value") from None
                data[f[0]] = str(value).encode()
                self._cond.notify_all()
                return rz.ST_OK, [data[f[0]]]
            if op == rz.OP_WAIT:
                if not f:
                    raise ValueError("WAIT needs a timeout field")
                missing = self._wait_for(data, f[1:], int(f[0]), ns)
                return (rz.ST_TIMEOUT, missing) if missing else (rz.ST_OK, [])
            if op == rz.OP_CHECK:
                return rz.ST_OK, [b"1" if all(k in data for k in f) else b"0"]
            if op == rz.OP_DELETE:
                _need(f, 1, "DELETE")
                return rz.ST_OK, [b"1" if data.pop(f[0], None) is not None else b"0"]
        raise ValueError(f"unknown store operation {op}")


def _need(fields, n, name):
    if len(fields) != n:
        raise ValueError(f"{name} takes {n} fields, got {len(fields)}")


SERVE_DESCRIPTION = """\
Run a standalone erdmampi rendezvous store: a long-running TCP key-value
store where the ranks of any number of jobs meet (on one machine, across
machines or sites). Prints 'host:port' on one line once it listens and serves
until SIGINT/SIGTERM.

Jobs with a secret (ERDMA_JOB_SECRET, erdmarun --secret-file) prove it when
they connect and get a space of their own that no other client can read or
write; their record names are opaque and their values sealed, so the server
never sees a plaintext record. Jobs without a secret share the open space,
unless --require-auth refuses them.
"""

SERVE_EPILOG = """\
examples:
  %(prog)s --host 0.0.0.0 --port 29500 --require-auth
  then on each site:  erdmarun --rendezvous SERVER:29500 --job-id run42 \\
                        --secret-file job.key -n 8 --local-n 4 python train.py
"""


def build_parser(prog="python -m erdmampi.launcher.store_server"):
    p = argparse.ArgumentParser(prog=prog, description=SERVE_DESCRIPTION, epilog=SERVE_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    p.add_argument("--require-auth", action="store_true",
                   help="serve only jobs that prove a job secret (refuse the open space)")
    p.add_argument("--job-ttl", type=float, default=24 * 3600.0, metavar="SEC",
                   help="drop an authenticated job's records after SEC seconds without "
                        "use (default 86400)")
    return p


def serve(host, port, require_auth=False, job_ttl=None, out=sys.stdout):
    """Run a store in the foreground until SIGINT/SIGTERM; returns an exit status."""
    try:
        server = StoreServer(host, port, require_auth=require_auth, job_ttl=job_ttl)
    except OSError as e:
        sys.stderr.write(f"cannot listen on {host}:{port}: {e.strerror}\n")
        return 1
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    print(server.address, file=out, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, old)
        server.close()
    return 0


def main(argv=None):
    a = build_parser().parse_args(argv)
    if a.job_ttl is not None and a.job_ttl <= 0:
        a.job_ttl = None
    return serve(a.host, a.port, a.require_auth, a.job_ttl)


if __name__ == "__main__":
    sys.exit(main())
