"""Compressed collective algorithms over a :class:`~.base.Transport`.

Every algorithm takes a *coder* (``erdmampi.compression.Coder``) that turns a
chunk of the vector into a self-describing encoding (host bytes) and back:

``coder.chunk_elems``            elements per chunk
``coder.max_size(count)``        worst-case encoded bytes of ``count`` elements
``coder.encode(view, peers, fb_key)`` -> uint8 host array
``coder.decode(enc, out_view)``  decode into a host or device view
``coder.decode_host(enc)``       -> host array
``coder.accumulate(enc, acc)``   ``acc += decode(enc)`` in float32 (lossy)
``coder.to_host(view)``, ``coder.copy(dst, src)``, ``coder.scratch_like(src)``
``coder.enc_len(buf)``           bytes of the encoding at the start of ``buf``
``coder.lossy``, ``coder.key``, ``coder.finish()``

Pipelining: a stream of chunks is encoded one chunk at a time and each is
sent (``isend`` returns at once; the engine sends from its own thread while
the Numba encoders run with the GIL released), so encoding chunk k+1
overlaps sending chunk k.  Receivers post the receives of the next
:data:`WINDOW` chunks ahead, each with room for the worst case, through
``Transport.irecv_upto`` (a message may be shorter than the buffer:
encodings vary in size), and decode chunk k while later chunks are still
arriving.  An encoding carries its own length in
its header, so no length is sent separately.

Allreduce is a reduce-scatter done as an all-to-all followed by an
all-gather (as ZeRO++ qgZ): rank r owns segment r; every rank encodes its
segment j for owner j; the owner decodes the n contributions and reduces
them in rank order (float32 sums for lossy codecs), encodes its result once
and sends that one encoding to every rank, which all decode it, the owner
included.  So a value is quantized at most twice whatever the number of
ranks (no error compounding hop after hop), every rank ends with
bit-identical results, and each rank sends the same (n-1)/n of the vector
per phase as a ring would, in one step instead of n-1.  Two ranks on two
hosts exchange their whole encoded vectors instead (one phase, chunks small
enough to go eager: no rendezvous round trips), as the uncompressed
two-host algorithm does (:mod:`erdmampi.collectives.wan`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from erdmampi.collectives.base import ReduceFn, Transport, check_root, even_blocks

__all__ = ["bcast", "scatter", "gather", "allgather", "alltoall", "allreduce"]

_T_DATA = 1
_T_RESULT = 2
#: receives posted ahead per chunk stream
WINDOW = 8
#: receives posted ahead in a two-host exchange (eager chunks: ~16 MiB)
EXCHANGE_WINDOW = 256


def _chunks(count: int, ce: int):
    return [(a, min(a + ce, count)) for a in range(0, count, ce)]


def _irecv(t: Transport, buf: np.ndarray, source: int, tag: int):
    fn = getattr(t, "irecv_upto", None)
    if fn is None:
        raise TypeError("compressed collectives need Transport.irecv_upto")
    return fn(buf, source, tag)


class _Stream:
    """The receives of one chunk stream from ``source``: the first
    :data:`WINDOW` are posted at once, then one more per chunk consumed, so
    memory stays bounded for long vectors."""

    def __init__(self, t, cd, count, source, tag, ce=None, window=WINDOW):
        self.t, self.cd, self.source, self.tag = t, cd, source, tag
        self.todo = _chunks(count, ce or cd.chunk_elems)
        self.next = 0
        self.posted = []
        for _ in range(min(window, len(self.todo))):
            self._post()

    def _post(self):
        a, b = self.todo[self.next]
        self.next += 1
        buf = np.empty(self.cd.max_size(b - a), np.uint8)
        self.posted.append((a, b, buf, _irecv(self.t, buf, self.source, self.tag)))

    def __iter__(self):
        while self.posted:
            a, b, buf, req = self.posted.pop(0)
            self.t.waitall([req])
            if self.next < len(self.todo):
                self._post()
            yield a, b, buf


def _send_encoded(t, cd, src, dests, tag, sends, fb_key=None, ce=None):
    """Encode ``src`` chunk by chunk, each chunk once, and send it to every
    rank in ``dests``."""
    for i, (a, b) in enumerate(_chunks(src.size, ce or cd.chunk_elems)):
        enc = cd.encode(src[a:b], dests, None if fb_key is None else fb_key + (i,))
        for d in dests:
            sends.append(t.isend(enc, d, tag))


def bcast(t: Transport, buf, root: int, cd) -> None:
    """Binomial tree; the root encodes each chunk once and inner ranks
    forward the encoded bytes unchanged while decoding them."""
    n, me = t.size, t.rank
    root = check_root("bcast", root, n)
    vr = (me - root) % n
    mask, parent = 1, None
    while mask < n:
        if vr & mask:
            parent = (vr - mask + root) % n
            break
        mask <<= 1
    children = []
    m = mask >> 1
    while m > 0:
        if vr + m < n:
            children.append((vr + m + root) % n)
        m >>= 1
    sends: list = []
    if parent is None:
        _send_encoded(t, cd, buf, children, _T_DATA, sends)
    else:
        for a, b, enc in _Stream(t, cd, buf.size, parent, _T_DATA):
            view = enc[:cd.enc_len(enc)]
            for c in children:
                sends.append(t.isend(view, c, _T_DATA))
            cd.decode(view, buf[a:b])
    t.waitall(sends)
    cd.finish()


def scatter(t: Transport, sendbuf, recvbuf, root: int, cd) -> None:
    """Linear: the root encodes block p for rank p (``recvbuf=None`` at the
    root: in place)."""
    n, me = t.size, t.rank
    root = check_root("scatter", root, n)
    sends: list = []
    if me == root:
        blk = sendbuf.size // n
        for i in range(1, n):
            p = (root + i) % n
            _send_encoded(t, cd, sendbuf[p * blk:(p + 1) * blk], [p], _T_DATA, sends)
        if recvbuf is not None:
            cd.copy(recvbuf, sendbuf[me * blk:(me + 1) * blk])
    else:
        for a, b, enc in _Stream(t, cd, recvbuf.size, root, _T_DATA):
            cd.decode(enc, recvbuf[a:b])
    t.waitall(sends)
    cd.finish()


def gather(t: Transport, sendbuf, recvbuf, root: int, cd) -> None:
    """Linear: every rank sends its encoded block to the root
    (``sendbuf=None`` at the root: in place)."""
    n, me = t.size, t.rank
    root = check_root("gather", root, n)
    sends: list = []
    if me == root:
        blk = recvbuf.size // n
        streams = [(p, _Stream(t, cd, blk, p, _T_DATA)) for p in range(n) if p != me]
        if sendbuf is not None:
            cd.copy(recvbuf[me * blk:(me + 1) * blk], sendbuf)
        for p, st in streams:
            for a, b, enc in st:
                cd.decode(enc, recvbuf[p * blk + a:p * blk + b])
    else:
        _send_encoded(t, cd, sendbuf, [root], _T_DATA, sends)
    t.waitall(sends)
    cd.finish()


def allgather(t: Transport, sendbuf, recvbuf, cd) -> None:
    """Each rank encodes its block once and sends it to every other rank
    (``sendbuf=None``: own block in place)."""
    n, me = t.size, t.rank
    blk = recvbuf.size // n
    streams = [(p, _Stream(t, cd, blk, p, _T_DATA)) for p in range(n) if p != me]
    own = recvbuf[me * blk:(me + 1) * blk]
    src = own if sendbuf is None else sendbuf
    sends: list = []
    peers = [(me + i) % n for i in range(1, n)]
    _send_encoded(t, cd, src, peers, _T_DATA, sends)
    if sendbuf is not None:
        cd.copy(own, sendbuf)
    for p, st in streams:
        for a, b, enc in st:
            cd.decode(enc, recvbuf[p * blk + a:p * blk + b])
    t.waitall(sends)
    cd.finish()


def alltoall(t: Transport, sendbuf, recvbuf, cd) -> None:
    """Direct exchange of encoded blocks (``sendbuf=None``: in place)."""
    n, me = t.size, t.rank
    blk = recvbuf.size // n
    if sendbuf is None:
        sendbuf = cd.scratch_like(recvbuf)
    streams = [(p, _Stream(t, cd, blk, p, _T_DATA)) for p in range(n) if p != me]
    sends: list = []
    for i in range(1, n):
        p = (me + i) % n
        _send_encoded(t, cd, sendbuf[p * blk:(p + 1) * blk], [p], _T_DATA, sends)
    cd.copy(recvbuf[me * blk:(me + 1) * blk], sendbuf[me * blk:(me + 1) * blk])
    for p, st in streams:
        for a, b, enc in st:
            cd.decode(enc, recvbuf[p * blk + a:p * blk + b])
    t.waitall(sends)
    cd.finish()


def allreduce(t: Transport, sendbuf, recvbuf, reduce_fn: Optional[ReduceFn], cd) -> None:
    """Reduce-scatter as an all-to-all, then an all-gather of each owner's
    single encoding (see the module docstring).  ``sendbuf=None``: in place.
    Lossless coders reduce with ``reduce_fn`` in rank order (so any
    associative op works); lossy coders sum in float32.  Two ranks on two
    hosts with a lossless coder run :func:`_allreduce_exchange` instead."""
    if _exchange_applies(t, sendbuf, recvbuf, cd):
        return _allreduce_exchange(t, sendbuf, recvbuf, reduce_fn, cd)
    n, me = t.size, t.rank
    src = recvbuf if sendbuf is None else sendbuf
    counts, displs = even_blocks(recvbuf.size, n)
    mine_c, mine_d = counts[me], displs[me]
    key = cd.key
    # every receive is posted before anything is sent
    contrib = {p: _Stream(t, cd, mine_c, p, _T_DATA) for p in range(n) if p != me}
    results = [(q, _Stream(t, cd, counts[q], q, _T_RESULT)) for q in range(n) if q != me]
    sends: list = []
    # phase 1: my slice of every other owner's segment
    for i in range(1, n):
        p = (me + i) % n
        seg = src[displs[p]:displs[p] + counts[p]]
        _send_encoded(t, cd, seg, [p], _T_DATA, sends,
                      None if not cd.lossy else (key, "rs", p))
    # phase 2: reduce my segment chunk by chunk, send the encoded result
    iters = {p: iter(s) for p, s in contrib.items()}
    peers = [(me + i) % n for i in range(1, n)]
    own = src[mine_d:mine_d + mine_c]
    for ci, (a, b) in enumerate(_chunks(mine_c, cd.chunk_elems)):
        parts = {}
        for p in range(n):
            if p != me:
                parts[p] = next(iters[p])[2]
        mine = cd.to_host(own[a:b])
        if cd.lossy:
            acc = np.zeros(b - a, np.float32)
            for p in range(n):
                if p == me:
                    acc += mine.astype(np.float32, copy=False)
                else:
                    cd.accumulate(parts[p], acc)
        else:
            vals = [mine if p == me else cd.decode_host(parts[p]) for p in range(n)]
            acc = np.array(vals[n - 1], copy=True)
            for p in range(n - 2, -1, -1):
                reduce_fn(vals[p], acc)
        if cd.lossy and acc.dtype != cd.dtype:
            acc = acc.astype(cd.dtype)      # the encoding carries the user's dtype
        enc = cd.encode(acc, peers, None if not cd.lossy else (key, "ag", ci))
        for q in peers:
            sends.append(t.isend(enc, q, _T_RESULT))
        if not cd.lossy and isinstance(recvbuf, np.ndarray):
            recvbuf[mine_d + a:mine_d + b] = acc     # what decoding would give
        else:
            cd.decode(enc, recvbuf[mine_d + a:mine_d + b])
    # phase 3: everybody else's results
    for q, st in results:
        for a, b, enc in st:
            cd.decode(enc, recvbuf[displs[q] + a:displs[q] + b])
    t.waitall(sends)
    cd.finish()


def _exchange_applies(t, sendbuf, recvbuf, cd) -> bool:
    """Two ranks on two hosts (or a transport without host labels), a
    lossless coder, host buffers."""
    if t.size != 2 or cd.lossy or cd.device or not isinstance(recvbuf, np.ndarray):
        return False
    if sendbuf is not None and not isinstance(sendbuf, np.ndarray):
        return False
    hosts = getattr(t, "hosts", None)
    return hosts is None or len(hosts) != 2 or hosts[0] != hosts[1]


def _eager_elems(cd) -> int:
    """Elements per chunk whose worst-case encoding fits the engine's eager
    limit (``ERDMA_EAGER_LIMIT``), so each chunk leaves at once with no
    rendezvous round trip; the coder's own chunk when that limit is under
    4 KiB.  Every rank computes the same value from the same settings."""
    from erdmampi import config
    limit = max(0, int(config.get("ERDMA_EAGER_LIMIT") or 0))
    size = cd.dtype.itemsize
    ce = limit // size
    while ce * size >= 4096 and cd.max_size(ce) > limit:
        ce -= max(1, -(-(cd.max_size(ce) - limit) // size))
    return ce if ce * size >= 4096 else cd.chunk_elems


def _allreduce_exchange(t, sendbuf, recvbuf, reduce_fn, cd) -> None:
    """Two ranks on two hosts: each encodes its whole vector once, in chunks
    sent as eager messages, and reduces the peer's chunks as they arrive.
    The same bytes cross each link as in the reduce-scatter + all-gather,
    but in one phase: no result waits for a round trip after the data it
    depends on, and no chunk waits for a rendezvous.  Both ranks compute
    ``x0 OP x1`` (rank 0's chunk on the left), so their results are
    bit-identical for any op."""
    me, other = t.rank, 1 - t.rank
    src = recvbuf if sendbuf is None else sendbuf
    ce = _eager_elems(cd)
    stream = _Stream(t, cd, src.size, other, _T_DATA, ce=ce, window=EXCHANGE_WINDOW)
    sends: list = []
    # every chunk is encoded before any result is written (in place: src is recvbuf)
    _send_encoded(t, cd, src, [other], _T_DATA, sends, ce=ce)
    theirs_all = np.empty(min(ce, src.size), recvbuf.dtype)
    for a, b, enc in stream:
        theirs = theirs_all[:b - a]
        cd.decode(enc, theirs)
        out = recvbuf[a:b]
        if me == 0:
            reduce_fn(src[a:b], theirs)      # theirs = x0 OP x1
            out[...] = theirs
        else:
            if sendbuf is not None:
                out[...] = src[a:b]
            reduce_fn(theirs, out)           # out = x0 OP x1
    t.waitall(sends)
    cd.finish()
