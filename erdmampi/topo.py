"""Process topologies: Topocomm, Cartcomm, Graphcomm, Distgraphcomm.

A topology communicator is an :class:`~erdmampi.comm.Intracomm` that also
keeps its topology (``_topo``): ``("cart", dims, periods)``,
``("graph", index, edges)`` or ``("dist", sources, sourceweights,
destinations, destweights, weighted)``.  Ranks are never reordered (as
MPICH).  Neighbourhood collectives send each block straight to its
neighbour over the collective context (:mod:`erdmampi._p2pcoll`); on a
Cartesian grid the tag says the direction, so the two neighbours of a
periodic dimension of size 1 or 2 (one process twice) stay apart.
"""

import operator

from . import _p2pcoll as _px
from ._commrt import PROC_NULL, UNDEFINED, _icoll, _message_vector_bytes, _u8_of, message_cco
from .comm import Comm, Intracomm
from .exceptions import ERR_ARG, ERR_RANK, raise_error
from .group import Group
from .intracomm_topo import CART, DIST_GRAPH, GRAPH, _checked
from .request import Prequest

# -----------------------------------------------------------------------------
# Topology communicators


class Topocomm(Intracomm):
    """Topology intracommunicator, as ``MPI.Topocomm``."""

    _topo = None
    _kinds = ("cart", "graph", "dist")
    _expect = "expecting a topology communicator"

    def _construct(self, comm=None):
        if (isinstance(comm, Comm) and comm._ranks is not None
                and (comm._topo if isinstance(comm, Topocomm) else (None,))[0]
                not in self._kinds):
            raise TypeError(self._expect)
        super()._construct(comm)

    def _share(self, comm):
        super()._share(comm)
        self._topo = getattr(comm, "_topo", None)

    def Dup(self, info=None):
        """Duplicate the communicator, its topology included."""
        c = super().Dup(info)
        c._topo = self._topo
        return c

    def Get_topology(self):
        """The type of topology attached (`CART`, `GRAPH` or `DIST_GRAPH`)."""
        self._check()
        return {"cart": CART, "graph": GRAPH, "dist": DIST_GRAPH}[self._topo[0]]

    # -- Neighbours -----------------------------------------------------------

    def _edges(self):
        """The neighbors ``(in, out)``: lists of (rank or PROC_NULL, tag)."""
        kind = self._topo[0]
        if kind == "cart":
            ins, outs = [], []
            for d in range(len(self._topo[1])):
                src, dst = self.Shift(d, 1)
                ins += [(src, 2 * d + 1), (dst, 2 * d)]
                outs += [(src, 2 * d), (dst, 2 * d + 1)]
            return ins, outs
        if kind == "graph":
            n = [(r, 0) for r in self.Get_neighbors(self._rank)]
            return n, n
        return [(r, 0) for r in self._topo[1]], [(r, 0) for r in self._topo[3]]

    @property
    def degrees(self):
        ins, outs = self._edges()
        return (len(ins), len(outs))

    @property
    def indegree(self):
        return self.degrees[0]

    @property
    def outdegree(self):
        return self.degrees[1]

    @property
    def inoutedges(self):
        ins, outs = self._edges()
        return ([r for r, _ in ins], [r for r, _ in outs])

    @property
    def inedges(self):
        return self.inoutedges[0]

    @property
    def outedges(self):
        return self.inoutedges[1]

    # -- Neighbourhood collectives: buffers -----------------------------------

    def _nrun(self, sends, recvs, rmsgs):
        """A callable running one neighbourhood exchange (see _p2pcoll.exchange)."""
        t = _px.transport(self, self._ranks)
        sends = [(r, b, tag) for r, b, tag in sends if r != PROC_NULL]
        recvs = [(r, b, tag) for r, b, tag in recvs if r != PROC_NULL]

        def run():
            _px.exchange(t, sends, recvs)
            for m in rmsgs:
                if m is not None:
                    m.finish()
        return run

    def _c_nallgather(self, sendbuf, recvbuf):
        self._check()
        ins, outs = self._edges()
        smsg = message_cco(sendbuf, True, 1)
        rmsg = message_cco(recvbuf, False, len(ins))
        blk = rmsg.nbytes // max(len(ins), 1)
        if ins and smsg.nbytes != blk:
            raise ValueError(f"mismatch in send count {smsg.count} and receive "
                             f"count {rmsg.count}")
        rb = _u8_of(rmsg)
        sb = _u8_of(smsg)
        return self._nrun([(r, sb, tag) for r, tag in outs],
                          [(r, rb[i * blk:(i + 1) * blk], tag) for i, (r, tag) in enumerate(ins)],
                          [rmsg])

    def _c_nallgatherv(self, sendbuf, recvbuf):
        self._check()
        ins, outs = self._edges()
        smsg = message_cco(sendbuf, True, 1)
        rmsg, _, counts, displs = _message_vector_bytes(recvbuf, False, len(ins))
        sb = _u8_of(smsg)
        rbl = _px.blocks(_u8_of(rmsg), counts, displs)
        return self._nrun([(r, sb, tag) for r, tag in outs],
                          [(r, rbl[i], tag) for i, (r, tag) in enumerate(ins)], [rmsg])

    def _c_nalltoall(self, sendbuf, recvbuf):
        self._check()
        ins, outs = self._edges()
        smsg = message_cco(sendbuf, True, len(outs))
        rmsg = message_cco(recvbuf, False, len(ins))
        sblk = smsg.nbytes // max(len(outs), 1)
        rblk = rmsg.nbytes // max(len(ins), 1)
        if ins and outs and sblk != rblk:
            raise ValueError(f"mismatch in send count {smsg.count} and receive "
                             f"count {rmsg.count}")
        sb, rb = _u8_of(smsg), _u8_of(rmsg)
        return self._nrun([(r, sb[i * sblk:(i + 1) * sblk], tag)
                           for i, (r, tag) in enumerate(outs)],
                          [(r, rb[i * rblk:(i + 1) * rblk], tag)
                           for i, (r, tag) in enumerate(ins)], [rmsg])

    def _c_nalltoallv(self, sendbuf, recvbuf):
        self._check()
        ins, outs = self._edges()
        smsg, _, sc, sd = _message_vector_bytes(sendbuf, True, len(outs))
        rmsg, _, rc, rd = _message_vector_bytes(recvbuf, False, len(ins))
        sbl = _px.blocks(_u8_of(smsg), sc, sd)
        rbl = _px.blocks(_u8_of(rmsg), rc, rd)
        return self._nrun([(r, sbl[i], tag) for i, (r, tag) in enumerate(outs)],
                          [(r, rbl[i], tag) for i, (r, tag) in enumerate(ins)], [rmsg])

    def _c_nalltoallw(self, sendbuf, recvbuf):
        self._check()
        ins, outs = self._edges()
        sbl, _ = _px.message_w(sendbuf, True, len(outs))
        rbl, rraw = _px.message_w(recvbuf, False, len(ins))
        run = self._nrun([(r, sbl[i], tag) for i, (r, tag) in enumerate(outs)],
                         [(r, rbl[i], tag) for i, (r, tag) in enumerate(ins)], [])

        def runw():
            run()
            _px.finish_raw(rraw)
        return runw

    def Neighbor_allgather(self, sendbuf, recvbuf):
        """Gather a block from each in-neighbor; send the same block to each out-neighbor."""
        self._c_nallgather(sendbuf, recvbuf)()

    def Neighbor_allgatherv(self, sendbuf, recvbuf):
        """Neighbor allgather with counts and displacements of the receive buffer."""
        self._c_nallgatherv(sendbuf, recvbuf)()

    def Neighbor_alltoall(self, sendbuf, recvbuf):
        """Send a distinct block to each out-neighbor, receive one from each in-neighbor."""
        self._c_nalltoall(sendbuf, recvbuf)()

    def Neighbor_alltoallv(self, sendbuf, recvbuf):
        """Neighbor all-to-all with counts and displacements."""
        self._c_nalltoallv(sendbuf, recvbuf)()

    def Neighbor_alltoallw(self, sendbuf, recvbuf):
        """Neighbor all-to-all with counts, displacements and datatypes."""
        self._c_nalltoallw(sendbuf, recvbuf)()

    def Ineighbor_allgather(self, sendbuf, recvbuf):
        """Nonblocking `Neighbor_allgather`; returns a `Request`."""
        return _icoll(self._c_nallgather(sendbuf, recvbuf))

    def Ineighbor_allgatherv(self, sendbuf, recvbuf):
        """Nonblocking `Neighbor_allgatherv`; returns a `Request`."""
        return _icoll(self._c_nallgatherv(sendbuf, recvbuf))

    def Ineighbor_alltoall(self, sendbuf, recvbuf):
        """Nonblocking `Neighbor_alltoall`; returns a `Request`."""
        return _icoll(self._c_nalltoall(sendbuf, recvbuf))

    def Ineighbor_alltoallv(self, sendbuf, recvbuf):
        """Nonblocking `Neighbor_alltoallv`; returns a `Request`."""
        return _icoll(self._c_nalltoallv(sendbuf, recvbuf))

    def Ineighbor_alltoallw(self, sendbuf, recvbuf):
        """Nonblocking `Neighbor_alltoallw`; returns a `Request`."""
        return _icoll(self._c_nalltoallw(sendbuf, recvbuf))

    # persistent: each Start runs the exchange again (a new collective call)

    def _persistent(self, build, sendbuf, recvbuf):
        build(sendbuf, recvbuf)    # argument errors at init time, as MPI
        return Prequest._persistent(lambda: _icoll(build(sendbuf, recvbuf))._op)

    def Neighbor_allgather_init(self, sendbuf, recvbuf, info=None):
        """Persistent `Neighbor_allgather`; returns a `Prequest`."""
        return self._persistent(self._c_nallgather, sendbuf, recvbuf)

    def Neighbor_allgatherv_init(self, sendbuf, recvbuf, info=None):
        """Persistent `Neighbor_allgatherv`; returns a `Prequest`."""
        return self._persistent(self._c_nallgatherv, sendbuf, recvbuf)

    def Neighbor_alltoall_init(self, sendbuf, recvbuf, info=None):
        """Persistent `Neighbor_alltoall`; returns a `Prequest`."""
        return self._persistent(self._c_nalltoall, sendbuf, recvbuf)

    def Neighbor_alltoallv_init(self, sendbuf, recvbuf, info=None):
        """Persistent `Neighbor_alltoallv`; returns a `Prequest`."""
        return self._persistent(self._c_nalltoallv, sendbuf, recvbuf)

    def Neighbor_alltoallw_init(self, sendbuf, recvbuf, info=None):
        """Persistent `Neighbor_alltoallw`; returns a `Prequest`."""
        return self._persistent(self._c_nalltoallw, sendbuf, recvbuf)

    # -- Neighbourhood collectives: Python objects ----------------------------

    def neighbor_allgather(self, sendobj):
        """Send a Python object to each out-neighbor; returns the list of the in-neighbors'."""
        self._check()
        ins, outs = self._edges()
        t = _px.transport(self, self._ranks)
        t._pkl = self._pkl
        data = self._pkl._encode(sendobj)
        got = _px.exchange_obj(t, [(r, data, tag) for r, tag in outs if r != PROC_NULL],
                               [(r, tag) for r, tag in ins if r != PROC_NULL])
        it = iter(got)
        return [None if r == PROC_NULL else next(it) for r, _ in ins]

    def neighbor_alltoall(self, sendobj):
        """Send item j of ``sendobj`` to out-neighbor j; returns the in-neighbors' items."""
        self._check()
        ins, outs = self._edges()
        sendobj = list(sendobj) if sendobj is not None else [None] * len(outs)
        if len(sendobj) != len(outs):
            raise ValueError(f"expecting {len(outs)} items, got {len(sendobj)}")
        t = _px.transport(self, self._ranks)
        t._pkl = self._pkl
        got = _px.exchange_obj(t, [(r, self._pkl._encode(o), tag)
                                   for (r, tag), o in zip(outs, sendobj) if r != PROC_NULL],
                               [(r, tag) for r, tag in ins if r != PROC_NULL])
        it = iter(got)
        return [None if r == PROC_NULL else next(it) for r, _ in ins]


class Cartcomm(Topocomm):
    """Cartesian topology intracommunicator, as ``MPI.Cartcomm``."""

    _kinds = ("cart",)
    _expect = "expecting a Cartesian communicator"

    def Get_dim(self):
        """The number of dimensions of the grid."""
        self._check()
        return len(self._topo[1])

    dim = property(Get_dim)
    ndim = property(Get_dim)

    def Get_topo(self):
        """The grid: (dims, periods, coordinates of this process)."""
        self._check()
        return (list(self._topo[1]), list(self._topo[2]), self.Get_coords(self._rank))

    topo = property(Get_topo)
    dims = property(lambda self: self.Get_topo()[0])
    periods = property(lambda self: self.Get_topo()[1])
    coords = property(lambda self: self.Get_topo()[2])

    def Get_cart_rank(self, coords):
        """The rank of the process at the given coordinates."""
        self._check()
        dims, periods = self._topo[1], self._topo[2]
        coords = _checked(coords, len(dims))
        rank = 0
        for c, d, p in zip(coords, dims, periods):
            if p:
                c %= d
            elif c < 0 or c >= d:
                raise_error(ERR_ARG, f"Cartesian coordinate {c} is out of range "
                                     f"(dimension {d}, not periodic)")
            rank = rank * d + c
        return rank

    def Get_coords(self, rank):
        """The coordinates of the process of rank ``rank``."""
        ranks = self._check()
        rank = operator.index(rank)
        if rank < 0 or rank >= len(ranks):
            raise_error(ERR_RANK, f"Invalid rank has value {rank} but must be nonnegative "
                                  f"and less than {len(ranks)}")
        coords = []
        for d in reversed(self._topo[1]):
            coords.append(rank % d)
            rank //= d
        return coords[::-1]

    def Shift(self, direction, disp):
        """The (source, dest) ranks of a shift by ``disp`` along ``direction``."""
        self._check()
        dims, periods = self._topo[1], self._topo[2]
        direction, disp = operator.index(direction), operator.index(disp)
        if direction < 0 or direction >= len(dims):
            raise_error(ERR_ARG, f"invalid direction {direction} "
                                 f"(number of dimensions {len(dims)})")
        me = self.Get_coords(self._rank)

        def at(delta):
            c = list(me)
            c[direction] += delta
            if not periods[direction] and not 0 <= c[direction] < dims[direction]:
                return PROC_NULL
            return self.Get_cart_rank(c)
        return (at(-disp), at(disp))

    def Sub(self, remain_dims):
        """The lower-dimensional grids keeping the dimensions ``remain_dims`` marks."""
        self._check()
        dims, periods = self._topo[1], self._topo[2]
        keep = [bool(x) for x in _checked(remain_dims, len(dims))]
        me = self.Get_coords(self._rank)
        color = 0
        key = 0
        for c, d, k in zip(me, dims, keep):
            if k:
                key = key * d + c
            else:
                color = color * d + c
        if not any(keep):
            color = 0 if self._rank == 0 else UNDEFINED   # MPICH: one 0-d grid, at rank 0
        sub = self.Split(color, key)
        if sub._ranks is None:
            return Cartcomm()
        c = Cartcomm._from_group(Group._from_ranks(sub._ranks), sub._ctx)
        c._topo = ("cart", [d for d, k in zip(dims, keep) if k],
                   [p for p, k in zip(periods, keep) if k])
        return c

    def Map(self, dims, periods=None):
        """The rank this process would have in a grid of ``dims`` (as `Intracomm.Cart_map`)."""
        return self.Cart_map(dims, periods)


class Graphcomm(Topocomm):
    """General graph topology intracommunicator, as ``MPI.Graphcomm``."""

    _kinds = ("graph",)
    _expect = "expecting a general graph communicator"

    def Get_dims(self):
        """The (number of nodes, number of edges) of the graph."""
        self._check()
        return (len(self._topo[1]), len(self._topo[2]))

    dims = property(Get_dims)
    nnodes = property(lambda self: self.Get_dims()[0])
    nedges = property(lambda self: self.Get_dims()[1])

    def Get_topo(self):
        """The (index, edges) of the graph."""
        self._check()
        return (list(self._topo[1]), list(self._topo[2]))

    topo = property(Get_topo)
    index = property(lambda self: self.Get_topo()[0])
    edges = property(lambda self: self.Get_topo()[1])

    def Get_neighbors(self, rank):
        """The neighbors of the process of rank ``rank``."""
        self._check()
        index, edges = self._topo[1], self._topo[2]
        rank = operator.index(rank)
        if rank < 0 or rank >= len(index):
            raise_error(ERR_RANK, f"Invalid rank has value {rank} but must be nonnegative "
                                  f"and less than {len(index)}")
        return edges[index[rank - 1] if rank else 0:index[rank]]

    def Get_neighbors_count(self, rank):
        """The number of neighbors of the process of rank ``rank``."""
        return len(self.Get_neighbors(rank))

    neighbors = property(lambda self: self.Get_neighbors(self.Get_rank()))
    nneighbors = property(lambda self: self.Get_neighbors_count(self.Get_rank()))

    def Map(self, index, edges):
        """The rank this process would have in the graph (as `Intracomm.Graph_map`)."""
        return self.Graph_map(index, edges)


class Distgraphcomm(Topocomm):
    """Distributed graph topology intracommunicator, as ``MPI.Distgraphcomm``."""

    _kinds = ("dist",)
    _expect = "expecting a distributed graph communicator"

    def Get_dist_neighbors_count(self):
        """The (in-degree, out-degree, weighted) of this process."""
        self._check()
        t = self._topo
        return (len(t[1]), len(t[3]), t[5])

    def Get_dist_neighbors(self):
        """The (sources, destinations, weights) of this process (weights: None if unweighted)."""
        self._check()
        t = self._topo
        return (list(t[1]), list(t[3]), (list(t[2]), list(t[4])) if t[5] else None)

