"""Inter-communicators: ``MPI.Intercomm``.

An inter-communicator joins a local group (``_ranks``, ``_rank``: sizes and
ranks are local) and a remote group (``_rgroup``).  Point-to-point ranks
index the remote group.  It owns two context-id pairs, agreed by both
groups: ``ctx``/``ctx + 1`` for its messages between the groups, and
``ctx + 2``/``ctx + 3`` for ``_local``, an intra-communicator over the local
group for the local steps of constructors.

Collectives follow MPI's inter-communicator rules (rooted ones: ROOT at the
root, PROC_NULL at the rest of its group, the root's rank at the other
group) and move every block straight between the two processes concerned
(:mod:`erdmampi._p2pcoll`); reductions combine the remote group's
contributions in rank order.
"""

import numpy as np

from . import _p2pcoll as _px
from ._commrt import (PROC_NULL, ROOT, UNDEFINED, _COLL_TAGS, _CollTransport,
                      _GROUP_TAG_BASE, _check_op, _icoll, _message_vector_bytes,
                      _op_arg, _py_op, _reduce_fn, _rt, _sum, _u8, _u8_of, coll, message_cco)
from ._commrt import _SUM
from .comm import COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED, \
    COMM_WORLD, Comm, Intracomm
from .exceptions import ERR_ARG, ERR_RANK, ERR_ROOT, raise_error
from .group import Group
from .op import MAX

_CTX_STEP = 4               # context ids an inter-communicator takes (see above)
_FROM_GROUPS_BASE = _GROUP_TAG_BASE + (1 << 27)   # Create_from_groups, COMM_WORLD p2p ctx


def _new_intercomm(local_ranks, remote_ranks, ctx, low):
    """The inter-communicator on context ids ``ctx .. ctx + 3`` (every member
    of both groups passes the same ``ctx``)."""
    with _rt.lock:
        _rt.next_ctx = max(_rt.next_ctx, ctx + _CTX_STEP)
    c = Intercomm()
    c._setup(Group._from_ranks(local_ranks), ctx)
    c._rgroup = Group._from_ranks(remote_ranks)
    c._tell_members(c._rgroup._ranks)   # receives match the remote group
    c._local = Intracomm._from_group(Group._from_ranks(local_ranks), ctx + 2)
    c._low = low
    return c


class Intercomm(Comm):
    """Inter-communicator, as ``MPI.Intercomm``."""

    _rgroup = None
    _local = None
    _low = True

    def _construct(self, comm=None):
        if isinstance(comm, Comm) and comm._ranks is not None and not isinstance(comm, Intercomm):
            raise TypeError("expecting an intercommunicator")
        super()._construct(comm)

    def _share(self, comm):
        super()._share(comm)
        self._rgroup, self._local, self._low = comm._rgroup, comm._local, comm._low

    # -- Ranks name the remote group --------------------------------------------

    def _remote(self):
        self._check()
        return self._rgroup._ranks

    def _peers(self):
        return self._remote(), "remote group size"

    def _comm_rank(self, world):
        if world < 0:
            return world
        return self._rgroup._index.get(world, UNDEFINED)

    # the one-call paths translate ranks through the local group: not here
    def _fast_state(self):
        return None

    def _send_more(self, r, buf, dest, tag):
        self._send(buf, dest, tag, False)

    def _recv_more(self, buf, source, tag, status):
        self._recv(buf, source, tag, status)

    # -- Accessors ----------------------------------------------------------------

    def Is_inter(self):
        """Whether this is an inter-communicator (True)."""
        self._check()
        return True

    def Is_intra(self):
        """Whether this is an intra-communicator (False)."""
        self._check()
        return False

    def Get_remote_group(self):
        """The group of the remote processes."""
        return Group._from_ranks(self._remote())

    def Get_remote_size(self):
        """The number of remote processes."""
        return len(self._remote())

    @property
    def remote_group(self):
        return self.Get_remote_group()

    @property
    def remote_size(self):
        return self.Get_remote_size()

    # -- Constructors -------------------------------------------------------------

    def _swap(self, obj):
        """Leaders exchange ``obj`` over the inter-communicator.

        Every member gets the remote leader's.
        """
        t = _px.transport(self, self._remote())
        t._pkl = self._pkl
        got = None
        if self._rank == 0:
            got = _px.exchange_obj(t, [(0, self._pkl._encode(obj), 0)], [(0, 0)])[0]
        return self._local.bcast(got, 0)

    def _propose(self):
        return self._local.allreduce(_rt.next_ctx, op=MAX)

    def Dup(self, info=None):
        """Duplicate the inter-communicator: same groups, a new context."""
        self._check()
        mine = self._propose()
        ctx = max(mine, self._swap(mine))
        c = _new_intercomm(self._ranks, self._remote(), ctx, self._low)
        c._attrs = dict(self._attrs)
        if info is not None:
            c.Set_info(info)
        return c

    Clone = Dup
    Dup_with_info = Dup

    def Split(self, color=0, key=0):
        """Split both groups by ``color``.

        A process is paired with the remote processes of its color (a null
        communicator: none there, or UNDEFINED).
        """
        self._check()
        color, key = int(color), int(key)
        table = self._local.allgather((color, key))
        mine = (table, self._propose())
        theirs = self._swap(mine)
        ctx = max(mine[1], theirs[1])

        def members(table, ranks):
            sel = sorted((k, r) for r, (c, k) in enumerate(table) if c == color)
            return [ranks[r] for _, r in sel]
        remote = members(theirs[0], self._remote())
        if color == UNDEFINED or not remote:
            with _rt.lock:
                _rt.next_ctx = max(_rt.next_ctx, ctx + _CTX_STEP)
            return Intercomm()      # null, of this type (as mpi4py)
        return _new_intercomm(members(table, self._ranks), remote, ctx, self._low)

    def Split_type(self, split_type, key=0, info=None):
        """Split both groups by type (`COMM_TYPE_SHARED`: by host), as `Split`."""
        self._check()
        split_type = int(split_type)
        if split_type == UNDEFINED:
            return self.Split(UNDEFINED, key)
        if split_type not in (COMM_TYPE_SHARED, COMM_TYPE_HW_GUIDED, COMM_TYPE_HW_UNGUIDED):
            raise_error(ERR_ARG, f"invalid split type {split_type}")
        hosts = _rt.info.get("hosts") or [_rt.info.get("host")] * _rt.engine.size
        ordered = sorted(set(hosts))
        return self.Split(ordered.index(hosts[_rt.engine.rank]), key)

    def Create(self, group):
        """Inter-communicator of ``group`` (a local subgroup) and the remote subgroup.

        The remote processes pass the remote subgroup.
        """
        self._check()
        group._check()
        r = group.Get_rank()
        return self.Split(0 if r != UNDEFINED else UNDEFINED, 0 if r == UNDEFINED else r)

    def Merge(self, high=False):
        """Intra-communicator of both groups, the ``high=False`` group first.

        When both pass the same ``high``: the group whose leader has the lower
        COMM_WORLD rank first.
        """
        self._check()
        high = bool(high)
        mine = (high, self._propose())
        theirs = self._swap(mine)
        ctx = max(mine[1], theirs[1])
        with _rt.lock:
            _rt.next_ctx = max(_rt.next_ctx, ctx + 2)
        first = (not high) if high != theirs[0] else self._low
        ranks = (self._ranks + self._remote()) if first else (self._remote() + self._ranks)
        return Intracomm._from_group(Group._from_ranks(ranks), ctx)

    @classmethod
    def Create_from_groups(cls, local_group, local_leader, remote_group, remote_leader,
                           stringtag="org.mpi4py", info=None, errhandler=None):
        """Inter-communicator of two disjoint groups, with no parent communicator.

        It works over COMM_WORLD's point-to-point context, with tags above
        the user's.
        """
        local_group._check()
        remote_group._check()
        local_leader, remote_leader = int(local_leader), int(remote_leader)
        me = local_group.Get_rank()
        if me == UNDEFINED:
            raise_error(ERR_RANK, "this process is not in local_group")
        if not 0 <= local_leader < local_group.Get_size():
            raise_error(ERR_RANK, f"invalid local leader {local_leader}")
        if not 0 <= remote_leader < remote_group.Get_size():
            raise_error(ERR_RANK, f"invalid remote leader {remote_leader}")
        lranks, rranks = local_group._ranks, remote_group._ranks
        world = COMM_WORLD

        def tr(k, ranks, rank):
            return _CollTransport(world, world._ctx, _FROM_GROUPS_BASE + k * _COLL_TAGS,
                                  ranks=ranks, rank=rank)
        val = np.array([_rt.next_ctx], dtype=np.int64)
        coll.allreduce(tr(0, lranks, me), None, val, lambda a, io: np.maximum(a, io, out=io))
        if me == local_leader:
            other = np.empty(1, dtype=np.int64)
            t = tr(1, (rranks[remote_leader],), 0)
            _px.exchange(t, [(0, _u8(val), 0)], [(0, _u8(other), 0)])
            val = np.maximum(val, other)
        coll.bcast(tr(2, lranks, me), _u8(val), local_leader)
        low = lranks[local_leader] < rranks[remote_leader]
        return _new_intercomm(lranks, rranks, int(val[0]), low)

    # -- Collectives ----------------------------------------------------------------

    def _t(self):
        return _px.transport(self, self._remote())

    def _role(self, root):
        """The role in a rooted collective: "root", "none" (PROC_NULL) or the remote root."""
        self._check()
        root = int(root)
        if root == ROOT:
            return "root"
        if root == PROC_NULL:
            return "none"
        if 0 <= root < len(self._remote()):
            return root
        raise_error(ERR_ROOT, f"invalid root {root} (remote group size "
                              f"{len(self._remote())}, or ROOT/PROC_NULL)")

    @staticmethod
    def _run(t, sends, recvs, rmsg=None, after=None):
        def run():
            _px.exchange(t, sends, recvs)
            if after is not None:
                after()
            if rmsg is not None:
                rmsg.finish()
        return run

    def _c_barrier(self):
        t = self._t()
        n = len(self._remote())
        z = np.empty(0, np.uint8)
        return self._run(t, [(j, z, 0) for j in range(n)],
                         [(j, np.empty(0, np.uint8), 0) for j in range(n)])

    def _c_bcast(self, buf, root):
        role = self._role(root)
        t = self._t()
        if role == "none":
            return self._run(t, [], [])
        if role == "root":
            msg = message_cco(buf, True, 1)
            return self._run(t, [(j, _u8_of(msg), 0) for j in range(len(self._remote()))], [])
        msg = message_cco(buf, False, 1)
        return self._run(t, [], [(role, _u8_of(msg), 0)], msg)

    def _c_gather(self, sendbuf, recvbuf, root, vector=False):
        role = self._role(root)
        t = self._t()
        n = len(self._remote())
        if role == "none":
            return self._run(t, [], [])
        if role == "root":
            if vector:
                rmsg, _, counts, displs = _message_vector_bytes(recvbuf, False, n)
            else:
                rmsg = message_cco(recvbuf, False, n)
                blk = rmsg.nbytes // max(n, 1)
                counts, displs = [blk] * n, [blk * j for j in range(n)]
            bl = _px.blocks(_u8_of(rmsg), counts, displs)
            return self._run(t, [], [(j, bl[j], 0) for j in range(n)], rmsg)
        smsg = message_cco(sendbuf, True, 1)
        return self._run(t, [(role, _u8_of(smsg), 0)], [])

    def _c_scatter(self, sendbuf, recvbuf, root, vector=False):
        role = self._role(root)
        t = self._t()
        n = len(self._remote())
        if role == "none":
            return self._run(t, [], [])
        if role == "root":
            if vector:
                smsg, _, counts, displs = _message_vector_bytes(sendbuf, True, n)
            else:
                smsg = message_cco(sendbuf, True, n)
                blk = smsg.nbytes // max(n, 1)
                counts, displs = [blk] * n, [blk * j for j in range(n)]
            bl = _px.blocks(_u8_of(smsg), counts, displs)
            return self._run(t, [(j, bl[j], 0) for j in range(n)], [])
        rmsg = message_cco(recvbuf, False, 1)
        return self._run(t, [], [(role, _u8_of(rmsg), 0)], rmsg)

    def _c_allgather(self, sendbuf, recvbuf, vector=False):
        self._check()
        t = self._t()
        n = len(self._remote())
        smsg = message_cco(sendbuf, True, 1)
        if vector:
            rmsg, _, counts, displs = _message_vector_bytes(recvbuf, False, n)
        else:
            rmsg = message_cco(recvbuf, False, n)
            blk = rmsg.nbytes // max(n, 1)
            counts, displs = [blk] * n, [blk * j for j in range(n)]
        bl = _px.blocks(_u8_of(rmsg), counts, displs)
        sb = _u8_of(smsg)
        return self._run(t, [(j, sb, 0) for j in range(n)],
                         [(j, bl[j], 0) for j in range(n)], rmsg)

    def _c_alltoall(self, sendbuf, recvbuf, vector=False):
        self._check()
        t = self._t()
        n = len(self._remote())
        if vector:
            smsg, _, sc, sd = _message_vector_bytes(sendbuf, True, n)
            rmsg, _, rc, rd = _message_vector_bytes(recvbuf, False, n)
        else:
            smsg = message_cco(sendbuf, True, n)
            rmsg = message_cco(recvbuf, False, n)
            sb, rb = smsg.nbytes // max(n, 1), rmsg.nbytes // max(n, 1)
            sc, sd = [sb] * n, [sb * j for j in range(n)]
            rc, rd = [rb] * n, [rb * j for j in range(n)]
        sbl = _px.blocks(_u8_of(smsg), sc, sd)
        rbl = _px.blocks(_u8_of(rmsg), rc, rd)
        return self._run(t, [(j, sbl[j], 0) for j in range(n)],
                         [(j, rbl[j], 0) for j in range(n)], rmsg)

    def _c_alltoallw(self, sendbuf, recvbuf):
        self._check()
        t = self._t()
        n = len(self._remote())
        sbl, _ = _px.message_w(sendbuf, True, n)
        rbl, rraw = _px.message_w(recvbuf, False, n)
        return self._run(t, [(j, sbl[j], 0) for j in range(n)],
                         [(j, rbl[j], 0) for j in range(n)], after=lambda: _px.finish_raw(rraw))

    def _reduce_into(self, t, n, arr, op, dt, sources):
        """Reduce into ``arr`` one contribution from each of ``sources``.

        ``sources``: remote ranks, in order; each contribution has the shape
        of ``arr``.
        """
        parts = [np.empty_like(arr) for _ in sources]
        recvs = [(j, _u8(p), 0) for j, p in zip(sources, parts)]
        fn = _reduce_fn(op, dt)

        def combine():
            if not parts:
                return
            acc = parts[-1]
            for p in reversed(parts[:-1]):
                fn(p, acc)          # acc = p op acc: rank order, as MPI
            arr[...] = acc
        return recvs, combine

    def _c_reduce(self, sendbuf, recvbuf, op, root):
        role = self._role(root)
        _check_op(op)
        t = self._t()
        n = len(self._remote())
        if role == "none":
            return self._run(t, [], [])
        if role == "root":
            rmsg = message_cco(recvbuf, False, 1)
            op._check(rmsg.datatype)
            recvs, combine = self._reduce_into(t, n, rmsg.array, op, rmsg.datatype, range(n))
            return self._run(t, [], recvs, rmsg, combine)
        smsg = message_cco(sendbuf, True, 1)
        op._check(smsg.datatype)
        return self._run(t, [(role, _u8_of(smsg), 0)], [])

    def _c_allreduce(self, sendbuf, recvbuf, op):
        self._check()
        _check_op(op)
        t = self._t()
        n = len(self._remote())
        smsg = message_cco(sendbuf, True, 1)
        rmsg = message_cco(recvbuf, False, 1)
        op._check(rmsg.datatype)
        recvs, combine = self._reduce_into(t, n, rmsg.array, op, rmsg.datatype, range(n))
        sb = _u8_of(smsg)
        return self._run(t, [(j, sb, 0) for j in range(n)], recvs, rmsg, combine)

    def _c_reduce_scatter(self, sendbuf, recvbuf, recvcounts, op):
        """Reduce-scatter across the groups, as MPICH does it.

        The remote group's send buffers (each the sum of this group's counts)
        are reduced at this group's rank 0, then scattered here.
        """
        self._check()
        _check_op(op)
        t = self._t()
        n = len(self._remote())
        smsg = message_cco(sendbuf, True, 1)
        rmsg = message_cco(recvbuf, False, 1)
        dt = smsg.datatype
        op._check(dt)
        total = np.empty_like(smsg.array)
        sends = [(0, _u8_of(smsg), 0)]
        recvs, combine = ([], None)
        if self._rank == 0:
            recvs, combine = self._reduce_into(t, n, total, op, dt, range(n))
        local = self._local
        size = len(self._ranks)

        def run():
            _px.exchange(t, sends, recvs)
            if combine is not None:
                combine()
            if recvcounts is None:
                local.Scatter([total, dt] if self._rank == 0 else None, [rmsg.array, dt], 0)
            else:
                counts = [int(c) for c in recvcounts]
                if len(counts) != size:
                    raise ValueError(f"expecting {size} items, got {len(counts)}")
                local.Scatterv([total, (counts, None), dt] if self._rank == 0 else None,
                               [rmsg.array, dt], 0)
            rmsg.finish()
        return run

    def Barrier(self):
        """Barrier over both groups: returns once every process of both has entered."""
        self._c_barrier()()

    def Bcast(self, buf, root=0):
        """Broadcast from ``root`` (`ROOT` in the sending group) to the remote group."""
        self._c_bcast(buf, root)()

    def Gather(self, sendbuf, recvbuf, root=0):
        """Gather to ``root`` (`ROOT` in the receiving group) the buffers of the remote group."""
        self._c_gather(sendbuf, recvbuf, root)()

    def Gatherv(self, sendbuf, recvbuf, root=0):
        """Gather with counts and displacements to ``root`` from the remote group."""
        self._c_gather(sendbuf, recvbuf, root, True)()

    def Scatter(self, sendbuf, recvbuf, root=0):
        """Scatter from ``root`` (`ROOT` in the sending group) to the remote group."""
        self._c_scatter(sendbuf, recvbuf, root)()

    def Scatterv(self, sendbuf, recvbuf, root=0):
        """Scatter with counts and displacements from ``root`` to the remote group."""
        self._c_scatter(sendbuf, recvbuf, root, True)()

    def Allgather(self, sendbuf, recvbuf):
        """Each group receives the buffers of all the processes of the remote group."""
        self._c_allgather(sendbuf, recvbuf)()

    def Allgatherv(self, sendbuf, recvbuf):
        """Allgather with counts and displacements: each group gathers the remote group's."""
        self._c_allgather(sendbuf, recvbuf, True)()

    def Alltoall(self, sendbuf, recvbuf):
        """All-to-all exchange: each process sends one block to each remote process."""
        self._c_alltoall(sendbuf, recvbuf)()

    def Alltoallv(self, sendbuf, recvbuf):
        """All-to-all exchange with counts and displacements, across the groups."""
        self._c_alltoall(sendbuf, recvbuf, True)()

    def Alltoallw(self, sendbuf, recvbuf):
        """All-to-all exchange with counts, displacements and datatypes, across the groups."""
        self._c_alltoallw(sendbuf, recvbuf)()

    def Reduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        """Reduce the remote group's buffers to ``root`` (`ROOT` in the receiving group)."""
        self._c_reduce(sendbuf, recvbuf, _op_arg(op), root)()

    def Allreduce(self, sendbuf, recvbuf, op=_SUM):
        """Each group receives the reduction of the remote group's buffers."""
        self._c_allreduce(sendbuf, recvbuf, _op_arg(op))()

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        """Reduce the remote group's buffers and scatter equal blocks of the result."""
        self._c_reduce_scatter(sendbuf, recvbuf, None, _op_arg(op))()

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        """Reduce the remote group's buffers and scatter blocks of ``recvcounts`` elements."""
        self._c_reduce_scatter(sendbuf, recvbuf, recvcounts, _op_arg(op))()

    def Ibarrier(self):
        """Nonblocking `Barrier` over both groups; returns a `Request`."""
        return _icoll(self._c_barrier())

    def Ibcast(self, buf, root=0):
        """Nonblocking `Bcast` to the remote group; returns a `Request`."""
        return _icoll(self._c_bcast(buf, root))

    def Igather(self, sendbuf, recvbuf, root=0):
        """Nonblocking `Gather` from the remote group; returns a `Request`."""
        return _icoll(self._c_gather(sendbuf, recvbuf, root))

    def Igatherv(self, sendbuf, recvbuf, root=0):
        """Nonblocking `Gatherv` from the remote group; returns a `Request`."""
        return _icoll(self._c_gather(sendbuf, recvbuf, root, True))

    def Iscatter(self, sendbuf, recvbuf, root=0):
        """Nonblocking `Scatter` to the remote group; returns a `Request`."""
        return _icoll(self._c_scatter(sendbuf, recvbuf, root))

    def Iscatterv(self, sendbuf, recvbuf, root=0):
        """Nonblocking `Scatterv` to the remote group; returns a `Request`."""
        return _icoll(self._c_scatter(sendbuf, recvbuf, root, True))

    def Iallgather(self, sendbuf, recvbuf):
        """Nonblocking `Allgather` across the groups; returns a `Request`."""
        return _icoll(self._c_allgather(sendbuf, recvbuf))

    def Iallgatherv(self, sendbuf, recvbuf):
        """Nonblocking `Allgatherv` across the groups; returns a `Request`."""
        return _icoll(self._c_allgather(sendbuf, recvbuf, True))

    def Ialltoall(self, sendbuf, recvbuf):
        """Nonblocking `Alltoall` across the groups; returns a `Request`."""
        return _icoll(self._c_alltoall(sendbuf, recvbuf))

    def Ialltoallv(self, sendbuf, recvbuf):
        """Nonblocking `Alltoallv` across the groups; returns a `Request`."""
        return _icoll(self._c_alltoall(sendbuf, recvbuf, True))

    def Ialltoallw(self, sendbuf, recvbuf):
        """Nonblocking `Alltoallw` across the groups; returns a `Request`."""
        return _icoll(self._c_alltoallw(sendbuf, recvbuf))

    def Ireduce(self, sendbuf, recvbuf, op=_SUM, root=0):
        """Nonblocking `Reduce` of the remote group's buffers; returns a `Request`."""
        return _icoll(self._c_reduce(sendbuf, recvbuf, _op_arg(op), root))

    def Iallreduce(self, sendbuf, recvbuf, op=_SUM):
        """Nonblocking `Allreduce` across the groups; returns a `Request`."""
        return _icoll(self._c_allreduce(sendbuf, recvbuf, _op_arg(op)))

    def Ireduce_scatter_block(self, sendbuf, recvbuf, op=_SUM):
        """Nonblocking `Reduce_scatter_block` across the groups; returns a `Request`."""
        return _icoll(self._c_reduce_scatter(sendbuf, recvbuf, None, _op_arg(op)))

    def Ireduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=_SUM):
        """Nonblocking `Reduce_scatter` across the groups; returns a `Request`."""
        return _icoll(self._c_reduce_scatter(sendbuf, recvbuf, recvcounts, _op_arg(op)))

    # -- Collectives: Python objects ---------------------------------------------------

    def _objx(self, sends, sources):
        t = self._t()
        t._pkl = self._pkl
        enc = self._pkl._encode
        return _px.exchange_obj(t, [(j, enc(o), 0) for j, o in sends],
                                [(j, 0) for j in sources])

    def barrier(self):
        """Barrier over both groups."""
        self.Barrier()

    def bcast(self, obj, root=0):
        """Broadcast a Python object from ``root`` to the remote group."""
        role = self._role(root)
        n = len(self._remote())
        if role == "none":
            self._objx([], [])
            return None
        if role == "root":
            self._objx([(j, obj) for j in range(n)], [])
            return None
        return self._objx([], [role])[0]

    def gather(self, sendobj, root=0):
        """Gather to ``root`` the Python objects of the remote group (a list)."""
        role = self._role(root)
        if role == "none":
            self._objx([], [])
            return None
        if role == "root":
            return self._objx([], range(len(self._remote())))
        self._objx([(role, sendobj)], [])
        return None

    def scatter(self, sendobj, root=0):
        """Scatter a sequence of Python objects from ``root`` to the remote group."""
        role = self._role(root)
        n = len(self._remote())
        if role == "none":
            self._objx([], [])
            return None
        if role == "root":
            items = list(sendobj) if sendobj is not None else [None] * n
            if len(items) != n:
                raise ValueError(f"expecting {n} items, got {len(items)}")
            self._objx(list(enumerate(items)), [])
            return None
        return self._objx([], [role])[0]

    def allgather(self, sendobj):
        """Each process receives the list of the remote group's Python objects."""
        self._check()
        n = len(self._remote())
        return self._objx([(j, sendobj) for j in range(n)], range(n))

    def alltoall(self, sendobj):
        """Send item j of ``sendobj`` to remote process j; returns the items received."""
        self._check()
        n = len(self._remote())
        items = list(sendobj) if sendobj is not None else [None] * n
        if len(items) != n:
            raise ValueError(f"expecting {n} items, got {len(items)}")
        return self._objx(list(enumerate(items)), range(n))

    def reduce(self, sendobj, op=None, root=0):
        """Reduce the remote group's Python objects to ``root`` (default op: sum)."""
        role = self._role(root)
        fn = _py_op(_sum(op))
        if role == "none":
            self._objx([], [])
            return None
        if role == "root":
            return _fold(fn, self._objx([], range(len(self._remote()))))
        self._objx([(role, sendobj)], [])
        return None

    def allreduce(self, sendobj, op=None):
        """Each process receives the reduction of the remote group's Python objects."""
        self._check()
        fn = _py_op(_sum(op))
        n = len(self._remote())
        return _fold(fn, self._objx([(j, sendobj) for j in range(n)], range(n)))


def _fold(fn, items):
    """``items[0] op items[1] op ...`` in rank order."""
    if not items:
        return None
    acc = items[0]
    for x in items[1:]:
        acc = fn(acc, x)
    return acc
