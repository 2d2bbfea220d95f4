"""Intracomm's topology constructors (a mixin of :class:`~erdmampi.comm.Intracomm`).

Create_cart, Create_graph, Create_dist_graph(_adjacent), Cart_map and
Graph_map check their arguments as mpi4py + MPICH do, agree on a context id
(``Comm._agree_ctx``) and build the communicators of :mod:`erdmampi.topo`
(imported when called: that module builds on ``Intracomm``, which this
mixin is part of).  Ranks are never reordered, as MPICH.
"""

import operator

from ._commrt import UNDEFINED
from .exceptions import ERR_ARG, ERR_TOPOLOGY, raise_error
from .group import Group

GRAPH = 1
CART = 2
DIST_GRAPH = 3

# MPI_UNWEIGHTED / MPI_WEIGHTS_EMPTY: special addresses, told apart by identity
UNWEIGHTED = 139879356434676
WEIGHTS_EMPTY = 139879356434672


def _ints(seq):
    return [operator.index(x) for x in seq]


def _checked(seq, n):
    """mpi4py's chkarray: exactly ``n`` integers."""
    values = _ints(seq)
    if len(values) != n:
        raise ValueError(f"expecting {n} items, got {len(values)}")
    return values


def _periods(periods, ndims):
    if periods is None:
        periods = False
    if isinstance(periods, bool):
        periods = [periods] * ndims
    return [1 if p else 0 for p in _checked(periods, ndims)]


def _cart_args(size, dims, periods):
    dims = _ints(dims)
    periods = _periods(periods, len(dims))
    nnodes = 1
    for d in dims:
        nnodes *= d
    if any(d <= 0 for d in dims):
        nnodes = 0      # MPICH: no process is in such a grid (no error)
    if nnodes > size:
        raise_error(ERR_ARG, f"Size of the communicator ({size}) is smaller than the "
                             f"size of the Cartesian topology ({nnodes})")
    return dims, periods, nnodes


def _graph_args(size, index, edges):
    index, edges = _ints(index), _ints(edges)
    # mpi4py's extension: a leading 0 ("standard" adjacency arrays) is dropped
    if index and index[0] == 0 and index[-1] == len(edges):
        index = index[1:]
    nnodes = len(index)
    if nnodes > size:
        raise_error(ERR_ARG, f"number of nodes {nnodes} exceeds the communicator size {size}")
    prev = 0
    for i in index:
        if i < prev:
            raise_error(ERR_ARG, "index must be nondecreasing")
        prev = i
    for i, e in enumerate(edges):
        if e < 0 or e >= nnodes:
            raise_error(ERR_ARG, f"Edge index edges[{i}] is {e} but must be nonnegative "
                                 f"and less than {nnodes}")
    return index, edges, nnodes


def _weights(weights, degree):
    """None (unweighted) or a list of ``degree`` weights (mpi4py's asarray_weights)."""
    if weights is None or weights is UNWEIGHTED:
        return None
    if weights is WEIGHTS_EMPTY:
        if degree > 0:
            raise ValueError("empty weights but nonzero degree")
        return []
    return _checked(weights, degree)


def _new_topo(kind, ctx, ranks, topo):
    """A ``kind`` communicator over ``ranks`` (None: the null one of that type,
    as mpi4py returns to processes left out)."""
    from . import topo as _topo
    cls = getattr(_topo, kind)
    if ranks is None:
        return cls()
    c = cls._from_group(Group._from_ranks(ranks), ctx)
    c._topo = topo
    return c


class IntracommTopo:
    """Intracomm's topology constructors (mixed into Intracomm)."""

    __slots__ = ()

    def Create_cart(self, dims, periods=None, reorder=False):
        """Cartesian communicator of ``prod(dims)`` processes (others: a null one)."""
        ranks = self._check()
        dims, periods, nnodes = _cart_args(len(ranks), dims, periods)
        ctx = self._agree_ctx()
        if self._rank >= nnodes:
            return _new_topo("Cartcomm", ctx, None, None)
        return _new_topo("Cartcomm", ctx, ranks[:nnodes], ("cart", dims, periods))

    def Create_graph(self, index, edges, reorder=False):
        """Graph communicator of ``len(index)`` processes (others: a null one)."""
        ranks = self._check()
        index, edges, nnodes = _graph_args(len(ranks), index, edges)
        ctx = self._agree_ctx()
        if self._rank >= nnodes:
            return _new_topo("Graphcomm", ctx, None, None)
        return _new_topo("Graphcomm", ctx, ranks[:nnodes], ("graph", index, edges))

    def Create_dist_graph_adjacent(self, sources, destinations, sourceweights=None,
                                   destweights=None, info=None, reorder=False):
        """Distributed graph communicator from each process's own neighbours."""
        ranks = self._check()
        src = [] if sources is None else _ints(sources)
        dst = [] if destinations is None else _ints(destinations)
        sw = _weights(sourceweights, len(src))
        dw = _weights(destweights, len(dst))
        if (sw is None) != (dw is None):
            raise_error(ERR_TOPOLOGY, "Must specify MPI_UNWEIGHTED for both or neither "
                                      "weight arguments")
        ctx = self._agree_ctx()
        return _new_topo("Distgraphcomm", ctx, ranks, _dist(src, sw, dst, dw))

    def Create_dist_graph(self, sources, degrees, destinations, weights=None, info=None,
                          reorder=False):
        """Distributed graph communicator from any process's share of the edges."""
        ranks = self._check()
        sources = _ints(sources)
        degrees = _checked(degrees, len(sources))
        ne = sum(degrees)
        destinations = _checked(destinations, ne)
        w = _weights(weights, ne)
        edges, k = [], 0
        for s, deg in zip(sources, degrees):
            for _ in range(deg):
                edges.append((s, destinations[k], 1 if not w else w[k]))
                k += 1
        table = self.allgather((edges, w is not None))
        me = self._rank
        weighted = any(t[1] for t in table)
        src, sw, dst, dw = [], [], [], []
        for part, _ in table:
            for s, d, wt in part:
                if s == me:
                    dst.append(d)
                    dw.append(wt)
                if d == me:
                    src.append(s)
                    sw.append(wt)
        ctx = self._agree_ctx()
        topo = _dist(src, sw if weighted else None, dst, dw if weighted else None)
        return _new_topo("Distgraphcomm", ctx, ranks, topo)

    def Cart_map(self, dims, periods=None):
        """This process's rank in a Cartesian grid (UNDEFINED if it is left out)."""
        ranks = self._check()
        dims, periods, nnodes = _cart_args(len(ranks), dims, periods)
        return self._rank if self._rank < nnodes else UNDEFINED

    def Graph_map(self, index, edges):
        """This process's rank in a graph (UNDEFINED if it is left out)."""
        ranks = self._check()
        index, edges, nnodes = _graph_args(len(ranks), index, edges)
        return self._rank if self._rank < nnodes else UNDEFINED


def _dist(src, sw, dst, dw):
    weighted = sw is not None or dw is not None
    if weighted:
        sw = [1] * len(src) if sw is None else sw
        dw = [1] * len(dst) if dw is None else dw
    return ("dist", src, sw, dst, dw, weighted)


