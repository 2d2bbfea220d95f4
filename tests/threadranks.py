"""Run N ranks as threads in one process (Gloo's ``spawn`` test pattern).

:class:`ThreadTransport` implements :class:`erdmampi.collectives.base.Transport`
with honest message passing between the threads:

* per (source, tag) FIFO matching at each destination, like MPI;
* ``isend`` never blocks; in the default *rendezvous* mode the payload is
  copied from the sender's live buffer only when the receive is matched and
  the send request completes only then, so an algorithm that reuses a send
  buffer too early, or relies on buffering to avoid a deadlock, fails;
  ``eager=True`` instead snapshots the bytes at ``isend``;
* a receive buffer must have exactly the size of the matched message
  (stricter than MPI, to catch count bugs), except for ``irecv_upto``,
  which takes a message of at most the buffer's size (variable-length
  encodings of the compressed collectives);
* ``send_obj`` pickles and (rendezvous mode) blocks until matched;
* a wait that makes no progress for ``timeout`` seconds, or an error on any
  rank, aborts every rank with an exception instead of hanging.
"""

from __future__ import annotations

import pickle
import threading
from collections import defaultdict, deque
from typing import Any, Callable

import numpy as np

__all__ = ["Fabric", "ThreadTransport", "spawn", "Deadlock"]


class Deadlock(RuntimeError):
    """No progress within the fabric's timeout, or another rank failed."""


class _Req:
    __slots__ = ("done", "buf", "kind", "obj", "src", "tag", "dest", "upto", "nbytes")

    def __init__(self, kind, buf=None, obj=None, upto=False):
        self.done = False
        self.upto = upto        # receive: a shorter message is allowed
        self.nbytes = 0         # receive: bytes delivered
        self.kind = kind        # "buf" or "obj"
        self.buf = buf          # send: array or snapshot bytes; recv: array
        self.obj = obj          # received object / pickled payload


def _bytes_view(buf) -> np.ndarray:
    if isinstance(buf, (bytes, bytearray)):
        return np.frombuffer(buf, dtype=np.uint8)
    return buf.reshape(-1).view(np.uint8)


class Fabric:
    """Shared mailboxes of ``size`` ranks, guarded by one condition variable."""

    def __init__(self, size: int, eager: bool = False, timeout: float = 30.0):
        self.size = size
        self.eager = eager
        self.timeout = timeout
        self.cv = threading.Condition()
        # per destination: (src, tag) -> deque of pending sends / posted recvs
        self.unexpected = [defaultdict(deque) for _ in range(size)]
        self.posted = [defaultdict(deque) for _ in range(size)]
        self.failed: BaseException | None = None
        self.messages = 0
        self.bytes = 0

    def _deliver(self, send: _Req, recv: _Req) -> None:
        if send.kind != recv.kind:
            raise RuntimeError(f"message kind mismatch: {send.kind} sent, "
                               f"{recv.kind} expected (src={send.src} tag={send.tag})")
        if send.kind == "buf":
            src = _bytes_view(send.buf)
            dst = _bytes_view(recv.buf)
            if src.size != dst.size and not (recv.upto and src.size <= dst.size):
                raise RuntimeError(f"size mismatch: {src.size} bytes sent from "
                                   f"{send.src} to {send.dest} tag {send.tag}, "
                                   f"receive buffer has {dst.size}")
            np.copyto(dst[:src.size], src)
            recv.nbytes = src.size
            self.bytes += src.size
        else:
            recv.obj = send.obj
        self.messages += 1
        send.done = recv.done = True
        self.cv.notify_all()

    def post_send(self, req: _Req, src: int, dest: int, tag: int) -> None:
        self._check_peer(dest, tag)
        req.src, req.dest, req.tag = src, dest, tag
        with self.cv:
            q = self.posted[dest][(src, tag)]
            if q:
                self._deliver(req, q.popleft())
            else:
                self.unexpected[dest][(src, tag)].append(req)
                if self.eager:
                    req.done = True

    def post_recv(self, req: _Req, me: int, src: int, tag: int) -> None:
        self._check_peer(src, tag)
        req.src, req.dest, req.tag = src, me, tag
        with self.cv:
            q = self.unexpected[me][(src, tag)]
            if q:
                self._deliver(q.popleft(), req)
            else:
                self.posted[me][(src, tag)].append(req)

    def wait(self, reqs) -> None:
        with self.cv:
            while True:
                if self.failed is not None:
                    raise Deadlock("another rank failed") from self.failed
                if all(r.done for r in reqs):
                    return
                if not self.cv.wait(self.timeout):
                    self.fail(Deadlock(f"no progress for {self.timeout}s"))

    def fail(self, exc: BaseException) -> None:
        with self.cv:
            if self.failed is None:
                self.failed = exc
            self.cv.notify_all()

    def _check_peer(self, peer: int, tag: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"peer {peer} out of range")
        if not 0 <= tag <= 1023:
            raise ValueError(f"tag {tag} out of range 0..1023")

    def assert_drained(self) -> None:
        """Every message sent was received and no receive is left posted."""
        for d in range(self.size):
            for key, q in self.unexpected[d].items():
                assert not q, f"unreceived message to {d} from/tag {key}"
            for key, q in self.posted[d].items():
                assert not q, f"unmatched receive at {d} from/tag {key}"


class ThreadTransport:
    """One rank's endpoint on a :class:`Fabric` (a Transport)."""

    def __init__(self, fabric: Fabric, rank: int):
        self.fabric = fabric
        self.rank = rank
        self.size = fabric.size

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> _Req:
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
            raise TypeError("isend needs a C-contiguous numpy array")
        req = _Req("buf", buf.tobytes() if self.fabric.eager else buf)
        self.fabric.post_send(req, self.rank, dest, tag)
        return req

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> _Req:
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
            raise TypeError("irecv needs a C-contiguous numpy array")
        if not buf.flags.writeable:
            raise TypeError("irecv needs a writable buffer")
        req = _Req("buf", buf)
        self.fabric.post_recv(req, self.rank, source, tag)
        return req

    def irecv_upto(self, buf: np.ndarray, source: int, tag: int) -> _Req:
        """Like :meth:`irecv`, but the message may be shorter than ``buf``."""
        if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
            raise TypeError("irecv_upto needs a C-contiguous numpy array")
        req = _Req("buf", buf, upto=True)
        self.fabric.post_recv(req, self.rank, source, tag)
        return req

    def send_obj(self, obj: Any, dest: int, tag: int) -> None:
        req = _Req("obj", obj=pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        self.fabric.post_send(req, self.rank, dest, tag)
        self.fabric.wait([req])

    def recv_obj(self, source: int, tag: int) -> Any:
        req = _Req("obj")
        self.fabric.post_recv(req, self.rank, source, tag)
        self.fabric.wait([req])
        return pickle.loads(req.obj)

    def waitall(self, reqs: list) -> None:
        self.fabric.wait(list(reqs))


def spawn(size: int, fn: Callable[[ThreadTransport], Any], eager: bool = False,
          timeout: float = 30.0) -> list:
    """Run ``fn(transport)`` on ``size`` threads; return the per-rank results.
    The first exception raised on any rank is re-raised here; afterwards the
    fabric must hold no unmatched message or receive."""
    fabric = Fabric(size, eager=eager, timeout=timeout)
    results: list = [None] * size
    errors: list = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = fn(ThreadTransport(fabric, rank))
        except BaseException as exc:  # noqa: BLE001 - reported to the caller
            errors[rank] = exc
            fabric.fail(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"rank{i}", daemon=True)
               for i in range(size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout * 4)
        if th.is_alive():
            fabric.fail(Deadlock("rank thread did not finish"))
            raise Deadlock(f"{th.name} did not finish")
    # report the root cause, not the Deadlocks it triggered on other ranks
    first = next((e for e in errors if e is not None and not isinstance(e, Deadlock)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    fabric.assert_drained()
    return results
