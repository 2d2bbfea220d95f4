"""Buffer collectives of ``Comm``: blocking and nonblocking.

Each ``_c_*`` method parses and checks its arguments in the caller's thread
and returns a closure that runs the algorithm (now, or in a thread for the
nonblocking variant: ``_icoll``).
"""

from . import _p2pcoll as _px
from . import buffers
from .collectives import wan as _wan_algos
from ._commrt import (
    _blocks, _buffer_pointer, _c_dtype, _C_OPS, _check_op, coll, _COLL_CACHE_MAX,
    _COLL_ENV, _collsched, _cz, _czcoll, _dev, _dev_addr, _dev_dtype_datatype, _dev_msg,
    _engine, engine_exception, _environ_data, ERR_BUFFER, ERR_TRUNCATE, _extent,
    _fast_allreduce,
    _fast_allgather, _fast_alltoall, _fast_barrier, _fast_bcast, _fast_coll_raise,
    _fast_reduce_scatter, _fast_remember_allgather, _fast_remember_allreduce,
    _fast_remember_alltoall, _fast_remember_barrier, _fast_remember_bcast,
    _fast_remember_reduce_scatter, _fast_remember_rooted, _fast_rooted, _icoll, IN_PLACE,
    is_in_place,
    _LOGICAL_OPS, message_cco, _message_vector_bytes, _mismatch, _mult, _ndarray, np,
    Op, _op_arg, _plain_array, Prequest, _plain_with_type, raise_error, _reduce_fn, _rt,
    _run_allgatherv, _run_blocks, _run_compressed, _run_gatherv, _run_scatterv,
    _same_spec, _sched_algos, _SKIP, _SMALL_COLL_MAX, _spec_is, _spec_np_dtype, _SUM,
    _u8, _u8_of, _UNUSED)


def _check_cro(smsg, rmsg):
    """mpi4py's checks of a reduction's send and receive messages, and
    MPICH's that they are not the same buffer."""
    if smsg.datatype != rmsg.datatype:
        raise buffers.type_mismatch(smsg, rmsg)
    if smsg.count != rmsg.count:
        raise _mismatch(smsg, rmsg)
    _check_alias(smsg, rmsg)


def _check_alias(smsg, rmsg, same=True, soff=0, roff=0):
    """MPICH's MPIR_ERRTEST_ALIAS_COLL: a collective whose send buffer (from
    byte ``soff``) starts where its receive buffer (from byte ``roff``: this
    rank's block of an Allgather or a root's Gather) does, not MPI.IN_PLACE,
    fails with ERR_BUFFER, where ``same`` (its counts and datatypes agree)
    and a byte is sent; buffers that overlap from other starts are not
    checked, as there."""
    if same and smsg is not None and rmsg is not None and smsg.nbytes and \
            smsg.addr + soff == rmsg.addr + roff:
        raise_error(ERR_BUFFER, "Buffers must not be aliased")


def _alike(a, b):
    """Whether two block messages have the same datatype and count per
    block (message_cco's count; MPICH checks aliasing only then)."""
    return a is not None and b is not None and a.datatype == b.datatype and a.count == b.count


# the rooted calls' numbers in the C fast path (remember_rooted / rooted)
_ROOTED = {"gather": 0, "scatter": 1, "reduce": 2}

# the one-call block collectives the C fast path can repeat: engine call ->
# (how to make a call of it known there (None: no C fast path in this
# Python), 1 for the bulk calls)
_FAST_BLOCKS = {_engine.coll_alltoall: (_fast_remember_alltoall, 0),
                _engine.coll_allgather: (_fast_remember_allgather, 0),
                _engine.coll_reduce_scatter: (_fast_remember_reduce_scatter, 0),
                _engine.coll_alltoall_bulk: (_fast_remember_alltoall, 1),
                _engine.coll_allgather_bulk: (_fast_remember_allgather, 1),
                _engine.coll_reduce_scatter_pair: (_fast_remember_reduce_scatter, 1)}


class CommColl:
    """Buffer collectives of ``Comm`` (blocking and nonblocking)."""

    __slots__ = ()

    # -- Collectives: buffers -----------------------------------------------
    # Each _c_* method parses and checks its arguments in the caller's thread
    # and returns a closure that runs the algorithm (run now, or in a thread
    # for the nonblocking variant).

    def _cplan(self, name, compress, dtype, nbytes, op=None, device=False, addr=0):
        """The compression coder of this call, or None (normal algorithm)."""
        if compress is _SKIP:
            return None
        c = self.__dict__.get("_chosts")
        if c is None or len(c[0]) != len(self._ranks):
            world_hosts = (_rt.info or {}).get("hosts")
            hosts = ([world_hosts[w] for w in self._ranks] if world_hosts
                     else [None] * len(self._ranks))
            c = self._chosts = (hosts, len(set(hosts)) <= 1)
        hosts = c[0]
        if compress is None and not self._chints:
            mode = _cz._config.mode
            # the common cases, with no per-call work: auto compresses only
            # large calls across hosts
            if mode == "off" or (mode == "auto" and (nbytes < _cz.AUTO_MIN_BYTES or c[1])):
                return None
        return _cz.plan(self, name, compress, dtype, nbytes, op=op, hosts=hosts,
                        rank=self._rank, device=device, addr=addr)

    def _cdev(self, compress):
        """Whether a call with device buffers may be compressed, so that the
        device path (no staging) is worth trying: a mode other than off, and
        for ``auto`` a communicator spanning hosts."""
        try:
            mode = _cz.mode_of(self, compress)[0]
        except ValueError:
            return True            # plan() reports it
        if mode in (None, "off"):
            return False
        if mode == "auto":
            world_hosts = (_rt.info or {}).get("hosts")
            if not world_hosts or len({world_hosts[w] for w in self._ranks}) < 2:
                return False
        try:
            from numba import cuda  # noqa: F401
        except ImportError:
            return False
        return True

    def _cplan_msgs(self, name, compress, whole, part, size):
        """Plan a block collective from its messages: ``whole`` holds all
        ``size`` blocks where present on this rank, else ``part`` one block
        (so every rank computes the same vector size)."""
        if compress is _SKIP:
            return None
        msg = whole if whole is not None else part
        if msg is None or msg.datatype.np_dtype is None:
            return None if msg is None else self._cplan(name, compress, np.uint8,
                                                        msg.nbytes * (1 if whole else size),
                                                        addr=msg.addr)
        nbytes = msg.nbytes if whole is not None else msg.nbytes * size
        return self._cplan(name, compress, msg.array.dtype, nbytes, addr=msg.addr)

    def _dev_blocks(self, name, compress, sendbuf, recvbuf, size, recv_blocks, root,
                    algo, send_blocks=False):
        """Device path of a block collective: None (not device buffers), a
        runner (compressed on the GPU), or False (plan said no: stage)."""
        bufs = [b for b in (sendbuf, recvbuf) if b is not None]
        if not bufs or any(_dev(b) is None for b in bufs) or not self._cdev(compress):
            return None
        sarr = rarr = None
        if sendbuf is not None:
            sarr, dtype = _dev_msg(sendbuf)
        if recvbuf is not None:
            rarr, dtype = _dev_msg(recvbuf)
        if sarr is not None and rarr is not None:
            sblk = sarr.size // size if send_blocks else sarr.size
            rblk = rarr.size // size if (recv_blocks and name != "scatter") else rarr.size
            if sblk != rblk:
                raise ValueError(f"mismatch in send count {sarr.size} and receive "
                                 f"count {rarr.size}")
        if name in ("gather",):
            whole = rarr
            nbytes = (rarr.size if rarr is not None else sarr.size * size) * dtype.itemsize
        elif name == "scatter":
            nbytes = (sarr.size if sarr is not None else rarr.size * size) * dtype.itemsize
        else:
            nbytes = rarr.size * dtype.itemsize
        cd = self._cplan(name, compress, dtype, nbytes, device=True,
                         addr=_dev_addr(recvbuf if recvbuf is not None else sendbuf))
        if cd is None:
            return False
        t = self._transport()
        if root is None:
            return lambda: algo(t, sarr, rarr, cd)
        return lambda: algo(t, sarr, rarr, root, cd)

    def _c_barrier(self, blocking=False):
        self._check()
        t = self._transport()
        t.blocking = blocking
        return lambda: coll.barrier(t)

    def _c_bcast(self, buf, root, compress=None, blocking=False):
        self._check()
        root = self._root(root)
        if _dev(buf) is not None and self._cdev(compress):
            arr, dtype = _dev_msg(buf)
            cd = self._cplan("bcast", compress, dtype, arr.size * dtype.itemsize,
                             device=True, addr=_dev_addr(buf))
            if cd is not None:
                t = self._transport()
                return lambda: _czcoll.bcast(t, arr, root, cd)
            compress = _SKIP
        msg = message_cco(buf, self._rank == root, 1)
        t = self._transport()
        cd = self._cplan("bcast", compress, msg.array.dtype, msg.nbytes, addr=msg.addr)
        if cd is not None:
            def crun():
                _czcoll.bcast(t, msg.array, root, cd)
                msg.finish()
            return crun

        t.blocking = blocking

        def run():
            coll.bcast(t, _u8(msg.array), root)
            msg.finish()
        return run

    def _c_reduce(self, sendbuf, recvbuf, op, root):
        self._check()
        root = self._root(root)
        _check_op(op)
        isroot = self._rank == root
        smsg = None if (isroot and is_in_place(sendbuf)) else message_cco(sendbuf, True, 1)
        rmsg = message_cco(recvbuf, False, 1) if isroot else None
        if smsg is not None and rmsg is not None:
            _check_cro(smsg, rmsg)
        dt = (smsg or rmsg).datatype
        op._check(dt)
        t = self._transport()
        sarr = smsg.array if smsg is not None else None
        rarr = rmsg.array if rmsg is not None else None

        def run():
            coll.reduce(t, sarr, rarr, root, _reduce_fn(op, dt), op.Is_commutative())
            if rmsg is not None:
                rmsg.finish()
        return run

    def _reduce_msgs(self, sendbuf, recvbuf, op):
        """``(smsg or None for IN_PLACE, rmsg, datatype)`` of an all-rank reduction."""
        self._check()
        _check_op(op)
        rmsg = message_cco(recvbuf, False, 1)
        smsg = None if is_in_place(sendbuf) else message_cco(sendbuf, True, 1)
        if smsg is not None:
            _check_cro(smsg, rmsg)
        dt = rmsg.datatype
        op._check(dt)
        return smsg, rmsg, dt

    def _c_allreduce(self, sendbuf, recvbuf, op, compress=None):
        inplace = is_in_place(sendbuf)
        if (_dev(recvbuf) is not None and (inplace or _dev(sendbuf) is not None)
                and self._cdev(compress)):
            self._check()
            _check_op(op)
            rarr, dtype = _dev_msg(recvbuf)
            sarr = None
            if not inplace:
                sarr, sdt = _dev_msg(sendbuf)
                if sarr.size != rarr.size or sdt != dtype:
                    raise ValueError(f"mismatch in send ({sarr.size} x {sdt}) and "
                                     f"receive ({rarr.size} x {dtype}) buffers")
            dt = _dev_dtype_datatype(dtype)
            op._check(dt)
            cd = self._cplan("allreduce", compress, dtype, rarr.size * dtype.itemsize,
                             op=op, device=True, addr=_dev_addr(recvbuf))
            if cd is not None:
                t = self._transport()
                return lambda: _czcoll.allreduce(t, sarr, rarr, _reduce_fn(op, dt), cd)
            compress = _SKIP
        smsg, rmsg, dt = self._reduce_msgs(sendbuf, recvbuf, op)
        t = self._transport()
        if rmsg.datatype.np_dtype is not None and (_mult(rmsg) == 1 or op._predefined):
            cd = self._cplan("allreduce", compress, rmsg.array.dtype, rmsg.nbytes, op=op,
                             addr=rmsg.addr)
            if cd is not None:
                def crun():
                    _czcoll.allreduce(t, None if smsg is None else smsg.array, rmsg.array,
                                      _reduce_fn(op, dt), cd)
                    rmsg.finish()
                return crun

        def run():
            coll.allreduce(t, None if smsg is None else smsg.array, rmsg.array,
                           _reduce_fn(op, dt), op.Is_commutative())
            rmsg.finish()
        return run

    def _c_scan(self, sendbuf, recvbuf, op, exclusive):
        smsg, rmsg, dt = self._reduce_msgs(sendbuf, recvbuf, op)
        t = self._transport()
        fn = coll.exscan if exclusive else coll.scan

        def run():
            fn(t, None if smsg is None else smsg.array, rmsg.array, _reduce_fn(op, dt))
            rmsg.finish()
        return run

    def _c_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op, block):
        self._check()
        _check_op(op)
        size = len(self._ranks)
        rmsg = message_cco(recvbuf, False, 1)
        inplace = is_in_place(sendbuf)
        if block and inplace:
            # mpi4py: the IN_PLACE buffer holds all blocks, one per rank
            if rmsg.count % size:
                raise ValueError(f"receive buffer size {rmsg.count} "
                                 f"is not a multiple of {size}")
            counts = [rmsg.count // size] * size
        elif block:
            counts = [rmsg.count] * size
        elif recvcounts is None:
            counts = None
        else:
            counts = [int(c) for c in recvcounts]
            if len(counts) != size:
                raise ValueError(f"expecting {size} items, got {len(counts)}")
        smsg = None if inplace else message_cco(sendbuf, True, 1)
        if smsg is not None and smsg.datatype != rmsg.datatype:
            raise buffers.type_mismatch(smsg, rmsg)
        if block and smsg is not None and smsg.count != rmsg.count * size:
            raise ValueError(f"mismatch in send count {smsg.count // size} "
                             f"and receive count {rmsg.count}")     # (mpi4py's)
        _check_alias(smsg, rmsg, rmsg.count != 0 or not block)
        if smsg is not None and not block and counts is not None:
            me = self._rank
            if smsg.count != sum(counts):
                raise ValueError(f"mismatch in send count {smsg.count} "
                                 f"and sum(counts) {sum(counts)}")
            if rmsg.count != counts[me]:
                raise ValueError(f"mismatch in receive count {rmsg.count} "
                                 f"and counts[{me}] {counts[me]}")
        dt = rmsg.datatype
        op._check(dt)
        mult = _mult(rmsg)
        t = self._transport()
        if counts is None:
            t2 = self._transport()

        def run():
            cnts = counts
            if cnts is None:
                mine = np.array([rmsg.count], dtype=np.int64)
                allc = np.empty(size, dtype=np.int64)
                coll.allgatherv(t2, mine, allc, [1] * size, None)
                cnts = [int(c) for c in allc]
            ecounts = [c * mult for c in cnts]
            total = sum(ecounts)
            if inplace:
                full = rmsg.array
                if full.size < total:
                    raise ValueError(f"receive buffer too small for IN_PLACE "
                                     f"({full.size} < {total} elements)")
                coll.reduce_scatter(t, None, full, ecounts, _reduce_fn(op, dt),
                                    op.Is_commutative())
            else:
                if smsg.array.size < total:
                    raise ValueError(f"send buffer too small ({smsg.array.size} "
                                     f"< {total} elements)")
                coll.reduce_scatter(t, smsg.array[:total], rmsg.array, ecounts,
                                    _reduce_fn(op, dt), op.Is_commutative())
            rmsg.finish()
        return run

    def _c_gather(self, sendbuf, recvbuf, root, compress=None):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        inplace = isroot and is_in_place(sendbuf)
        dev = self._dev_blocks("gather", compress, None if inplace else sendbuf,
                               recvbuf if isroot else None, size, isroot, root,
                               _czcoll.gather)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        rmsg = message_cco(recvbuf, False, size) if isroot else None
        smsg = None if inplace else message_cco(sendbuf, True, 1)
        if rmsg is not None:
            blk = rmsg.nbytes // size
            if smsg is not None and smsg.nbytes != blk:
                raise _mismatch(smsg, rmsg)
            _check_alias(smsg, rmsg, _alike(smsg, rmsg), roff=root * blk)
        t = self._transport()
        cd = self._cplan_msgs("gather", compress, rmsg, smsg, size)
        if cd is not None:
            return _run_compressed(_czcoll.gather, t, smsg, rmsg, cd, root)
        return _run_blocks(coll.gather, t, smsg, rmsg, root)

    def _c_gatherv(self, sendbuf, recvbuf, root):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        counts = displs = None
        rmsg = None
        if isroot:
            rmsg, _, counts, displs = _message_vector_bytes(recvbuf, False, size)
        smsg = None if (isroot and is_in_place(sendbuf)) else message_cco(sendbuf, True, 1)
        if isroot and smsg is not None and smsg.nbytes != counts[self._rank]:
            raise ValueError(f"mismatch in send count {smsg.count} and receive "
                             f"count {counts[self._rank] // max(_extent(rmsg), 1)}")
        return _run_gatherv(self._transport(), smsg, rmsg, counts, displs, root)

    def _c_scatter(self, sendbuf, recvbuf, root, compress=None):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        inplace = isroot and is_in_place(recvbuf)
        dev = self._dev_blocks("scatter", compress, sendbuf if isroot else None,
                               None if inplace else recvbuf, size, isroot, root,
                               _czcoll.scatter, send_blocks=True)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        smsg = message_cco(sendbuf, True, size) if isroot else None
        rmsg = None if inplace else message_cco(recvbuf, False, 1)
        if smsg is not None:
            blk = smsg.nbytes // size
            if rmsg is not None and rmsg.nbytes != blk:
                raise _mismatch(smsg, rmsg)
            _check_alias(smsg, rmsg, _alike(rmsg, smsg), soff=root * blk)
        t = self._transport()
        cd = self._cplan_msgs("scatter", compress, smsg, rmsg, size)
        if cd is not None:
            return _run_compressed(_czcoll.scatter, t, smsg, rmsg, cd, root)
        return _run_blocks(coll.scatter, t, smsg, rmsg, root)

    def _c_scatterv(self, sendbuf, recvbuf, root):
        self._check()
        root = self._root(root)
        size = len(self._ranks)
        isroot = self._rank == root
        smsg = counts = displs = None
        if isroot:
            smsg, _, counts, displs = _message_vector_bytes(sendbuf, True, size)
        rmsg = None if (isroot and is_in_place(recvbuf)) else message_cco(recvbuf, False, 1)
        if isroot and rmsg is not None and rmsg.nbytes != counts[self._rank]:
            raise ValueError(f"mismatch in send count and receive count {rmsg.count}")
        return _run_scatterv(self._transport(), smsg, rmsg, counts, displs, root)

    def _c_allgather(self, sendbuf, recvbuf, compress=None, blocking=False):
        self._check()
        size = len(self._ranks)
        inplace = is_in_place(sendbuf)
        dev = self._dev_blocks("allgather", compress, None if inplace else sendbuf,
                               recvbuf, size, True, None, _czcoll.allgather)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        rmsg = message_cco(recvbuf, False, size)
        smsg = None if is_in_place(sendbuf) else message_cco(sendbuf, True, 1)
        blk = rmsg.nbytes // size
        if smsg is not None and smsg.nbytes > blk:
            # every rank receives blocks larger than its receive blocks (MPICH: truncation)
            raise_error(ERR_TRUNCATE, f"send count {smsg.count} exceeds the receive "
                                      f"block ({rmsg.count} // {size})")
        if smsg is not None and smsg.nbytes != blk:
            raise _mismatch(smsg, rmsg)
        _check_alias(smsg, rmsg, _alike(smsg, rmsg), roff=self._rank * blk)
        counts, displs = _blocks(blk, size)
        t = self._transport()
        cd = self._cplan_msgs("allgather", compress, rmsg, None, size)
        if cd is not None:
            return _run_compressed(_czcoll.allgather, t, smsg, rmsg, cd)
        t.blocking = blocking       # (pair_allgather)
        return _run_allgatherv(t, smsg, rmsg, counts, displs)

    def _c_allgatherv(self, sendbuf, recvbuf):
        self._check()
        size = len(self._ranks)
        rmsg, c, counts, displs = _message_vector_bytes(recvbuf, False, size)
        smsg = None if is_in_place(sendbuf) else message_cco(sendbuf, True, 1)
        if smsg is not None and smsg.nbytes != counts[self._rank]:
            raise ValueError(f"mismatch in send count {smsg.count} and receive "
                             f"count {c[self._rank]}")
        return _run_allgatherv(self._transport(), smsg, rmsg, counts, displs)

    def _c_alltoall(self, sendbuf, recvbuf, compress=None, blocking=False):
        self._check()
        size = len(self._ranks)
        inplace = is_in_place(sendbuf)
        dev = self._dev_blocks("alltoall", compress, None if inplace else sendbuf,
                               recvbuf, size, True, None, _czcoll.alltoall,
                               send_blocks=True)
        if dev is not None:
            if callable(dev):
                return dev
            compress = _SKIP
        rmsg = message_cco(recvbuf, False, size)
        smsg = None if inplace else message_cco(sendbuf, True, size)
        if smsg is not None and smsg.nbytes != rmsg.nbytes:
            raise _mismatch(smsg, rmsg)
        _check_alias(smsg, rmsg, _alike(smsg, rmsg))
        t = self._transport()
        cd = self._cplan_msgs("alltoall", compress, rmsg, None, size)
        if cd is not None:
            return _run_compressed(_czcoll.alltoall, t, smsg, rmsg, cd)
        t.blocking = blocking       # (pair_alltoall)
        return _run_blocks(coll.alltoall, t, smsg, rmsg)

    def _c_alltoallv(self, sendbuf, recvbuf):
        self._check()
        size = len(self._ranks)
        rmsg, _, rcounts, rdispls = _message_vector_bytes(recvbuf, False, size)
        scounts = sdispls = None
        smsg = None
        if not is_in_place(sendbuf):
            smsg, _, scounts, sdispls = _message_vector_bytes(sendbuf, True, size)
        t = self._transport()

        def run():
            coll.alltoallv(t, _u8_of(smsg), scounts, sdispls, _u8_of(rmsg), rcounts, rdispls)
            rmsg.finish()
        return run

    def Barrier(self):
        """Block until every process has entered."""
        r = _fast_barrier(self._fast)       # one C call once remembered
        if r:
            self._barrier_more(r)

    def _barrier_more(self, r):
        """Barrier after the fast call answered ``r`` (see _engine.fast)."""
        if r != 1:
            return _fast_coll_raise(r, "barrier")
        if self._small_ok("barrier"):
            self._fast_remember("barrier", _fast_remember_barrier,
                                (_environ_data, _COLL_ENV["barrier"]), compressible=False)
            try:
                base = self._coll_base()
                if len(self._ranks) == 2 and _rt.engine.pair_barrier(
                        self._ranks[1 - self._rank], self._ctx + 1):
                    return              # agreed flags, waited for in slices (signals)
                _engine.coll_barrier(_rt.engine, self._cranks, len(self._ranks), self._rank,
                                     base, self._ctx + 1)
            except _engine.EngineError as e:
                raise engine_exception(e) from None
            return
        self._c_barrier(blocking=True)()

    def Bcast(self, buf, root=0, *, compress=None):
        """Broadcast a buffer from ``root`` to every process."""
        if compress is None:
            r = _fast_bcast(self._fast, buf, root)      # the Bcast remembered last
            if r:
                self._bcast_more(r, buf, root)
            return
        self._c_bcast(buf, root, compress, blocking=True)()

    def _bcast_more(self, r, buf, root):
        """Bcast (no ``compress``) after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "bcast")
        if type(root) is int and self._small_ok("bcast"):
            c = self._bccache       # the last call's resolved buffer, if the same
            n = len(self._ranks)
            if (c is not None and _spec_is(buf, c[0], c[1]) and c[0].nbytes == c[2]
                    and 0 <= root < n and self._no_compress("bcast", c[2], c[3], arr=c[0])):
                f = c[0].flags
                if f.writeable and f.c_contiguous:
                    try:
                        _engine.coll_bcast(_rt.engine, c[4], c[2], root, self._cranks, n,
                                           self._rank, self._coll_base(), self._ctx + 1)
                    except _engine.EngineError as e:
                        raise engine_exception(e) from None
                    return
            arr = _plain_array(buf, False)
            npd = None if arr is None else _spec_np_dtype(buf, arr)
            if (arr is not None and 0 <= root < n
                    and (arr.nbytes <= _SMALL_COLL_MAX
                         or n == 2 and arr.nbytes < coll.BULK_BCAST_MIN)  # binomial too
                    and self._no_compress("bcast", arr.nbytes, npd, arr=arr)):
                ptr = _buffer_pointer(arr)
                fresh = self._new_arrays("bcast", arr, None)
                ent = (arr, None if arr is buf else buf[1], arr.nbytes, npd, ptr)
                self._bccache = None if fresh else ent
                self._fast_remember("bcast", _fast_remember_bcast, (
                    buf, arr, ent[1], arr.flags.num, _environ_data,
                    _COLL_ENV["bcast"], _cz._config, self._chints, fresh))
                try:
                    _engine.coll_bcast(_rt.engine, ptr, arr.nbytes, root,
                                       self._cranks, n, self._rank, self._coll_base(),
                                       self._ctx + 1)
                except _engine.EngineError as e:
                    raise engine_exception(e) from None
                return
        self._c_bcast(buf, root, None, blocking=True)()

    # -- small collectives in one engine call (erdma_coll_*) ----------------
    #
    # A Barrier, or a Bcast / Allreduce of at most _SMALL_COLL_MAX bytes of a
    # plain host array with a predefined (C-reducible) op, runs its whole
    # algorithm in the calling thread inside the engine: the same messages
    # (tags, sizes, order of reduction) as the Python algorithm the default
    # rule picks for it (dissemination, binomial, recursive doubling), so a
    # rank that takes the Python path (a strided buffer, say) still matches.
    # Not where that rule may pick another one: an ERDMA_COLL_<NAME> override,
    # ranks on several hosts (hierarchical), compression.

    def _small_ok(self, name):
        ranks = self._ranks
        if ranks is None or _rt.engine is None or self._revoked:
            return False
        c = self._csmall
        if c is None or c[0] is not ranks:
            world_hosts = (_rt.info or {}).get("hosts")
            k = len({world_hosts[w] for w in ranks}) if world_hosts else 1
            self._cranks = _engine.ranks_array(ranks)   # first: another thread may look
            c = self._csmall = (ranks, not (1 < k < len(ranks)) and not self.Is_inter(), k <= 1)
        return c[1] and _COLL_ENV[name] not in _environ_data

    def _no_compress(self, name, nbytes, dtype, op=None, arr=None):
        """Whether this call runs uncompressed (as _cplan decides: its cheap
        cases here, else on one host _cplan itself)."""
        if not self._chints:
            mode = _cz._config.mode
            if mode == "off" or (mode == "auto" and nbytes < _cz.AUTO_MIN_BYTES):
                return True
        if not self._csmall[2]:
            return False            # several hosts: the normal path plans
        addr = 0 if arr is None else arr.__array_interface__["data"][0]
        return self._cplan(name, None, dtype, nbytes, op=op, addr=addr) is None

    def _small_allreduce(self, sendbuf, recvbuf, op):
        """Allreduce in one engine call where it applies (see above): True
        when done."""
        if not (type(op) is Op and op._predefined and self._small_ok("allreduce")):
            return False
        c = self._arcache       # the last call's resolved buffers, if the same
        if (c is not None and op is c[2] and _spec_is(recvbuf, c[3], c[4])
                and (_spec_is(sendbuf, c[5], c[6]) or c[5] is None and sendbuf is IN_PLACE)
                and c[3].nbytes == c[7] and (c[5] is None or c[5].nbytes == c[7])
                and self._no_compress("allreduce", c[7], c[1], op, c[3])):
            f = c[3].flags
            if f.writeable and f.c_contiguous:
                self._fast_remember_allreduce(sendbuf, recvbuf, c)
                try:
                    c[0](_rt.engine, c[8], c[9], c[10], c[11], c[12], self._cranks,
                         len(self._ranks), self._rank, self._coll_base(), self._ctx + 1)
                except _engine.EngineError as e:
                    raise engine_exception(e) from None
                return True
        codes = _C_OPS.get(op._name)
        rtype = type(recvbuf)
        if codes is None or rtype is not _ndarray and rtype is not list and rtype is not tuple:
            return False
        rarr, rdt = _plain_with_type(recvbuf, False)
        if rarr is None or rdt.np_dtype is None:
            return False
        fn = _engine.coll_allreduce
        if rarr.nbytes > _SMALL_COLL_MAX:
            # two ranks of one host, mid sizes: the pair (erdma_coll_allreduce_pair)
            n = len(self._ranks)
            if not (n == 2 and self._csmall[2] and coll._default(
                        "allreduce", rarr.nbytes, n, rarr.size, True) == "sched_pair"):
                return False
            fn = _engine.coll_allreduce_pair
        npd = rdt.np_dtype
        if not self._no_compress("allreduce", rarr.nbytes, npd, op, rarr):
            return False
        sarr = sdt = None
        if sendbuf is IN_PLACE or is_in_place(sendbuf):
            saddr = None
        else:
            sarr, sdt = _plain_with_type(sendbuf, True)
            if sarr is None or sdt is not rdt or sarr.nbytes != rarr.nbytes or (
                    fn is not _engine.coll_allreduce and np.may_share_memory(sarr, rarr)):
                return False
            saddr = _buffer_pointer(sarr)
            if saddr == _buffer_pointer(rarr) and rarr.nbytes:
                return False        # the same buffer: the normal path reports it
        ctype = _c_dtype(rdt)
        if ctype is None or ctype[2] and op._name not in _LOGICAL_OPS:
            return False
        try:
            op._check(rdt)
        except Exception:
            return False            # the normal path reports it
        raddr = _buffer_pointer(rarr)
        count = rarr.nbytes // ctype[3]
        c = (fn, npd, op,
             rarr, None if type(recvbuf) is _ndarray else rdt,
             sarr, None if sarr is None or type(sendbuf) is _ndarray else sdt,
             rarr.nbytes, saddr, raddr, count, codes, ctype[1])
        # the cache keeps its arrays alive: not a large one, nor the arrays of
        # a program that passes new ones every call (their memory would be
        # freed in the next call instead of when the program drops them)
        fresh = self._new_arrays("allreduce", rarr, sarr)
        self._arcache = c if rarr.nbytes <= _COLL_CACHE_MAX and not fresh else None
        self._fast_remember_allreduce(sendbuf, recvbuf, c, fresh)
        try:
            fn(_rt.engine, saddr, raddr, count, codes, ctype[1], self._cranks,
               len(self._ranks), self._rank, self._coll_base(), self._ctx + 1)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return True

    def _fast_remember(self, name, remember, args, compressible=True):
        """Make a call just resolved for one engine call known to the C fast
        path (``remember(state, *args)``) on a communicator of one host;
        ``compressible``: only while no hint or compression mode could
        compress it (``auto`` is off on one host; the C call checks that
        they stay so)."""
        if remember is None or not self._csmall[2]:
            return
        if compressible and (self._chints or _cz._config.mode not in ("off", "auto")):
            return
        f = self._fast
        if f is None or not remember(f, *args):
            f = self._fast_state()
            if f is not None and remember(f, *args):
                self._fast = f

    def _fast_remember_allreduce(self, sendbuf, recvbuf, c, fresh=None):
        """Make the small Allreduce _small_allreduce just resolved (its cache
        entry ``c``) known to the C fast path, when it would take the same
        way again as long as the environment override, the compression mode
        and the hints stay as they are now (the C call checks them);
        ``fresh``: _new_arrays' answer for this call, if asked already."""
        rarr, sarr = c[3], c[5]
        if fresh is None:
            fresh = self._new_arrays("allreduce", rarr, sarr)
        self._fast_remember("allreduce", _fast_remember_allreduce, (
            IN_PLACE if sarr is None else sendbuf, sarr, c[6], recvbuf, rarr, c[4], c[2],
            c[10], c[11], c[12], 0 if sarr is None else sarr.flags.num, rarr.flags.num,
            _environ_data, _COLL_ENV["allreduce"], _cz._config, self._chints, fresh,
            int(c[0] is _engine.coll_allreduce_pair), -1.0))

    def _new_arrays(self, name, rarr, sarr):
        """Whether this call's arrays have the layouts of the last resolved.

        True for the call of ``name`` just resolved when the one resolved
        before passed arrays of the same layouts (a program that makes its
        arrays anew for every call, ``comm.Allreduce(np.array([x]), out)``):
        the C fast path then remembers the call by the arrays' layouts, not
        by the arrays themselves."""
        key = tuple(None if a is None else (a.shape, a.strides, a.dtype) for a in (rarr, sarr))
        if self._lastlay is None:
            self._lastlay = {}
        old = self._lastlay.get(name)
        self._lastlay[name] = key
        return old == key

    # -- block collectives in one engine call --------------------------------
    #
    # An Alltoall, Allgather or Reduce_scatter_block of plain host arrays runs
    # as one engine call where the default rule picks an algorithm the engine
    # has: the direct Alltoall and Allgather and the ring Reduce_scatter of
    # erdma_coll.c for small vectors, the bulk (CMA) Alltoall, Allgather and
    # two-rank Reduce_scatter of erdma_bulk.c for large ones.  Same messages as the Python algorithm, so
    # a rank on the normal path still matches.  The resolved call is kept per
    # collective while the caller passes the same buffers.

    def _blocks_fast(self, name, sendbuf, recvbuf, op=None):
        """Run this call in one engine call if it applies: True when done."""
        if not self._small_ok(name):
            return False
        c = self._bkcache.get(name) if self._bkcache is not None else None
        resolved = (c is None or c[6] is not op or not _same_spec(recvbuf, c[0], c[1], c[4], True)
                    or not _same_spec(sendbuf, c[2], c[3], c[5], False))
        if resolved:
            c = self._blocks_resolve(name, sendbuf, recvbuf, op)
            if c is None:
                return False
        fresh = self._fresh_arrays(name, c[0], None if c[3] is _UNUSED else c[2], resolved)
        remember, bulk = _FAST_BLOCKS.get(c[-2], (None, 0))
        if remember is not None:
            # the C fast path; arrays over the cache's limit are not kept
            # alive there but checked by their layout on every call
            a = c[-1]
            if bulk and op is None:  # (saddr, raddr, blk, pull_part) / (saddr, raddr, offs, lens)
                count, part = (a[2], a[3]) if name == "alltoall" else (a[3][0], -1.0)
                opc = dtc = 0
            else:
                count, part = a[2], -1.0
                opc, dtc = (a[3], a[4]) if len(a) > 4 else (0, 0)
            self._fast_remember(name, remember, (
                IN_PLACE if c[3] is _UNUSED else sendbuf, None if c[3] is _UNUSED else c[2],
                None if c[3] is _UNUSED else c[3], recvbuf, c[0], c[1], op, count, opc, dtc,
                0 if c[3] is _UNUSED else c[2].flags.num, c[0].flags.num, _environ_data,
                _COLL_ENV[name], _cz._config, self._chints,
                c[4] + c[5] > _COLL_CACHE_MAX or fresh, bulk, float(part)))
        return self._one_call(name, c)

    def _fresh_arrays(self, name, rarr, sarr, resolved):
        """_new_arrays for block or rooted collective ``name``; the entry
        just resolved (``resolved``) of new arrays of the last call's layouts
        is not kept in the cache (see _small_allreduce)."""
        fresh = self._new_arrays(name, rarr, sarr)
        if fresh and resolved and self._bkcache is not None:
            self._bkcache.pop(name, None)
        return fresh

    def _one_call(self, name, c):
        """Run the resolved one-call entry ``c`` of collective ``name`` (its
        last five fields: the dtype, bytes and array compression would be
        planned from, the engine call and its leading arguments): True when
        done, False when this call is to be compressed (the normal path)."""
        npd, nbytes, arr, fn, args = c[-5:]
        if npd is not None and not self._no_compress(name, nbytes, npd, arr=arr):
            return False
        try:
            fn(_rt.engine, *args, self._cranks, len(self._ranks), self._rank, self._coll_base(),
               self._ctx + 1)
        except _engine.EngineError as e:
            raise engine_exception(e) from None
        return True

    def _one_store(self, name, c, nbytes):
        """Keep entry ``c`` for the next call of ``name``, unless its arrays
        (``nbytes`` together) are large: the cache keeps them alive; ``c``
        either way."""
        if self._bkcache is None:
            self._bkcache = {}
        if nbytes <= _COLL_CACHE_MAX:
            self._bkcache[name] = c
        else:
            self._bkcache.pop(name, None)
        return c

    def _blocks_resolve(self, name, sendbuf, recvbuf, op):
        """The cache entry of a block collective (see above), or None: the
        normal path (which also reports every error)."""
        n = len(self._ranks)
        rarr, rdt = _plain_with_type(recvbuf, False)
        if rarr is None or rdt.np_dtype is None or not rarr.flags.c_contiguous:
            return None
        sarr = sdt = saddr = None
        if not (sendbuf is IN_PLACE or is_in_place(sendbuf)):
            sarr, sdt = _plain_with_type(sendbuf, True)
            if sarr is None or np.may_share_memory(sarr, rarr):
                return None
            saddr = _buffer_pointer(sarr)
        raddr = _buffer_pointer(rarr)
        whole = rarr.nbytes if sarr is None or name != "reduce_scatter" else sarr.nbytes
        # blocks of whole elements (the normal path reports a count that does not divide)
        if whole % (rdt.np_dtype.itemsize * n) or sarr is not None and sarr.nbytes != (
                rarr.nbytes // n if name == "allgather" else
                rarr.nbytes * n if name == "reduce_scatter" else rarr.nbytes):
            return None
        blk = whole // n
        npd = rdt.np_dtype           # compression is planned on the receive side
        if name == "reduce_scatter":
            npd = None               # never compressed
            ctype = _c_dtype(rdt)
            codes = _C_OPS.get(getattr(op, "_name", None))
            if (type(op) is not Op or not op._predefined or codes is None or ctype is None
                    or ctype[2] and op._name not in _LOGICAL_OPS
                    or sdt is not None and sdt is not rdt):
                return None
            try:
                op._check(rdt)
            except Exception:
                return None
            choice = coll._default(name, whole, n, whole // ctype[3], True)
            if choice == "ring":
                fn = _engine.coll_reduce_scatter
            elif choice == "sched_pair" and sarr is not None:
                fn = _engine.coll_reduce_scatter_pair
            else:
                return None
            call = (fn, (saddr, raddr, blk // ctype[3], codes, ctype[1]))
        elif name == "alltoall":
            choice = coll._default(name, 2 * whole, n, whole, True)
            if choice == "direct":
                call = (_engine.coll_alltoall, (saddr, raddr, blk))
            elif choice == "sched" and sarr is not None:
                call = (_engine.coll_alltoall_bulk, (saddr, raddr, blk, _collsched.BULK_PULL_PART))
            else:
                return None
        else:
            world_hosts = (_rt.info or {}).get("hosts")
            if _wan_algos.prefer_allgather_direct(
                    [world_hosts[w] for w in self._ranks] if world_hosts else None, n, whole):
                return None         # ranks on hosts of their own: the pieces of collectives/wan.py
            choice = coll._default("allgatherv", whole, n, whole, True)
            if choice == "direct":
                call = (_engine.coll_allgather, (saddr, raddr, blk))
            elif choice == "sched_ring" and n <= _sched_algos.BULK_PULL_MAX_RANKS:
                offs = _engine.ffi.new("uint64_t[]", [blk * i for i in range(n)])
                lens = _engine.ffi.new("uint64_t[]", [blk] * n)
                call = (_engine.coll_allgather_bulk, (saddr, raddr, offs, lens))
            else:
                return None
        return self._one_store(name, (
            rarr, None if type(recvbuf) is _ndarray else rdt,
            sendbuf if sarr is None else sarr,
            _UNUSED if sarr is None else None if type(sendbuf) is _ndarray else sdt,
            rarr.nbytes, 0 if sarr is None else sarr.nbytes, op, npd, rarr.nbytes, rarr) + call,
            rarr.nbytes + (0 if sarr is None else sarr.nbytes))

    # Gather, Scatter and Reduce with a root, the same way: linear Gather and
    # Scatter (where the default rule picks them) and the binomial Reduce.

    def _rooted_fast(self, name, sendbuf, recvbuf, root, op=None):
        """Run this rooted call in one engine call if it applies: True when done."""
        if type(root) is not int or not self._small_ok(name):
            return False
        c = self._bkcache.get(name) if self._bkcache is not None else None
        resolved = (c is None or c[0] != root or c[1] is not op
                    or not _same_spec(sendbuf, c[2], c[3], c[4], False)
                    or not _same_spec(recvbuf, c[5], c[6], c[7], True))
        if resolved:
            c = self._rooted_resolve(name, sendbuf, recvbuf, root, op)
            if c is None:
                return False
        if not self._one_call(name, c):
            return False
        self._fast_remember_rooted(name, c, sendbuf, recvbuf, resolved)
        return True

    def _fast_remember_rooted(self, name, c, sendbuf, recvbuf, resolved):
        """Make the rooted call just run in one engine call (cache entry ``c``,
        see _rooted_resolve, ``resolved`` for this call) known to the C fast
        path, as _fast_remember_allreduce does."""
        root, op = c[0], c[1]
        isroot = self._rank == root
        sarr = None if c[3] is _UNUSED else c[2]
        rarr = None if c[6] is _UNUSED else c[5]
        smode = 2 if sarr is not None else 1 if isroot and name != "scatter" else 0
        rmode = 2 if rarr is not None else 1 if isroot and name == "scatter" else 0
        args = c[-1]
        opc, dtc = (args[3], args[4]) if name == "reduce" else (0, 0)
        self._fast_remember(name, _fast_remember_rooted, (
            _ROOTED[name], root, sendbuf, sarr, None if sarr is None else c[3], smode,
            recvbuf, rarr, None if rarr is None else c[6], rmode,
            op if name == "reduce" else None, args[2], opc, dtc,
            0 if sarr is None else sarr.flags.num, 0 if rarr is None else rarr.flags.num,
            _environ_data, _COLL_ENV[name], _cz._config, self._chints,
            self._fresh_arrays(name, rarr, sarr, resolved)))

    def _rooted_resolve(self, name, sendbuf, recvbuf, root, op):
        """The cache entry of a rooted collective (see above), or None."""
        n = len(self._ranks)
        if not 0 <= root < n:
            return None
        isroot = self._rank == root
        sarr = rarr = sdt = rdt = None
        if (isroot or name != "scatter") and not (isroot and name != "scatter"
                                                  and is_in_place(sendbuf)):
            sarr, sdt = _plain_with_type(sendbuf, True)
            if sarr is None:
                return None
        if (isroot or name == "scatter") and not (isroot and name == "scatter"
                                                  and is_in_place(recvbuf)):
            rarr, rdt = _plain_with_type(recvbuf, False)
            if rarr is None or not rarr.flags.c_contiguous:
                return None
        if sarr is None and rarr is None or (sarr is not None and rarr is not None
                                             and np.may_share_memory(sarr, rarr)):
            return None
        dt = rdt if rdt is not None else sdt
        if dt.np_dtype is None:
            return None
        saddr = None if sarr is None else _buffer_pointer(sarr)
        raddr = None if rarr is None else _buffer_pointer(rarr)
        npd = dt.np_dtype
        if name == "reduce":
            npd = None               # never compressed
            nb = (sarr if sarr is not None else rarr).nbytes
            ctype = _c_dtype(dt)
            codes = _C_OPS.get(getattr(op, "_name", None))
            if (type(op) is not Op or not op._predefined or codes is None or ctype is None
                    or ctype[2] and op._name not in _LOGICAL_OPS
                    or sarr is not None and rarr is not None and (sdt is not rdt
                                                                  or rarr.nbytes != nb)):
                return None
            try:
                op._check(dt)
            except Exception:
                return None
            whole = nb
            call = (_engine.coll_reduce, (saddr, raddr, nb // ctype[3], codes, ctype[1], root))
        else:
            # the per-rank block and the vector at the root (all blocks there)
            part, full = (sarr, rarr) if name == "gather" else (rarr, sarr)
            blk = part.nbytes if part is not None else full.nbytes // n
            if (full is not None and full.nbytes != blk * n
                    or blk % dt.np_dtype.itemsize):
                return None
            whole = blk * n
            if coll._default(name, whole, n, 0, True) != "linear":
                return None
            call = (_engine.coll_gather if name == "gather" else _engine.coll_scatter,
                    (saddr, raddr, blk, root))
        return self._one_store(name, (
            root, op,
            sendbuf if sarr is None else sarr,
            _UNUSED if sarr is None else None if type(sendbuf) is _ndarray else sdt,
            0 if sarr is None else sarr.nbytes,
            recvbuf if rarr is None else rarr,
            _UNUSED if rarr is None else None if type(recvbuf) is _ndarray else rdt,
            0 if rarr is None else rarr.nbytes,
            npd, whole, rarr if rarr is not None else sarr) + call,
            (0 if sarr is None else sarr.nbytes) + (0 if rarr is None else rarr.nbytes))

    def Reduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        """Reduce every process's buffer with ``op`` into ``root``'s."""
        r = _fast_rooted(self._fast, 2, sendbuf, recvbuf, root, op)    # the one remembered last
        if r:
            self._reduce_more(r, sendbuf, recvbuf, op, root)

    def _reduce_more(self, r, sendbuf, recvbuf, op, root):
        """Reduce after the fast call answered ``r`` (see _engine.fast)."""
        if r != 1:
            return _fast_coll_raise(r, "reduce")
        if self._rooted_fast("reduce", sendbuf, recvbuf, root, op):
            return
        self._c_reduce(sendbuf, recvbuf, _op_arg(op), root)()

    def Allreduce(self, sendbuf, recvbuf, op=_SUM, *, compress=None):
        """Reduce every process's buffer with ``op``; every process gets the result."""
        if compress is None:
            # the small Allreduce remembered last: one C call (_engine.fast)
            r = _fast_allreduce(self._fast, sendbuf, recvbuf, op)
            if r:
                self._allreduce_more(r, sendbuf, recvbuf, op)
            return
        self._c_allreduce(sendbuf, recvbuf, _op_arg(op), compress)()

    def _allreduce_more(self, r, sendbuf, recvbuf, op):
        """Allreduce (no ``compress``) after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "allreduce")
        if self._small_allreduce(sendbuf, recvbuf, op):
            return
        self._c_allreduce(sendbuf, recvbuf, _op_arg(op), None)()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        """Reduce with ``op``, then scatter equal blocks of the result."""
        r = _fast_reduce_scatter(self._fast, sendbuf, recvbuf, op)  # the one remembered last
        if r:
            self._reduce_scatter_more(r, sendbuf, recvbuf, op)

    def _reduce_scatter_more(self, r, sendbuf, recvbuf, op):
        """Reduce_scatter_block after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "reduce_scatter")
        if self._blocks_fast("reduce_scatter", sendbuf, recvbuf, op):
            return
        self._c_reduce_scatter(sendbuf, recvbuf, None, _op_arg(op), True)()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        self._c_reduce_scatter(sendbuf, recvbuf, recvcounts, _op_arg(op), False)()

    def Gather(self, sendbuf, recvbuf, root=0, *, compress=None):
        """Gather every process's buffer into ``root``'s receive buffer."""
        if compress is None:
            r = _fast_rooted(self._fast, 0, sendbuf, recvbuf, root, None)
            if r:
                self._gather_more(r, sendbuf, recvbuf, root)
            return
        self._c_gather(sendbuf, recvbuf, root, compress)()

    def _gather_more(self, r, sendbuf, recvbuf, root):
        """Gather (no ``compress``) after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "gather")
        if self._rooted_fast("gather", sendbuf, recvbuf, root):
            return
        self._c_gather(sendbuf, recvbuf, root, None)()

    def Gatherv(self, sendbuf, recvbuf, root=0):
        self._c_gatherv(sendbuf, recvbuf, root)()

    def Scatter(self, sendbuf, recvbuf, root=0, *, compress=None):
        """Scatter equal blocks of ``root``'s send buffer to every process."""
        if compress is None:
            r = _fast_rooted(self._fast, 1, sendbuf, recvbuf, root, None)
            if r:
                self._scatter_more(r, sendbuf, recvbuf, root)
            return
        self._c_scatter(sendbuf, recvbuf, root, compress)()

    def _scatter_more(self, r, sendbuf, recvbuf, root):
        """Scatter (no ``compress``) after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "scatter")
        if self._rooted_fast("scatter", sendbuf, recvbuf, root):
            return
        self._c_scatter(sendbuf, recvbuf, root, None)()

    def Scatterv(self, sendbuf, recvbuf, root=0):
        self._c_scatterv(sendbuf, recvbuf, root)()

    def Allgather(self, sendbuf, recvbuf, *, compress=None):
        """Gather every process's buffer into every process's receive buffer."""
        if compress is None:
            r = _fast_allgather(self._fast, sendbuf, recvbuf)    # the one remembered last
            if r:
                self._allgather_more(r, sendbuf, recvbuf)
            return
        self._c_allgather(sendbuf, recvbuf, compress, blocking=True)()

    def _allgather_more(self, r, sendbuf, recvbuf):
        """Allgather (no ``compress``) after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "allgather")
        if self._blocks_fast("allgather", sendbuf, recvbuf):
            return
        self._c_allgather(sendbuf, recvbuf, None, blocking=True)()

    def Allgatherv(self, sendbuf, recvbuf):
        self._c_allgatherv(sendbuf, recvbuf)()

    def Alltoall(self, sendbuf, recvbuf, *, compress=None):
        """Send block i of the send buffer to process i; receive block j from process j."""
        if compress is None:
            r = _fast_alltoall(self._fast, sendbuf, recvbuf)    # the one remembered last
            if r:
                self._alltoall_more(r, sendbuf, recvbuf)
            return
        self._c_alltoall(sendbuf, recvbuf, compress, blocking=True)()

    def _alltoall_more(self, r, sendbuf, recvbuf):
        """Alltoall (no ``compress``) after the fast call answered ``r``."""
        if r != 1:
            return _fast_coll_raise(r, "alltoall")
        if self._blocks_fast("alltoall", sendbuf, recvbuf):
            return
        self._c_alltoall(sendbuf, recvbuf, None, blocking=True)()

    def Alltoallv(self, sendbuf, recvbuf):
        self._c_alltoallv(sendbuf, recvbuf)()

    # Nonblocking collectives: the algorithm runs in a background thread.

    def Ibarrier(self):
        return _icoll(self._c_barrier())

    def Ibcast(self, buf, root=0, *, compress=None):
        return _icoll(self._c_bcast(buf, root, compress))

    def Ireduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        return _icoll(self._c_reduce(sendbuf, recvbuf, _op_arg(op), root))

    def Iallreduce(self, sendbuf, recvbuf, op=_SUM, *, compress=None):
        return _icoll(self._c_allreduce(sendbuf, recvbuf, _op_arg(op), compress))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        return _icoll(self._c_reduce_scatter(sendbuf, recvbuf, None, _op_arg(op), True))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        return _icoll(self._c_reduce_scatter(sendbuf, recvbuf, recvcounts, _op_arg(op), False))

    def Igather(self, sendbuf, recvbuf, root=0, *, compress=None):
        return _icoll(self._c_gather(sendbuf, recvbuf, root, compress))

    def Igatherv(self, sendbuf, recvbuf, root=0):
        return _icoll(self._c_gatherv(sendbuf, recvbuf, root))

    def Iscatter(self, sendbuf, recvbuf, root=0, *, compress=None):
        return _icoll(self._c_scatter(sendbuf, recvbuf, root, compress))

    def Iscatterv(self, sendbuf, recvbuf, root=0):
        return _icoll(self._c_scatterv(sendbuf, recvbuf, root))

    def Iallgather(self, sendbuf, recvbuf, *, compress=None):
        return _icoll(self._c_allgather(sendbuf, recvbuf, compress))

    def Iallgatherv(self, sendbuf, recvbuf):
        return _icoll(self._c_allgatherv(sendbuf, recvbuf))

    def Ialltoall(self, sendbuf, recvbuf, *, compress=None):
        return _icoll(self._c_alltoall(sendbuf, recvbuf, compress))

    def Ialltoallv(self, sendbuf, recvbuf):
        return _icoll(self._c_alltoallv(sendbuf, recvbuf))

    def _c_alltoallw(self, sendbuf, recvbuf):
        # one round of point-to-point messages, per-peer datatypes (_p2pcoll)
        ranks = self._check()
        n = len(ranks)
        rbl, rraw = _px.message_w(recvbuf, False, n)
        if is_in_place(sendbuf):
            sbl = [b.copy() for b in rbl]
        else:
            sbl, _ = _px.message_w(sendbuf, True, n)
        t = _px.transport(self, ranks)

        def run():
            _px.exchange(t, [(j, sbl[j], 0) for j in range(n)],
                         [(j, rbl[j], 0) for j in range(n)])
            _px.finish_raw(rraw)
        return run

    def Alltoallw(self, sendbuf, recvbuf):
        self._c_alltoallw(sendbuf, recvbuf)()

    def Ialltoallw(self, sendbuf, recvbuf):
        return _icoll(self._c_alltoallw(sendbuf, recvbuf))

    # -- Persistent (MPI-4): each Start runs the nonblocking call again -------

    def _coll_init(self, iname, *args):
        self._check()
        istart = getattr(self, iname)
        return Prequest._persistent(lambda: istart(*args)._op)

    def Barrier_init(self, info=None):
        return self._coll_init("Ibarrier")

    def Bcast_init(self, buf, root=0, info=None):
        return self._coll_init("Ibcast", buf, root)

    def Gather_init(self, sendbuf, recvbuf, root=0, info=None):
        return self._coll_init("Igather", sendbuf, recvbuf, root)

    def Gatherv_init(self, sendbuf, recvbuf, root=0, info=None):
        return self._coll_init("Igatherv", sendbuf, recvbuf, root)

    def Scatter_init(self, sendbuf, recvbuf, root=0, info=None):
        return self._coll_init("Iscatter", sendbuf, recvbuf, root)

    def Scatterv_init(self, sendbuf, recvbuf, root=0, info=None):
        return self._coll_init("Iscatterv", sendbuf, recvbuf, root)

    def Allgather_init(self, sendbuf, recvbuf, info=None):
        return self._coll_init("Iallgather", sendbuf, recvbuf)

    def Allgatherv_init(self, sendbuf, recvbuf, info=None):
        return self._coll_init("Iallgatherv", sendbuf, recvbuf)

    def Alltoall_init(self, sendbuf, recvbuf, info=None):
        return self._coll_init("Ialltoall", sendbuf, recvbuf)

    def Alltoallv_init(self, sendbuf, recvbuf, info=None):
        return self._coll_init("Ialltoallv", sendbuf, recvbuf)

    def Alltoallw_init(self, sendbuf, recvbuf, info=None):
        return self._coll_init("Ialltoallw", sendbuf, recvbuf)

    def Reduce_init(self, sendbuf, recvbuf, op=_SUM, root=0, info=None):
        return self._coll_init("Ireduce", sendbuf, recvbuf, _op_arg(op), root)

    def Allreduce_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        return self._coll_init("Iallreduce", sendbuf, recvbuf, _op_arg(op))

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=_SUM, info=None):
        return self._coll_init("Ireduce_scatter_block", sendbuf, recvbuf, _op_arg(op))

    def Reduce_scatter_init(self, sendbuf, recvbuf, recvcounts=None, op=_SUM, info=None):
        return self._coll_init("Ireduce_scatter", sendbuf, recvbuf, recvcounts, _op_arg(op))
