"""Point-to-point communication of ``Comm``: blocking, nonblocking, persistent,
probe and matched probe, over buffers and Python objects.

The rank/tag checks (``_dest``, ``_source``, ``_send_tag``...) live here too:
collectives use them through ``self``.
"""

import operator
import warnings

from .exceptions import ERR_ARG, ERR_REQUEST
from ._commrt import (
    ANY_SOURCE, ANY_TAG, _buffer_pointer, _deferred, _DoneOp, _engine, engine_exception,
    _engine_or_raise, _EngineOp, ERR_RANK, ERR_ROOT, ERR_TAG, error_class, _fast_raise,
    _fast_hits, _fast_irecv, _fast_isend, _fast_recv, _fast_recv_status, _fast_remember,
    _fast_send, _fast_send_bytes, _fast_send_obj, _fast_sendrecv, _fast_sendrecv_replace,
    _fast_remember_packed, _fast_recv_obj,
    _std_loads, _recv_obj_payload, _FastMore, _status_arg,
    Message, MESSAGE_NO_PROC, message_p2p, np, _p2p_buffer, _P2P_CACHE_MAX,
    _pair_request, _plain_array, _plain_counted, Prequest, PROC_NULL, raise_error,
    raise_status_code,
    _reap_deferred, Request, _rt, _send_fields, Status, TAG_UB_VALUE,
    UNDEFINED, _buffers)


_SEQ3 = (list, tuple)
_PACKED_SIDES_MAX = 64      # derived-datatype Sendrecv sides kept per communicator


def _is_proc_null(rank):
    try:
        return int(rank) == PROC_NULL
    except (TypeError, ValueError):
        return False


def _null_msg(buf, peer):
    """What mpi4py parses for a message to/from ``peer``: nothing at all
    (an empty message) when it is PROC_NULL."""
    return [None, 0, "B"] if _is_proc_null(peer) else buf


def _partitions(partitions):
    n = int(partitions)
    if n < 1:
        raise_error(ERR_ARG, f"invalid number of partitions {n}")
    return n


def _check_partition(i, n):
    i = int(i)
    if not 0 <= i < n:
        raise_error(ERR_ARG, f"invalid partition {i} (partitions: {n})")
    return i


_RAW = (bytes, bytearray)    # buffers the C fast path takes as they are (BYTE)


class _PsendOp:
    """A started partitioned send: the send is posted at the last Pready."""

    __slots__ = ("fields", "obj", "_post", "_pending", "_n", "_inner")
    persistent = True

    def __init__(self, post, n):
        self.fields = self.obj = self._inner = None
        self._post = post
        self._n = n
        self._pending = set(range(n))

    def pready(self, indices):
        for i in indices:
            self._pending.discard(_check_partition(i, self._n))
        if not self._pending and self._inner is None:
            self._inner = self._post()

    def parrived(self, i):
        raise_error(ERR_REQUEST, "Parrived on a partitioned send request")

    def test(self):
        if self._inner is None or not self._inner.test():
            return False
        self.fields = self._inner.fields
        return True

    def wait(self):
        if self._inner is None:
            raise_error(ERR_REQUEST, "waiting for a partitioned send whose "
                        "partitions are not all ready (Pready)")
        self._inner.wait()
        self.fields = self._inner.fields

    def cancel(self):
        if self._inner is not None:
            self._inner.cancel()

    def free(self):
        if self._inner is not None:
            self._inner.free()


class _PrecvOp:
    """A started partitioned receive (one message for all partitions)."""

    __slots__ = ("fields", "obj", "_inner", "_n")
    persistent = True

    def __init__(self, inner, n):
        self.fields = self.obj = None
        self._inner = inner
        self._n = n

    def pready(self, indices):
        raise_error(ERR_REQUEST, "Pready on a partitioned receive request")

    def parrived(self, i):
        _check_partition(i, self._n)
        return self.test()

    def test(self):
        if not self._inner.test():
            return False
        self.fields = self._inner.fields
        self.obj = self._inner.obj
        return True

    def wait(self):
        self._inner.wait()
        self.fields = self._inner.fields
        self.obj = self._inner.obj

    def cancel(self):
        self._inner.cancel()

    def free(self):
        self._inner.free()


class CommP2P:
    """Point-to-point methods of ``Comm`` (buffers and Python objects)."""

    __slots__ = ()

    def _peers(self):
        """World ranks that point-to-point ranks index, and how to name them
        in errors (an inter-communicator's are its remote group's)."""
        return self._check(), "communicator size"

    def _dest(self, dest):
        ranks, what = self._peers()
        if self._revoked:
            self._check_revoked()
        dest = int(dest)
        if dest == PROC_NULL:
            return None
        if dest < 0 or dest >= len(ranks):
            raise_error(ERR_RANK, f"invalid rank {dest} ({what} {len(ranks)})")
        return ranks[dest]

    def _source(self, source):
        ranks, what = self._peers()
        if self._revoked:
            self._check_revoked()
        source = int(source)
        if source == PROC_NULL:
            return None
        if source == ANY_SOURCE:
            return _engine.ANY_SOURCE
        if source < 0 or source >= len(ranks):
            raise_error(ERR_RANK, f"invalid source rank {source} ({what} {len(ranks)})")
        return ranks[source]

    @staticmethod
    def _send_tag(tag):
        tag = int(tag)
        if tag < 0 or tag > TAG_UB_VALUE:
            raise_error(ERR_TAG, f"invalid tag {tag} (must be 0..{TAG_UB_VALUE})")
        return tag

    @staticmethod
    def _recv_tag(tag):
        tag = int(tag)
        if tag == ANY_TAG:
            return _engine.ANY_TAG
        if tag < 0 or tag > TAG_UB_VALUE:
            raise_error(ERR_TAG, f"invalid tag {tag} (must be 0..{TAG_UB_VALUE} or ANY_TAG)")
        return tag

    def _root(self, root):
        ranks = self._check()
        root = int(root)
        if root < 0 or root >= len(ranks):
            raise_error(ERR_ROOT, f"invalid root {root} (communicator size {len(ranks)})")
        return root

    def _comm_rank(self, world):
        if world < 0:
            return world
        return self._group._index.get(world, UNDEFINED)

    def _finish_fields(self, raw, msg=None):
        err = error_class(raw.error)
        if msg is not None and not err and not raw.cancelled:
            msg.finish()
        return (self._comm_rank(raw.source), raw.tag, err, raw.nbytes, raw.cancelled)

    # Point-to-point: engine operations (return request operations)

    def _isend_op(self, buf, dest, tag, sync=False, buffered=False):
        return self._post_isend(self._isend_args(buf, dest, tag), sync, buffered)

    def _isend_args(self, buf, dest, tag):
        """A send's checked arguments: (address, nbytes, keep, world dest
        or None for PROC_NULL, tag)."""
        addr, nbytes, keep, _ = _p2p_buffer(_null_msg(buf, dest), True)
        return addr, nbytes, keep, self._dest(dest), self._send_tag(tag)

    def _post_isend(self, args, sync=False, buffered=False):
        """Post the send of _isend_args' ``args``: its operation."""
        addr, nbytes, keep, wdest, tag = args
        if wdest is None:
            return _DoneOp()
        eng = _engine_or_raise()
        try:
            ereq = eng.isend(addr, nbytes, wdest, tag, self._ctx, sync=sync, keep=keep,
                             buffered=buffered)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, _send_fields, pure=True)

    def _irecv_op(self, buf, source, tag):
        addr, nbytes, keep, msg = _p2p_buffer(_null_msg(buf, source), False)
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            return _DoneOp()
        eng = _engine_or_raise()
        try:
            ereq = eng.irecv(addr, nbytes, wsrc, tag, self._ctx, keep=keep)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, lambda raw: self._finish_fields(raw, msg) + (None,),
                         pure=msg is None or not msg.device)

    def _send(self, buf, dest, tag, sync, buffered=False):
        """Blocking send without a request (the engine's lean path)."""
        addr, nbytes, keep, _ = _p2p_buffer(_null_msg(buf, dest), True)
        wdest = self._dest(dest)
        tag = self._send_tag(tag)
        if wdest is None:
            return
        eng = _engine_or_raise()
        try:
            st = eng.send(addr, nbytes, wdest, tag, self._ctx, sync, keep, buffered)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if st.error:
            raise_status_code(st.error)

    def _recv(self, buf, source, tag, status):
        """Blocking receive without a request (the engine's lean path)."""
        addr, nbytes, keep, msg = _p2p_buffer(_null_msg(buf, source), False)
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            Request._new(_DoneOp()).Wait(status)
            return
        eng = _engine_or_raise()
        try:
            st = eng.recv(addr, nbytes, wsrc, tag, self._ctx, keep)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        if status is not None or st.error or msg is not None:
            # as Request.Wait: finish, fill the status (MPI_ERROR untouched), raise
            fields = self._finish_fields(st, msg)
            if status is not None:
                status._fill(*fields[:2], None, fields[3], bool(fields[4]))
            if fields[2]:
                raise_status_code(st.error)

    def _isend_obj_op(self, obj, dest, tag, sync=False, data=None, buffered=False):
        wdest = self._dest(dest)
        tag = self._send_tag(tag)
        if wdest is None:
            return _DoneOp()
        if data is None:
            data = self._pkl._encode(obj)
        arr = np.frombuffer(data, dtype=np.uint8)
        eng = _engine_or_raise()
        try:
            ereq = eng.isend(arr.ctypes.data if arr.size else 0, arr.nbytes, wdest, tag,
                             self._ctx, sync=sync, keep=(data, arr), buffered=buffered)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, lambda raw: (ANY_SOURCE, ANY_TAG, error_class(raw.error), 0,
                                            raw.cancelled, None))

    def _obj_finish(self, ereq):
        def finish(raw):
            fields = self._finish_fields(raw)
            obj = None
            if not fields[2] and not raw.cancelled:
                obj = self._pkl._decode(ereq.take())
            return fields + (obj,)
        return finish

    def _irecv_obj_op(self, source, tag, buf=None):
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            return _DoneOp()
        eng = _engine_or_raise()
        if buf is not None:
            # mpi4py: a given buffer (or a byte count: a buffer of that size)
            # bounds the pickled message (ERR_TRUNCATE if larger)
            if not _is_buffer(buf):
                buf = bytearray(operator.index(buf))
            arr = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
            try:
                ereq = eng.irecv(arr.ctypes.data if arr.size else 0, arr.nbytes, wsrc, tag,
                                 self._ctx, keep=arr)
            except _engine.EngineError as e:
                raise engine_exception(e) from None

            def finish(raw):
                fields = self._finish_fields(raw)
                obj = None
                if not fields[2] and not raw.cancelled:
                    obj = self._pkl._decode(arr[:raw.nbytes].tobytes())
                return fields + (obj,)
            return _EngineOp(ereq, finish)
        try:
            ereq = eng.irecv_alloc(wsrc, tag, self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, self._obj_finish(ereq))

    def _mrecv_buf(self, emsg, buf):
        msg = message_p2p(buf, False)
        eng = _engine_or_raise()
        try:
            ereq = eng.imrecv(emsg, msg.addr, msg.nbytes, keep=msg)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, lambda raw: self._finish_fields(raw, msg) + (None,))

    def _mrecv_obj(self, emsg):
        eng = _engine_or_raise()
        try:
            ereq = eng.imrecv_alloc(emsg)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return _EngineOp(ereq, self._obj_finish(ereq))

    def _probe_raw(self, source, tag, blocking, matched=False):
        """The engine's (m)probe answer: RawStatus, ``(EngineMessage, RawStatus)``
        when ``matched``, None (nothing yet) or ``"noproc"`` (PROC_NULL)."""
        wsrc = self._source(source)
        tag = self._recv_tag(tag)
        if wsrc is None:
            return "noproc"
        eng = _engine_or_raise()
        if matched:
            fn = eng.mprobe if blocking else eng.improbe
        else:
            fn = eng.probe if blocking else eng.iprobe
        try:
            return fn(wsrc, tag, self._ctx)
        except _engine.EngineError as e:
            raise engine_exception(e) from None

    def _fill_probe(self, status, raw):
        if status is None:
            return
        if raw == "noproc":
            status._fill(PROC_NULL, ANY_TAG, 0, 0, False)
        else:
            status._fill(self._comm_rank(raw.source), raw.tag, 0, raw.nbytes, False)

    # -- Point-to-point: blocking -------------------------------------------

    def Send(self, buf, dest, tag=0):
        """Blocking send."""
        # fast path: the buffer spec remembered last (see _p2p_plain), a valid
        # rank and tag: one C call (_engine.fast); the rest: _send_more
        if _deferred:
            _reap_deferred()
        r = _fast_send(self._fast, buf, dest, tag)
        if r:
            self._send_more(r, buf, dest, tag)

    def _send_more(self, r, buf, dest, tag):
        """Send after the fast call answered ``r`` (see _engine.fast)."""
        if r != 1:
            return _fast_raise(r, buf, "send")
        if type(buf) in _RAW and self._fast is None and self._fast_obj_state() is not None:
            return self.Send(buf, dest, tag)    # (bytes go in one C call once a state exists)
        # a plain host array (alone or with a predefined datatype, see
        # _p2p_plain), a valid rank and tag; everything else goes through
        # _send, which parses and checks
        ranks = self._ranks
        eng = _rt.engine
        if (type(dest) is int and type(tag) is int and ranks is not None and eng is not None
                and 0 <= dest < len(ranks) and 0 <= tag <= TAG_UB_VALUE and not self._revoked):
            ptr, n, arr = self._p2p_plain(buf, True)
            if arr is not None:
                try:
                    err = eng.send_plain(ptr, n, ranks[dest], tag, self._ctx, arr)
                except _engine.EngineError as e:
                    raise engine_exception(e) from None
                if err:
                    raise_status_code(err)
                return
        self._send(buf, dest, tag, False)

    def Bsend(self, buf, dest, tag=0):
        """Buffered send: completes without the receiver (the engine buffers)."""
        self._send(buf, dest, tag, False, buffered=True)

    def Rsend(self, buf, dest, tag=0):
        """Ready send (same as Send)."""
        self.Send(buf, dest, tag)

    def Ssend(self, buf, dest, tag=0):
        """Synchronous send: returns once the receive has matched."""
        self._send(buf, dest, tag, True)

    def Recv(self, buf, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Blocking receive."""
        # fast path as in Send
        if status is None:
            r = _fast_recv(self._fast, buf, source, tag)
            if r:
                self._recv_fast_more(r, buf, source, tag)
            return
        _status_arg(status)
        r = _fast_recv_status(self._fast, buf, source, tag)
        if r != 1:
            return self._fast_status(r, buf, status)
        self._recv_more(buf, source, tag, status)

    def _recv_fast_more(self, r, buf, source, tag, status=None):
        """Recv after the fast call answered ``r`` != 0 (see _engine.fast):
        with a ``status``, recv_status's answers."""
        if r == 1:
            _status_arg(status)
            self._recv_more(buf, source, tag, status)
        elif status is None:
            _fast_raise(r, buf, "recv")
        else:
            self._fast_status(r, buf, status)

    def _fast_status(self, r, keep, status):
        """Fill ``status`` from a fast receive's answer (as Request.Wait:
        MPI_ERROR untouched), then raise its error, if any."""
        if len(r) == 2:
            try:
                st = _engine.fast_rest(r, keep, "recv")
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            r = (st.error, st.source, st.tag, st.nbytes)
        status._fill(self._comm_rank(r[1]), r[2], None, r[3])
        if r[0]:
            raise_status_code(r[0])

    def _recv_more(self, buf, source, tag, status):
        """Recv after a fast-call miss: a plain host array as in _send_more
        (remembered, so that the next call takes the one-call path; with a
        status this one still goes through _recv), the rest through _recv."""
        if type(buf) is bytearray and self._fast is None and self._fast_obj_state() is not None:
            return self.Recv(buf, source, tag, status)     # (as _send_more's bytes)
        ranks = self._ranks
        eng = _rt.engine
        if (type(source) is int and type(tag) is int and ranks is not None and eng is not None
                and (0 <= tag <= TAG_UB_VALUE or tag == ANY_TAG) and not self._revoked):
            if 0 <= source < len(ranks):
                wsrc = ranks[source]
            elif source == ANY_SOURCE:
                wsrc = _engine.ANY_SOURCE
            else:
                wsrc = None
            if wsrc is not None:
                ptr, n, arr = self._p2p_plain(buf, False)
                if arr is not None and status is None:
                    etag = _engine.ANY_TAG if tag == ANY_TAG else tag
                    try:
                        err = eng.recv_plain(ptr, n, wsrc, etag, self._ctx, arr)
                    except _engine.EngineError as e:
                        raise engine_exception(e) from None
                    if err:
                        raise_status_code(err)
                    return
        self._recv(buf, source, tag, status)

    def _p2p_plain(self, buf, readonly):
        """``(pointer, nbytes, array)`` of a spec that is one whole plain host
        array (``numpy.ndarray`` alone, or with a predefined datatype without
        gaps, and a count that covers the array if one is given), else
        ``(None, 0, None)``.  It is remembered per direction by
        the communicator's fast-path state, so that the next Send/Recv of
        the same spec is one C call (see _engine.fast): a small one by the
        identity of its array and datatype, and also by the array's layout
        (type, dtype, shape, strides: a program may pass a new array every
        call); a larger one, which the state must not keep alive, by the
        layout alone."""
        arr = _plain_array(buf, readonly)
        count = 0
        if arr is None:
            t = type(buf)
            arr = _plain_counted(buf, readonly) if t is list or t is tuple else None
            if arr is None:
                return None, 0, None
            count, dt = buf[1], buf[2]
        else:
            dt = None if arr is buf else buf[1]
            if dt is not None:
                count = arr.nbytes // _buffers.plain_size(dt)
        ptr = _buffer_pointer(arr)
        n = arr.nbytes
        if _engine.fast is not None:
            recv = not readonly
            weak = n > _P2P_CACHE_MAX
            flags = arr.flags.num
            f = self._fast
            if f is None or not _fast_remember(f, recv, buf, arr, dt, flags, weak, count):
                f = self._fast_state()
                if f is None or not _fast_remember(f, recv, buf, arr, dt, flags, weak, count):
                    return ptr, n, arr
                self._fast = f
            if not weak:
                _fast_remember(f, recv, buf, arr, dt, flags, True, count)
        return ptr, n, arr

    def Sendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        """Send and receive."""
        # fast path as in Send: both specs remembered, ranks on both sides
        if status is not None:
            _status_arg(status)
        if _deferred:
            _reap_deferred()
        r = _fast_sendrecv(self._fast, sendbuf, dest, sendtag, recvbuf, source, recvtag)
        if r != 1:
            self._p2p_misses = 0
            self._sendrecv_fast_done(r, sendbuf, recvbuf, status)
            return
        self._sendrecv_more(r, sendbuf, dest, sendtag, recvbuf, source, recvtag, status)

    def _sendrecv_more(self, r, sendbuf, dest, sendtag, recvbuf, source, recvtag, status):
        """Sendrecv after the fast call answered ``r`` (1: a miss)."""
        if r != 1:
            self._sendrecv_fast_done(r, sendbuf, recvbuf, status)
            return
        _status_arg(status)
        if (type(sendbuf) in _SEQ3 and len(sendbuf) == 3
                or type(recvbuf) in _SEQ3 and len(recvbuf) == 3):
            if self._packed_sendrecv(sendbuf, dest, sendtag, recvbuf, source, recvtag,
                                     status):
                return
        self._sendrecv_general(sendbuf, dest, sendtag, recvbuf, source, recvtag, status,
                               sendbuf)

    def _sendrecv_general(self, sendbuf, dest, sendtag, recvbuf, source, recvtag, status,
                          learn):
        """Sendrecv through the parser, then learn ``learn`` (the send side
        to remember) and ``recvbuf`` for the one-call path."""
        rop, sop = self._sendrecv_ops(sendbuf, dest, sendtag, recvbuf, source, recvtag)
        rreq = Request._new(rop)
        sreq = Request._new(sop)
        rreq.Wait(status)
        sreq.Wait()
        self._p2p_learn(learn, True)
        self._p2p_learn(recvbuf, False)

    def _packed_side(self, buf, readonly):
        """A ``[array, count, derived datatype]`` side of a Sendrecv (as
        buffers.packed_spec takes it) kept with its packing plan and a
        temporary of its packed bytes: ``(array, plan, temporary)``; the spec
        itself when it is another kind; None where the normal path must
        judge it."""
        if type(buf) not in _SEQ3 or len(buf) != 3:
            return buf
        arr, count, dt = buf
        cache = self.__dict__.get("_pkcache")
        if cache is None:
            cache = self._pkcache = {}
        key = (id(arr), count, id(dt), readonly)
        e = cache.get(key)
        if (e is None or e[0] is not arr or e[1] is not dt or e[2] is not dt._r
                or e[3] != arr.nbytes):
            if type(arr) is not np.ndarray or type(count) is not int or count <= 0:
                return None
            ent = _buffers._packed_type(dt)
            if ent is None:
                return None
            _, rec, layout, _, _, ext, tlb, tub, isize = ent
            lo = tlb + min(0, (count - 1) * ext)
            hi = tub + max(0, (count - 1) * ext)
            if count * ext > arr.nbytes or lo < 0 or hi > arr.nbytes:
                return None
            p = layout.plan(count, ext)
            if p.total != count * isize:
                return None
            if len(cache) >= _PACKED_SIDES_MAX:
                cache.clear()
            e = cache[key] = (arr, dt, rec, arr.nbytes, p, np.empty(p.total, np.uint8))
        f = arr.flags
        if not f.c_contiguous or not (readonly or f.writeable):
            return None
        fs = self._fast or self._fast_obj_state()
        if fs is not None and _fast_remember_packed is not None:
            # the next Sendrecv with this side packs, moves and unpacks in C
            p = e[4]
            _fast_remember_packed(fs, not readonly, arr, count, dt, e[2], f.num, e, p.n,
                                  p.step, _engine.address(p.off) if p.total else 0,
                                  _engine.address(p.ln) if p.total else 0, p.nruns, p.total)
        return e

    def _packed_sendrecv(self, sendbuf, dest, sendtag, recvbuf, source, recvtag, status):
        """Sendrecv with derived-datatype sides (a halo exchange): each packed
        into a temporary kept per spec, the temporaries moved as the fast
        path's plain Sendrecv; True when done."""
        se = self._packed_side(sendbuf, True)
        re_ = self._packed_side(recvbuf, False)
        if se is None or re_ is None or _engine.fast is None:
            return False
        sb = rb = None
        if se is not sendbuf:       # a cache entry, not the spec itself
            arr, p, sb = se[0], se[4], se[5]
            if p.total:
                _engine.pack_runs(_buffer_pointer(sb), _buffer_pointer(arr), p.n, p.step,
                                  p.off, p.ln, p.nruns)
        if re_ is not recvbuf:
            rb = re_[5]
        stmp = sendbuf if sb is None else sb
        rtmp = recvbuf if rb is None else rb
        r = _fast_sendrecv(self._fast, stmp, dest, sendtag, rtmp, source, recvtag)
        if r == 1:
            self._p2p_plain(stmp, True)
            self._p2p_plain(rtmp, False)
            r = _fast_sendrecv(self._fast, stmp, dest, sendtag, rtmp, source, recvtag)
        if r != 1:
            r = self._sendrecv_fast_done(r, stmp, rtmp, status)
            got = r[3]
        else:
            st = status if status is not None or rb is None else Status()
            rop, sop = self._sendrecv_ops(stmp, dest, sendtag, rtmp, source, recvtag)
            rreq = Request._new(rop)
            sreq = Request._new(sop)
            rreq.Wait(st)
            sreq.Wait()
            got = st._nbytes if rb is not None else 0
        if rb is not None:
            _unpack_side(re_, got)
        return True

    def _p2p_learn(self, buf, readonly):
        """After a fast-path miss of Isend, Irecv or Sendrecv: remember
        ``buf`` (see _p2p_plain) so that the next call with it is one C call,
        unless every call missed lately (a program cycling through more
        buffers than the state keeps, where remembering only costs): then
        one in 64."""
        m = self._p2p_misses + 1
        h = _fast_hits(self._fast)
        if h != self._p2p_hits:     # a Sendrecv ran in C since (the C method)
            self._p2p_hits = h
            m = 1
        self._p2p_misses = m
        if m <= 16 or not m & 63:
            self._p2p_plain(buf, readonly)

    def _sendrecv_fast_done(self, r, sendbuf, recvbuf, status):
        """Finish a fast Sendrecv that answered ``r`` (see _engine.fast):
        the receive's status and error first, then the send's; the
        receive's (error, world source, tag, nbytes, send error)."""
        if len(r) == 3:
            try:
                st, serr = _engine.fast_rest_sendrecv(r, recvbuf, sendbuf)
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            r = (st.error, st.source, st.tag, st.nbytes, serr)
        elif len(r) == 4:
            # packed sides still pending: their entries keep the temporaries
            # (a receive side straight into its array: the array)
            rent, sent = r[3]
            try:
                st, serr = _engine.fast_rest_sendrecv(
                    r[:3], recvbuf if rent is None else rent, sendbuf if sent is None else sent)
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            r = (st.error, st.source, st.tag, st.nbytes, serr)
            if type(rent) is tuple and not r[0] and r[3]:   # else received in place
                _unpack_side(rent, r[3])
        if status is not None:
            status._fill(self._comm_rank(r[1]), r[2], None, r[3])
        if r[0]:
            raise_status_code(r[0])
        if r[4]:
            raise_status_code(r[4])
        return r

    def _sendrecv_ops(self, sendbuf, dest, sendtag, recvbuf, source, recvtag):
        """Check both sides, then post the receive, then the send (as MPICH,
        nothing moves when an argument is wrong: a receive posted and taken
        back could match a message meanwhile); a send the engine refuses
        takes the receive back."""
        sargs = self._isend_args(sendbuf, dest, sendtag)
        rop = self._irecv_op(recvbuf, source, recvtag)
        try:
            sop = self._post_isend(sargs)
        except BaseException:
            rop.cancel()
            try:
                rop.wait()
            finally:
                rop.free()
            raise
        return rop, sop

    def Sendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG,
                         status=None):
        """Send and receive in one buffer."""
        # fast path: the spec remembered both ways and a message that goes
        # into a local peer's ring at once (its bytes are copied out before
        # the receive lands): one C call
        if status is not None:
            _status_arg(status)
        if _deferred:
            _reap_deferred()
        r = _fast_sendrecv_replace(self._fast, buf, dest, sendtag, source, recvtag)
        if r != 1:
            self._p2p_misses = 0
        self._sendrecv_replace_more(r, buf, dest, sendtag, source, recvtag, status)

    def _sendrecv_replace_more(self, r, buf, dest, sendtag, source, recvtag, status):
        """Sendrecv_replace after the fast call answered ``r`` (1: nothing
        done)."""
        if r != 1:
            self._sendrecv_fast_done(r, buf, buf, status)
            return
        _status_arg(status)
        arr = _plain_array(buf, False)
        if arr is None and type(buf) in _SEQ3:
            arr = _plain_counted(buf, False)
        if arr is not None:
            # a whole plain array: a Sendrecv from a copy of it, the copy not
            # remembered (a new one every call); ``buf`` both ways
            tmp = arr.copy()
            self._sendrecv_general(tmp if arr is buf else [tmp, buf[-1]], dest, sendtag, buf,
                                   source, recvtag, status, buf)
            return
        self.Isendrecv_replace(buf, dest, sendtag, source, recvtag).Wait(status)

    # -- Point-to-point: nonblocking ----------------------------------------

    def Isend(self, buf, dest, tag=0):
        """Nonblocking send."""
        # fast path as in Send: a remembered spec, a valid rank and tag
        if _deferred:
            _reap_deferred()
        r = _fast_isend(self._fast, buf, dest, tag)
        if type(r) is not int:  # its operation: posted, or complete (in a local peer's ring)
            self._p2p_misses = 0
            return Request._new(r)
        return self._isend_more(r, buf, dest, tag)

    def _isend_more(self, r, buf, dest, tag):
        """Isend after the fast call answered ``r`` (1: a miss, < 0: an
        engine error)."""
        if r < 0:
            raise engine_exception(_engine.EngineError(r, "send"))
        req = Request._new(self._isend_op(buf, dest, tag))
        self._p2p_learn(buf, True)
        return req

    def Ibsend(self, buf, dest, tag=0):
        """Nonblocking buffered send: completes without the receiver."""
        return Request._new(self._isend_op(buf, dest, tag, buffered=True))

    Irsend = Isend

    def Issend(self, buf, dest, tag=0):
        return Request._new(self._isend_op(buf, dest, tag, sync=True))

    def Irecv(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        """Nonblocking receive."""
        # fast path as in Isend
        f = self._fast
        if f is not None:
            r = _fast_irecv(f, buf, source, tag, self._group._index)
            if type(r) is not int:
                self._p2p_misses = 0
                return Request._new(r)
            return self._irecv_more(r, buf, source, tag)
        return self._irecv_more(1, buf, source, tag)

    def _irecv_more(self, r, buf, source, tag):
        """Irecv after the fast call answered ``r`` (1: a miss, < 0: an
        engine error)."""
        if r < 0:
            raise engine_exception(_engine.EngineError(r, "recv"))
        req = Request._new(self._irecv_op(buf, source, tag))
        self._p2p_learn(buf, False)
        return req


    def Isendrecv(self, sendbuf, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                  recvtag=ANY_TAG):
        rop, sop = self._sendrecv_ops(sendbuf, dest, sendtag, recvbuf, source, recvtag)
        return _pair_request(Request._new(rop), Request._new(sop))

    def Isendrecv_replace(self, buf, dest, sendtag=0, source=ANY_SOURCE, recvtag=ANY_TAG):
        # as mpi4py, the buffer is parsed for the peer that is not PROC_NULL
        peer = source if not _is_proc_null(source) else dest
        msg = message_p2p(_null_msg(buf, peer), False)
        if msg.array is None:
            sendbuf = None
        else:
            # the send goes out of a copy: the receive overwrites ``buf``
            sendbuf = [np.array(msg.array, copy=True).reshape(-1).view(np.uint8), "B"]
        rop, sop = self._sendrecv_ops(sendbuf, dest, sendtag,
                                      buf if msg.array is not None else None, source, recvtag)
        return _pair_request(Request._new(rop), Request._new(sop))

    # -- Persistent ---------------------------------------------------------

    def Send_init(self, buf, dest, tag=0):
        self._dest(dest)
        self._send_tag(tag)
        return Prequest._persistent(lambda: self._isend_op(buf, dest, tag))

    def Bsend_init(self, buf, dest, tag=0):
        """Persistent buffered send."""
        self._dest(dest)
        self._send_tag(tag)
        return Prequest._persistent(lambda: self._isend_op(buf, dest, tag, buffered=True))

    Rsend_init = Send_init

    def Ssend_init(self, buf, dest, tag=0):
        self._dest(dest)
        self._send_tag(tag)
        return Prequest._persistent(lambda: self._isend_op(buf, dest, tag, sync=True))

    def Recv_init(self, buf, source=ANY_SOURCE, tag=ANY_TAG):
        self._source(source)
        self._recv_tag(tag)
        return Prequest._persistent(lambda: self._irecv_op(buf, source, tag))

    # -- Partitioned (MPI-4) -------------------------------------------------
    # The whole buffer travels as one message once every partition is ready;
    # a receive's partitions all arrive together (MPI allows both).

    def Psend_init(self, buf, partitions, dest, tag=0, info=None):
        parts = _partitions(partitions)
        self._dest(dest)
        self._send_tag(tag)
        return Prequest._persistent(
            lambda: _PsendOp(lambda: self._isend_op(buf, dest, tag), parts))

    def Precv_init(self, buf, partitions, source=ANY_SOURCE, tag=ANY_TAG, info=None):
        parts = _partitions(partitions)
        self._source(source)
        self._recv_tag(tag)
        return Prequest._persistent(
            lambda: _PrecvOp(self._irecv_op(buf, source, tag), parts))

    # -- Probes -------------------------------------------------------------

    def Probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Block until a matching message is available."""
        raw = self._probe_raw(source, tag, True)
        self._fill_probe(status, raw)
        return True

    def Iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Whether a matching message is available."""
        raw = self._probe_raw(source, tag, False)
        if raw is None:
            return False
        self._fill_probe(status, raw)
        return True

    def Mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Matched probe: returns a Message removed from the queue."""
        return self._probed_message(self._probe_raw(source, tag, True, True), status)

    def Improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Nonblocking matched probe: a Message or None."""
        got = self._probe_raw(source, tag, False, True)
        if got is None:
            return None
        return self._probed_message(got, status)

    def _probed_message(self, got, status):
        if got == "noproc":
            self._fill_probe(status, got)
            # a fresh object over the NO_PROC handle: receiving it makes it null
            return Message(MESSAGE_NO_PROC)
        emsg, raw = got
        self._fill_probe(status, raw)
        return Message._new(self, emsg)

    # -- Python objects: point-to-point -------------------------------------

    def send(self, obj, dest, tag=0):
        """Send a Python object."""
        # pickled and (small, to a rank of this host) sent in one C call
        data = _fast_send_obj(self._fast or self._fast_obj_state(), obj, dest, tag,
                              self._pkl._wire)
        if data:
            self._send_obj_more(data, obj, dest, tag)

    def _send_obj_more(self, data, obj, dest, tag):
        """send after send_obj answered ``data``: 1 (a miss: Python
        pickles) or the pickle it made but did not send."""
        if data.__class__ is int:
            data = self._pkl._encode(obj)
            if not _fast_send_bytes(self._fast, data, dest, tag):
                return
        Request._new(self._isend_obj_op(obj, dest, tag, data=data)).wait()

    def bsend(self, obj, dest, tag=0):
        """Buffered send of a Python object: completes without the receiver."""
        Request._new(self._isend_obj_op(obj, dest, tag, buffered=True)).wait()

    def ssend(self, obj, dest, tag=0):
        """Synchronous send of a Python object."""
        Request._new(self._isend_obj_op(obj, dest, tag, sync=True)).wait()

    def recv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        """Receive a Python object; ``buf`` (optional) bounds its pickled size."""
        if buf is None and status is None:
            # receive, copy out and (an in-band pickle) load in one C call
            loads = self._pkl._loads
            r = _fast_recv_obj(self._fast or self._fast_obj_state(), source, tag,
                               loads if loads is _std_loads else None)
            if r.__class__ is not _FastMore:
                return r
            return self._recv_obj_rest(r.value, source, tag)
        if buf is not None:
            warnings.warn("the 'buf' argument is deprecated", UserWarning, stacklevel=2)
        return _wait_blocking(self._irecv_obj_op(source, tag, buf), status)

    def _recv_obj_more(self, more, buf, source, tag, status):
        """recv (no ``buf``, no ``status``) after recv_obj answered a More."""
        return self._recv_obj_rest(more.value, source, tag)

    def _recv_obj_rest(self, r, source, tag):
        """A recv whose fast recv_obj answered More(r): finish it."""
        if r == 1:
            return _wait_blocking(self._irecv_obj_op(source, tag, None))
        data, err = _recv_obj_payload(r)
        if err:
            raise_status_code(err)
        return self._pkl._decode(data)

    def _fast_obj_state(self):
        """The communicator's _engine.fast state, made now if it has none yet."""
        f = self._fast = self._fast_state()
        return f

    def isend(self, obj, dest, tag=0):
        return Request._new(self._isend_obj_op(obj, dest, tag))

    def ibsend(self, obj, dest, tag=0):
        """Nonblocking buffered send of a Python object."""
        return Request._new(self._isend_obj_op(obj, dest, tag, buffered=True))

    def issend(self, obj, dest, tag=0):
        return Request._new(self._isend_obj_op(obj, dest, tag, sync=True))

    def irecv(self, buf=None, source=ANY_SOURCE, tag=ANY_TAG):
        """Nonblocking receive of a Python object; ``wait()`` returns it."""
        return Request._new(self._irecv_obj_op(source, tag, buf))

    def sendrecv(self, sendobj, dest, sendtag=0, recvbuf=None, source=ANY_SOURCE,
                 recvtag=ANY_TAG, status=None):
        """Send and receive Python objects."""
        if recvbuf is None and status is None:
            # a small object to a rank of this host goes at once: then the fast recv
            data = _fast_send_obj(self._fast or self._fast_obj_state(), sendobj, dest, sendtag,
                                  self._pkl._wire)
            if data.__class__ is int and not data:  # sent: the receive
                return self.recv(None, source, recvtag)
            return self._sendrecv_obj_unsent(data, sendobj, dest, sendtag, source, recvtag)
        # every argument checked (and the object pickled) before anything is
        # posted, so that a failing call leaves no receive behind
        self._source(source)
        self._recv_tag(recvtag)
        sreq = Request._new(self._isend_obj_op(sendobj, dest, sendtag))
        rop = self._irecv_obj_op(source, recvtag)
        obj = _wait_blocking(rop, status)
        sreq.wait()
        return obj

    def _sendrecv_obj_more(self, more, sendobj, dest, sendtag, recvbuf, source, recvtag,
                           status):
        """sendrecv (no ``recvbuf``, no ``status``) after sendrecv_obj
        answered a More: its send not done (a 1-tuple), or the receive's."""
        v = more.value
        if type(v) is tuple and len(v) == 1:
            return self._sendrecv_obj_unsent(v[0], sendobj, dest, sendtag, source, recvtag)
        return self._recv_obj_rest(v, source, recvtag)

    def _sendrecv_obj_unsent(self, data, sendobj, dest, sendtag, source, recvtag):
        """sendrecv whose fast send did not send: ``data`` the pickle, or 1
        (not pickled there)."""
        if data.__class__ is int:                   # a miss: pickled here
            data = self._pkl._encode(sendobj)
            if not _fast_send_bytes(self._fast, data, dest, sendtag):
                return self.recv(None, source, recvtag)     # sent
        sreq = Request._new(self._isend_obj_op(sendobj, dest, sendtag, data=data))
        obj = _wait_blocking(self._irecv_obj_op(source, recvtag))
        sreq.wait()
        return obj

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Probe(source, tag, status)

    def iprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Iprobe(source, tag, status)

    def mprobe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Mprobe(source, tag, status)

    def improbe(self, source=ANY_SOURCE, tag=ANY_TAG, status=None):
        return self.Improbe(source, tag, status)


def _unpack_side(ent, got):
    """Unpack the ``got`` bytes received into a packed side's temporary
    (``ent``, see Comm._packed_side) into its array; a shorter message
    leaves the rest of the array as it was."""
    arr, p, rb = ent[0], ent[4], ent[5]
    if 0 < got < p.total:
        head = rb[:got].copy()
        _engine.pack_runs(_buffer_pointer(rb), _buffer_pointer(arr), p.n, p.step,
                          p.off, p.ln, p.nruns)
        rb[:got] = head
    if got:
        _engine.unpack_runs(_engine.writable_pointer(arr), _buffer_pointer(rb), p.n,
                            p.step, p.off, p.ln, p.nruns)


def _is_buffer(obj):
    try:
        memoryview(obj)
    except TypeError:
        return False
    return True


def _wait_blocking(op, status=None):
    """``Request(op).wait(status)`` for a blocking receive: from ANY_SOURCE,
    when a member of the communicator has failed (unacknowledged), it is
    withdrawn and raises ERR_PROC_FAILED rather than staying pending."""
    ereq = getattr(op, "ereq", None)
    if ereq is not None:
        try:
            ereq.wait_blocking()
        except _engine.EngineError as e:
            raise engine_exception(e) from None
    return Request._new(op).wait(status)
