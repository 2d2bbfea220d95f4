"""Python-object (lowercase) collectives of ``Comm``, over pickled bytes.
"""

import numpy as np

from ._commrt import (
    coll, _py_op, _sum, _collsched, _CollTransport, _fast_pair_obj, _fast_send_bytes,
    _FastMore, _coll_recv_error, _pair_recv_obj, _pair_send_bytes, _recv_obj_payload,
    _std_loads)

_NOTHING = object()     # pair_obj: no object to send / to copy


class CommObjColl:
    """Python-object (lowercase) collectives of ``Comm``."""

    __slots__ = ()

    # -- Collectives: Python objects ----------------------------------------

    def _objlock(self, key):
        """The communicator's lock for ``key`` (``MPI._comm_lock``), cached
        here: mpi4py serialises each object collective on it."""
        locks = self.__dict__.get("_objlocks")
        if locks is None:
            locks = self._objlocks = {}
        lock = locks.get(key)
        if lock is None:
            from .commctx import _comm_lock
            lock = locks[key] = _comm_lock(self, key)
        return lock

    def _obj_transport(self):
        self._check()
        t = self._transport()
        t._pkl = self._pkl
        return t, self._pkl._encode, self._pkl._decode

    def barrier(self):
        """Barrier (object API)."""
        self.Barrier()

    def _pair_obj_base(self):
        """Two ranks with the C fast path: (fast state, tag base of this call)
        for the messages of a two-rank object collective (the call counted
        as started), else None."""
        f = self._fast or self._fast_obj_state()
        if f is None or len(self._ranks) != 2:
            return None
        self._check()
        base = self._coll_base()
        _collsched.notify_started()
        return f, base

    def _pair_obj(self, key, send, own, recv, root=0):
        """A two-rank object collective in one C call (_engine.fast's
        pair_obj; ``send`` / ``own``: the object for the other rank / to
        copy, or _NOTHING; ``recv``: whether the other rank sends one;
        ``root``: the call's, checked here): its answer, or _NOTHING when
        the general path must run (nothing done: another size, a root not
        0 or 1, inside a nonblocking collective's thread, ...)."""
        if root.__class__ is not int or not 0 <= root <= 1 or _collsched._icoll_running:
            return _NOTHING
        f = self._fast or self._fast_obj_state()
        if f is None:
            return _NOTHING
        locks = self.__dict__.get("_objlocks")
        lock = locks and locks.get(key) or self._objlock(key)
        pkl = self._pkl
        loads = pkl._loads
        with lock:
            r = _fast_pair_obj(f, send, own, recv, pkl._wire,
                               loads if loads is _std_loads else None, _NOTHING)
            if r.__class__ is not _FastMore:
                return r
            if r.value == 1:
                return _NOTHING
            return self._pair_obj_rest(r.value, send, own, recv, pkl)

    def _pair_obj_call(self, send, own, recv, base):
        """pair_obj's message on ``base``, a call's tag base taken already
        (without a lock; the general path's steps where it misses)."""
        pkl = self._pkl
        loads = pkl._loads
        r = _fast_pair_obj(self._fast, send, own, recv, pkl._wire,
                           loads if loads is _std_loads else None, _NOTHING, base)
        if r.__class__ is not _FastMore:
            return r
        r = r.value
        if r == 1:
            sdata = None if send is _NOTHING else pkl._encode(send)
            r = (base, sdata, sdata if own is send else
                 None if own is _NOTHING else pkl._encode(own), None)
        return self._pair_obj_rest(r, send, own, recv, pkl)

    def _pair_obj_rest(self, r, send, own, recv, pkl):
        """Finish what pair_obj left (its More's value ``r``): a send not
        yet made (nothing received either), the receive's payload or
        pending request, the copy."""
        base, sdata, odata, got = r
        f, other = self._fast, None
        if sdata is not None:
            if recv:
                other = self._pair_exchange(f, base, sdata, pkl)
            else:
                _pair_send_bytes(self, f, sdata, 1 - self._rank, 0, base)
        elif got is not None:
            data, err = _recv_obj_payload(got)
            if err:
                _coll_recv_error(err)
            other = pkl._decode(data)
        elif recv:
            other = _pair_recv_obj(self, f, 1 - self._rank, 0, base, pkl)
        if odata is None:
            return other if recv else None
        mine = pkl._decode(odata)
        if not recv:
            return mine
        return [mine, other] if self._rank == 0 else [other, mine]

    def bcast(self, obj, root=0):
        """Broadcast a Python object from ``root``."""
        r = (self._pair_obj("bcast", obj, obj, False, root) if self._rank == root
             else self._pair_obj("bcast", _NOTHING, _NOTHING, True, root))
        if r is not _NOTHING:
            return r
        root = self._root(root)
        pkl = self._pkl
        with self._objlock("bcast"):
            pair = self._pair_obj_base()
            if pair is not None:
                # two ranks: _bcast_bytes's one message, with fewer layers
                f, base = pair
                if self._rank == root:
                    data = pkl._encode(obj)
                    _pair_send_bytes(self, f, data, 1 - root, 0, base)
                    return pkl._decode(data)
                return _pair_recv_obj(self, f, root, 0, base, pkl)
            t, d, l = self._obj_transport()
            return coll.bcast_obj(t, obj, root, d, l)

    def gather(self, sendobj, root=0):
        r = (self._pair_obj("gather", _NOTHING, sendobj, True, root) if self._rank == root
             else self._pair_obj("gather", sendobj, _NOTHING, False, root))
        if r is not _NOTHING:
            return r
        root = self._root(root)
        pkl = self._pkl
        with self._objlock("gather"):
            pair = self._pair_obj_base()
            if pair is not None:
                # two ranks: _gather_bytes's one message
                f, base = pair
                data = pkl._encode(sendobj)
                if self._rank != root:
                    _pair_send_bytes(self, f, data, root, 0, base)
                    return None
                other = _pair_recv_obj(self, f, 1 - root, 0, base, pkl)
                mine = pkl._decode(data)
                return [mine, other] if root == 0 else [other, mine]
            t, d, l = self._obj_transport()
            return coll.gather_obj(t, sendobj, root, d, l)

    def scatter(self, sendobj, root=0):
        root = self._root(root)
        self._check()
        if self._rank == root and sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        if len(self._ranks) == 2:
            if self._rank == root:
                items = sendobj or (None, None)
                r = self._pair_obj("scatter", items[1 - root], items[root], False, root)
            else:
                r = self._pair_obj("scatter", _NOTHING, _NOTHING, True, root)
            if r is not _NOTHING:
                return r
        pkl = self._pkl
        with self._objlock("scatter"):
            pair = self._pair_obj_base()
            if pair is not None:
                # two ranks: _scatter_bytes's one message
                f, base = pair
                if self._rank != root:
                    return _pair_recv_obj(self, f, root, 0, base, pkl)
                enc = pkl._encode
                items = [enc(x) for x in (sendobj or (None, None))]
                _pair_send_bytes(self, f, items[1 - root], 1 - root, 0, base)
                return pkl._decode(items[root])
            t, d, l = self._obj_transport()
            return coll.scatter_obj(t, sendobj, root, d, l)

    def _pair_exchange(self, f, base, data, pkl):
        """A two-rank object collective's message each way (_exchange_bytes's:
        the send waited for after the receive, should it not go at once):
        the peer's object."""
        peer = 1 - self._rank
        t = q = None
        if _fast_send_bytes(f, data, peer, 0, base):
            t = _CollTransport(self, self._ctx + 1, base)
            q = t.isend(np.frombuffer(data, dtype=np.uint8), peer, 0)
        other = _pair_recv_obj(self, f, peer, 0, base, pkl)
        if q is not None:
            t.waitall([q])
        return other

    def allgather(self, sendobj):
        r = self._pair_obj("allgather", sendobj, sendobj, True)
        if r is not _NOTHING:
            return r
        pkl = self._pkl
        with self._objlock("allgather"):
            pair = self._pair_obj_base()
            if pair is not None:
                f, base = pair
                data = pkl._encode(sendobj)
                other = self._pair_exchange(f, base, data, pkl)
                mine = pkl._decode(data)
                return [mine, other] if self._rank == 0 else [other, mine]
            t, d, l = self._obj_transport()
            return coll.allgather_obj(t, sendobj, d, l)

    def alltoall(self, sendobj):
        self._check()
        if sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        if len(self._ranks) == 2:
            me = self._rank
            items = sendobj or (None, None)
            r = self._pair_obj("alltoall", items[1 - me], items[me], True)
            if r is not _NOTHING:
                return r
        pkl = self._pkl
        with self._objlock("alltoall"):
            pair = self._pair_obj_base()
            if pair is not None:
                f, base = pair
                me = self._rank
                enc = pkl._encode
                items = [enc(x) for x in (sendobj or (None, None))]
                other = self._pair_exchange(f, base, items[1 - me], pkl)
                mine = pkl._decode(items[me])
                return [mine, other] if me == 0 else [other, mine]
            t, d, l = self._obj_transport()
            return coll.alltoall_obj(t, sendobj, d, l)

    def reduce(self, sendobj, op=None, root=0):
        root = self._root(root)
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.reduce_obj(t, sendobj, fn, root, d, l)

    def allreduce(self, sendobj, op=None):
        fn = _py_op(_sum(op))
        pair = self._pair_obj_base()
        if pair is not None:
            # two ranks: allreduce_obj's two messages (rank 1's object to rank
            # 0, which applies the op in rank order, then the result back),
            # each in one C call
            base = pair[1]
            if self._rank == 1:
                return self._pair_obj_call(sendobj, _NOTHING, True, base)
            mine, other = self._pair_obj_call(_NOTHING, sendobj, True, base)  # own: a copy
            result = fn(mine, other)
            return self._pair_obj_call(result, result, False, base)
        t, d, l = self._obj_transport()
        return coll.allreduce_obj(t, sendobj, fn, d, l)
