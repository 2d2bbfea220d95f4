"""Rendezvous store server (threaded TCP; Gloo ``Store`` semantics).

The wire encoding lives in :mod:`erdmampi.rendezvous`. ``erdmarun`` runs the
server in a thread of its own process; it can also run standalone::

    python -m erdmampi.launcher.store_server --host 0.0.0.0 --port 29500

which prints ``host:port`` on one line once it listens, and serves until
SIGINT/SIGTERM.
"""
import argparse
import signal
import socket
import socketserver
import sys
import threading
import time

from erdmampi import rendezvous as rz

__all__ = ["StoreServer", "main"]


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        sock = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        store = self.server.store
        while True:
            try:
                req = rz.read_frame(sock)
            except (OSError, rz.StoreError):
                return
            if req is None:
                return
            try:
                status, fields = store._dispatch(*req)
            except Exception as e:  # bad request: answer, keep serving
                status, fields = rz.ST_ERROR, [f"{type(e).__name__}: {e}".encode()]
            try:
                sock.sendall(rz.encode_frame(status, fields))
            except OSError:
                return


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024


class StoreServer:
    """In-memory key-value store served over TCP.

    :param host: address to bind (``"127.0.0.1"`` for local jobs, ``"0.0.0.0"`` for remote ones).
    :param port: TCP port; 0 picks a free one (see :attr:`port`).
    """

    def __init__(self, host="127.0.0.1", port=0):
        self._data = {}
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

    def keys(self):
        with self._cond:
            return list(self._data)

    # Private

    def _wait_for(self, keys, timeout_ms):
        """Wait under the lock until all keys exist; returns the missing ones."""
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        while True:
            missing = [k for k in keys if k not in self._data]
            if not missing or self._closed:
                return missing
            if deadline is None:
                self._cond.wait(1.0)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return missing
                self._cond.wait(left)

    def _dispatch(self, op, f):
        with self._cond:
            if op == rz.OP_SET:
                _need(f, 2, "SET")
                self._data[f[0]] = f[1]
                self._cond.notify_all()
                return rz.ST_OK, []
            if op == rz.OP_GET:
                _need(f, 2, "GET")
                missing = self._wait_for([f[0]], int(f[1]))
                if missing:
                    return rz.ST_TIMEOUT, missing
                return rz.ST_OK, [self._data[f[0]]]
            if op == rz.OP_ADD:
                _need(f, 2, "ADD")
                old = self._data.get(f[0], b"0")
                try:
                    value = int(old) + int(f[1])
                except ValueError:
                    raise ValueError(f"ADD: key {f[0].decode(errors='replace')!r} "
                                     f"holds a non-integer value") from None
                self._data[f[0]] = str(value).encode()
                self._cond.notify_all()
                return rz.ST_OK, [self._data[f[0]]]
            if op == rz.OP_WAIT:
                if not f:
                    raise ValueError("WAIT needs a timeout field")
                missing = self._wait_for(f[1:], int(f[0]))
                return (rz.ST_TIMEOUT, missing) if missing else (rz.ST_OK, [])
            if op == rz.OP_CHECK:
                return rz.ST_OK, [b"1" if all(k in self._data for k in f) else b"0"]
            if op == rz.OP_DELETE:
                _need(f, 1, "DELETE")
                return rz.ST_OK, [b"1" if self._data.pop(f[0], None) is not None else b"0"]
            if op == rz.OP_PING:
                return rz.ST_OK, []
        raise ValueError(f"unknown store operation {op}")


def _need(fields, n, name):
    if len(fields) != n:
        raise ValueError(f"{name} takes {n} fields, got {len(fields)}")


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m erdmampi.launcher.store_server",
        description="Run an erdmampi rendezvous store. Prints 'host:port' once listening; "
                    "ranks started by another launcher find it through ERDMA_RENDEZVOUS.")
    p.add_argument("--host", default="0.0.0.0", help="address to bind (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=0, help="TCP port (default: a free one)")
    a = p.parse_args(argv)
    server = StoreServer(a.host, a.port)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(server.address, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
