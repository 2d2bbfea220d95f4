"""Collective algorithms as free functions over a :class:`~.base.Transport`.

Every collective has a dispatcher here (``bcast(t, buf, root)``,
``allreduce(t, sendbuf, recvbuf, reduce_fn, commutative)``, ...) that picks
an algorithm from :data:`ALGORITHMS` with :func:`select`, and the concrete
algorithms live in the submodules (``bcast.bcast_binomial`` ...).  Each
dispatcher also takes ``algorithm=`` to force one.

Selection (``n`` = ranks, ``N`` = bytes of the vector; every rank must pick
the same algorithm, so rules use only values all ranks know):

=============== ========================================================
collective      default choice
=============== ========================================================
barrier         dissemination
bcast           sched_pieces if n == 2 on two hosts and N >= S
                (:mod:`erdmampi.collectives.wan`); else
                hierarchical if the ranks span several hosts (H); else
                sched_chain if N >= S and n > 2; sched_pair if
                n == 2 and N >= max(S, 4 MiB) (both copy a share);
                else binomial if N <= 512 KiB or
                n <= 2, else scatter_allgather (van de Geijn);
                ``pipeline`` (segmented chain) on request
reduce          binomial (rank-ordered tree for non-commutative ops)
allreduce       sched_exchange if n == 2 on two hosts, sched_direct if
                3 <= n <= 8 each on its own host, when N >= S and the op
                commutes (:mod:`erdmampi.collectives.wan`); else
                hierarchical if H and the op commutes; else
                recursive_doubling if N <= 64 KiB or count < n; else
                reduce_bcast for non-commutative ops above 512 KiB;
                sched_pair if n == 2 and N < 256 MiB;
                else sched_slices if N >= S and n >= 3 (one host: each
                rank reduces a slice out of the others' buffers; the
                ring where CMA cannot be used), sched_ring if N >= S;
                else rabenseifner if n is a power of two, ring otherwise
reduce_scatter  sched_pair if n == 2 and N >= S (commutative; equal
                blocks, else sched_ring); sched_slices if N >= S and
                n >= 3 (commutative; equal blocks read out of every
                rank's input on one host, else sched_ring); else ring
                (commutative), reduce_scatterv (non-commutative)
gather,         binomial if n >= 4 and the whole vector is <= 256 KiB,
scatter         else linear (equal blocks, the size known on every rank)
gatherv         linear
scatterv        linear
allgatherv      sched_direct if 2 <= n <= 8 each on its own host and
                N >= S (:mod:`erdmampi.collectives.wan`); else
                N >= S: sched_ring; n <= 2, or n == 3 and N <= 32 KiB:
                direct; N <= 32 KiB: recursive_doubling if n is a power
                of two, else bruck; else ring
alltoall        bruck if n >= 5 and a block is <= 1 KiB; direct if n == 2
                and the receive buffer is below 4 MiB; else sched
                (bulk: one engine call, CMA reads on one host) if
                N >= S; else as alltoallv (equal blocks; every rank
                must choose alike)
alltoallv       sched (pairwise, in C) if N >= S; else direct if this
                rank's send+receive bytes <= 256 KiB or n <= 2, else
                pairwise (the three interoperate, so ranks may differ)
scan, exscan    recursive_doubling
=============== ========================================================

Topology: a transport may carry ``hosts``, one host label per rank (see
:mod:`erdmampi.collectives.hier`); ``H`` above holds when the labels name
more than one host and fewer hosts than ranks.  Without ``hosts`` (None)
every algorithm is flat.

``sched_*`` algorithms (:mod:`erdmampi.collectives.sched`) run as schedules
in the C engine, chunk-pipelined, with C reductions; ``S`` is
:data:`SCHED_MIN` (256 KiB; ``ERDMA_SCHED_MIN`` overrides it, identically on
every rank).  Where one cannot run (a transport without schedules, a
user-defined op, an element type the C reducer lacks) the dispatcher runs
the algorithm that would be chosen without it.

Override for benchmarking: the environment variable
``ERDMA_COLL_<NAME>=<algorithm>`` (``ERDMA_COLL_ALLREDUCE=ring``) forces an
algorithm for that collective.  It must be set identically on every rank.
Algorithms valid only for commutative ops fall back to a rank-ordered
algorithm when given a non-commutative one, so an override is always safe.
An unknown name raises ``ValueError``.
"""

from __future__ import annotations

import os
from typing import Callable, Optional, Sequence

import numpy as np

from erdmampi.collectives.alltoall import (alltoall_bruck, alltoallv_direct,
                                           alltoallv_pairwise)
from erdmampi.collectives.barrier import barrier_dissemination
from erdmampi.collectives.base import MAX_TAG, ReduceFn, Transport
from erdmampi.collectives.bcast import (bcast_binomial, bcast_pipeline,
                                        bcast_scatter_allgather)
from erdmampi.collectives.gather import (allgatherv_bruck, allgatherv_direct,
                                         allgatherv_recursive_doubling,
                                         allgatherv_ring, gather_binomial,
                                         gather_linear, gatherv_linear,
                                         scatter_binomial, scatter_linear,
                                         scatterv_linear)
from erdmampi.collectives.hier import (allreduce_hierarchical, bcast_hierarchical,
                                       is_multi_host)
from erdmampi.collectives.objects import (allgather_obj, allreduce_obj,
                                          alltoall_obj, bcast_obj, exscan_obj,
                                          gather_obj, reduce_obj, scan_obj,
                                          scatter_obj)
from erdmampi.collectives.wan import (allgatherv_sched_direct, allreduce_sched_direct,
                                      allreduce_sched_exchange, bcast_sched_pieces,
                                      prefer_allgather_direct, prefer_direct, prefer_exchange)
from erdmampi.collectives.sched import (allgatherv_sched_ring, allreduce_sched_pair,
                                        allreduce_sched_ring, allreduce_sched_slices,
                                        alltoall_sched, alltoallv_sched,
                                        bcast_sched_chain, bcast_sched_pair,
                                        bcast_sched_pull,
                                        reduce_scatter_sched_pair,
                                        reduce_scatter_sched_ring,
                                        reduce_scatter_sched_slices)
from erdmampi.collectives.reduce import (allreduce_rabenseifner,
                                         allreduce_recursive_doubling,
                                         allreduce_reduce_bcast, allreduce_ring,
                                         exscan_recursive_doubling,
                                         reduce_binomial,
                                         reduce_scatter_reduce_scatterv,
                                         reduce_scatter_ring,
                                         scan_recursive_doubling)

__all__ = [
    "Transport", "MAX_TAG", "ALGORITHMS", "select", "ENV_PREFIX",
    "barrier", "bcast", "reduce", "allreduce", "gather", "scatter", "gatherv",
    "scatterv", "allgatherv", "alltoall", "alltoallv", "reduce_scatter", "scan", "exscan",
    "bcast_obj", "gather_obj", "scatter_obj", "allgather_obj", "alltoall_obj",
    "reduce_obj", "allreduce_obj", "scan_obj", "exscan_obj",
]

ENV_PREFIX = "ERDMA_COLL_"


def _uniform_a2a(fn: Callable) -> Callable:
    """An alltoallv algorithm as an ``alltoall(t, sendbuf, recvbuf)`` one."""
    def run(t, sendbuf, recvbuf):
        n = t.size
        blk = recvbuf.size // n
        counts, displs = [blk] * n, [blk * i for i in range(n)]
        return fn(t, sendbuf, None if sendbuf is None else counts,
                  None if sendbuf is None else displs, recvbuf, counts, displs)
    run.__name__ = fn.__name__.replace("alltoallv", "alltoall")
    run.__doc__ = f":func:`{fn.__name__}` with equal packed blocks."
    return run

#: collective name -> {algorithm name -> function}
ALGORITHMS: dict[str, dict[str, Callable]] = {
    "barrier": {"dissemination": barrier_dissemination},
    "bcast": {"binomial": bcast_binomial,
              "scatter_allgather": bcast_scatter_allgather,
              "pipeline": bcast_pipeline,
              "sched_chain": bcast_sched_chain,
              "sched_pair": bcast_sched_pair,
              "sched_pull": bcast_sched_pull,
              "sched_pieces": bcast_sched_pieces,
              "hierarchical": bcast_hierarchical},
    "reduce": {"binomial": reduce_binomial},
    "allreduce": {"recursive_doubling": allreduce_recursive_doubling,
                  "ring": allreduce_ring,
                  "rabenseifner": allreduce_rabenseifner,
                  "reduce_bcast": allreduce_reduce_bcast,
                  "sched_ring": allreduce_sched_ring,
                  "sched_pair": allreduce_sched_pair,
                  "sched_slices": allreduce_sched_slices,
                  "sched_exchange": allreduce_sched_exchange,
                  "sched_direct": allreduce_sched_direct,
                  "hierarchical": allreduce_hierarchical},
    "reduce_scatter": {"ring": reduce_scatter_ring,
                       "reduce_scatterv": reduce_scatter_reduce_scatterv,
                       "sched_ring": reduce_scatter_sched_ring,
                       "sched_pair": reduce_scatter_sched_pair,
                       "sched_slices": reduce_scatter_sched_slices},
    "gather": {"binomial": gather_binomial, "linear": gather_linear},
    "scatter": {"binomial": scatter_binomial, "linear": scatter_linear},
    "gatherv": {"linear": gatherv_linear},
    "scatterv": {"linear": scatterv_linear},
    "allgatherv": {"ring": allgatherv_ring, "direct": allgatherv_direct,
                   "bruck": allgatherv_bruck,
                   "recursive_doubling": allgatherv_recursive_doubling,
                   "sched_ring": allgatherv_sched_ring,
                   "sched_direct": allgatherv_sched_direct},
    "alltoall": {"bruck": alltoall_bruck,
                 "pairwise": _uniform_a2a(alltoallv_pairwise),
                 "direct": _uniform_a2a(alltoallv_direct),
                 "sched": alltoall_sched,
                 "sched_pairwise": _uniform_a2a(alltoallv_sched)},
    "alltoallv": {"pairwise": alltoallv_pairwise, "direct": alltoallv_direct,
                  "sched": alltoallv_sched},
    "scan": {"recursive_doubling": scan_recursive_doubling},
    "exscan": {"recursive_doubling": exscan_recursive_doubling},
}

KiB = 1024


def _sched_min() -> int:
    from erdmampi import config
    return config.get("ERDMA_SCHED_MIN")


#: bytes from which the ``sched_*`` algorithms are the default
SCHED_MIN = _sched_min()

#: two ranks: bytes from which Bcast splits the copy between both
#: (``sched_pair``); below, one message (one process_vm_readv on one host)
#: is faster than the extra round of messages
BULK_BCAST_MIN = 4 * 1024 * KiB

#: two ranks: receive-buffer bytes from which Alltoall runs as the bulk pair
#: (CMA copies by both ranks, ``sched``); below, two messages are faster
#: (through the shared-memory ring up to its eager limit, then one CMA read):
#: 128 KiB-2 MiB 6-20 % faster than the pair, 4 MiB 3-10 % slower (Xeon VM)
BULK_ALLTOALL_PAIR_MIN = 4 * 1024 * KiB

#: two ranks: bytes below which Allreduce has each rank reduce (half of)
#: the vector from the other's input (``sched_pair``, one round of
#: messages; 1.1-1.5x the ring's speed from 8 to 128 MiB on one host, any
#: element type); from here the chunk-pipelined ring, whose memory stays
#: bounded where CMA is refused (the pair's fallback holds the whole vector)
BULK_ALLREDUCE_MAX = 256 * 1024 * KiB


def _default(name: str, nbytes: int, size: int, count: int,
             commutative: bool, sched: bool = True, hier: bool = False) -> str:
    big = sched and size > 1 and nbytes >= SCHED_MIN
    if hier and (name == "bcast" or (name == "allreduce" and commutative)):
        return "hierarchical"
    if name in ("gather", "scatter"):
        return "binomial" if size >= 4 and nbytes <= 256 * KiB else "linear"
    if name == "alltoall":
        if size >= 5 and count <= KiB * size and not big:
            return "bruck"                       # here count = block bytes * n
        if size == 2 and count < BULK_ALLTOALL_PAIR_MIN:
            return "direct"
        name = "alltoallv"
    if name == "bcast":
        if big and size > 2:
            return "sched_chain"
        if big and nbytes >= BULK_BCAST_MIN:
            # two ranks: both copy a share at once (CMA on one host)
            return "sched_pair"
        return "binomial" if nbytes <= 512 * KiB or size <= 2 else "scatter_allgather"
    if name == "allreduce":
        if nbytes <= 64 * KiB or count < size:
            return "recursive_doubling"
        if not commutative:
            return "recursive_doubling" if nbytes <= 512 * KiB else "reduce_bcast"
        if sched and size == 2 and nbytes < BULK_ALLREDUCE_MAX:
            return "sched_pair"
        if big:
            return "sched_slices" if size >= 3 else "sched_ring"
        return "rabenseifner" if size & (size - 1) == 0 else "ring"
    if name == "reduce_scatter":
        if big and commutative:
            return "sched_pair" if size == 2 else "sched_slices"
        return "ring" if commutative else "reduce_scatterv"
    if big and name == "allgatherv":
        return "sched_ring"
    if big and name == "alltoallv":
        return "sched"
    if name == "allgatherv":
        if size <= 2 or (size == 3 and nbytes <= 32 * KiB):
            return "direct"
        if nbytes <= 32 * KiB:
            return "recursive_doubling" if size & (size - 1) == 0 else "bruck"
        return "ring"
    if name == "alltoallv":
        return "direct" if nbytes <= 256 * KiB or size <= 2 else "pairwise"
    return next(iter(ALGORITHMS[name]))


def select(name: str, nbytes: int = 0, size: int = 1, count: int = 0,
           commutative: bool = True, algorithm: Optional[str] = None,
           hier: bool = False) -> Callable:
    """The algorithm function for collective ``name``.

    :param nbytes: message size in bytes as defined in the module table
    :param size: number of ranks
    :param count: number of elements (allreduce: count < size -> recursive doubling)
    :param commutative: whether the reduction op commutes
    :param algorithm: force this algorithm (else ``$ERDMA_COLL_<NAME>``, else
        the default rule)
    :param hier: the ranks span several hosts (hierarchical algorithms)
    """
    table = ALGORITHMS[name]
    choice = algorithm or os.environ.get(ENV_PREFIX + name.upper()) or None
    if choice is None:
        choice = _default(name, nbytes, size, count, commutative, hier=hier)
    try:
        return table[choice]
    except KeyError:
        raise ValueError(f"unknown {name} algorithm {choice!r}; "
                         f"choose one of {sorted(table)}") from None


def _nbytes(arr: Optional[np.ndarray], count: int) -> int:
    return 0 if arr is None else int(count) * arr.itemsize


def _run(name: str, args: tuple, nbytes: int, size: int, count: int,
         commutative: bool, algorithm: Optional[str], hier: bool = False) -> None:
    """Run the selected algorithm; a ``sched_*`` one that cannot run here
    returns ``False`` and the choice without schedules runs instead."""
    if select(name, nbytes, size, count, commutative, algorithm, hier)(*args) is False:
        ALGORITHMS[name][_default(name, nbytes, size, count, commutative,
                                  sched=False, hier=hier)](*args)


# -- dispatchers -------------------------------------------------------------

def barrier(t: Transport, algorithm: Optional[str] = None) -> None:
    """Block until every rank has entered the barrier."""
    select("barrier", algorithm=algorithm)(t)


def bcast(t: Transport, buf: np.ndarray, root: int,
          algorithm: Optional[str] = None) -> None:
    """Copy ``buf`` of ``root`` into ``buf`` of every rank."""
    pair = getattr(t, "pair_bcast", None)       # two ranks of one host: flags once agreed
    if pair is not None and t.size == 2 and pair(buf, root):
        return
    if (algorithm is None and ENV_PREFIX + "BCAST" not in os.environ
            and prefer_exchange(t, buf.nbytes, True)):
        algorithm = "sched_pieces"            # two hosts (collectives/wan.py)
    _run("bcast", (t, buf, root), buf.nbytes, t.size, buf.size, True, algorithm,
         is_multi_host(t))


def reduce(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: Optional[np.ndarray],
           root: int, reduce_fn: ReduceFn, commutative: bool = True,
           algorithm: Optional[str] = None) -> None:
    """Reduce into ``recvbuf`` at ``root``; ``sendbuf=None``: in place at root."""
    data = sendbuf if sendbuf is not None else recvbuf
    select("reduce", data.nbytes, t.size, data.size, commutative, algorithm)(
        t, sendbuf, recvbuf, root, reduce_fn, commutative)


def allreduce(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray,
              reduce_fn: ReduceFn, commutative: bool = True,
              algorithm: Optional[str] = None) -> None:
    """Reduce into ``recvbuf`` on every rank; ``sendbuf=None``: in place."""
    if (algorithm is None and ENV_PREFIX + "ALLREDUCE" not in os.environ
            and prefer_exchange(t, recvbuf.nbytes, commutative)):
        algorithm = "sched_exchange"          # two hosts: one phase (collectives/wan.py)
    elif (algorithm is None and ENV_PREFIX + "ALLREDUCE" not in os.environ
            and prefer_direct(t, recvbuf.nbytes, commutative)):
        algorithm = "sched_direct"            # 3..8 hosts: two phases
    _run("allreduce", (t, sendbuf, recvbuf, reduce_fn, commutative), recvbuf.nbytes,
         t.size, recvbuf.size, commutative, algorithm, is_multi_host(t))


def gather(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: Optional[np.ndarray],
           root: int, algorithm: Optional[str] = None) -> None:
    """Gather equal blocks at ``root`` into ``recvbuf`` (n blocks, packed).
    Every rank must know the block size: ``sendbuf.size`` off the root,
    ``recvbuf.size // n`` at the root (``sendbuf=None`` there: in place)."""
    n = t.size
    if t.rank == int(root) and recvbuf is not None:
        nbytes = recvbuf.nbytes // n * n
    else:
        nbytes = 0 if sendbuf is None else sendbuf.nbytes * n
    select("gather", nbytes, n, algorithm=algorithm)(t, sendbuf, recvbuf, root)


def scatter(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: Optional[np.ndarray],
            root: int, algorithm: Optional[str] = None) -> None:
    """Scatter equal blocks of ``sendbuf`` at ``root``; block size as in
    :func:`gather` (``recvbuf=None`` at the root: in place)."""
    n = t.size
    if t.rank == int(root) and sendbuf is not None:
        nbytes = sendbuf.nbytes // n * n
    else:
        nbytes = 0 if recvbuf is None else recvbuf.nbytes * n
    select("scatter", nbytes, n, algorithm=algorithm)(t, sendbuf, recvbuf, root)


def alltoall(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray,
             algorithm: Optional[str] = None) -> None:
    """All-to-all of equal blocks (``recvbuf.size // n`` elements each, the
    same on every rank, so every rank selects alike; Bruck is possible
    here, unlike in :func:`alltoallv`).  ``sendbuf=None``: in place."""
    n = t.size
    pair = getattr(t, "pair_alltoall", None)    # a two-rank Alltoall: flags once agreed
    if pair is not None and n == 2 and pair(sendbuf, recvbuf):
        return
    nbytes = recvbuf.nbytes // n * n
    # _default reads the per-rank traffic (send+receive) from nbytes and the
    # vector size from count, as alltoallv does
    _run("alltoall", (t, sendbuf, recvbuf), 2 * nbytes, n, nbytes, True, algorithm)


def gatherv(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: Optional[np.ndarray],
            counts: Optional[Sequence[int]], displs: Optional[Sequence[int]],
            root: int, algorithm: Optional[str] = None) -> None:
    """Gather blocks at ``root`` (``counts``/``displs`` significant there)."""
    select("gatherv", algorithm=algorithm)(t, sendbuf, recvbuf, counts, displs, root)


def scatterv(t: Transport, sendbuf: Optional[np.ndarray], counts: Optional[Sequence[int]],
             displs: Optional[Sequence[int]], recvbuf: Optional[np.ndarray], root: int,
             algorithm: Optional[str] = None) -> None:
    """Scatter blocks from ``root``; ``recvbuf=None`` at the root: in place."""
    select("scatterv", algorithm=algorithm)(t, sendbuf, counts, displs, recvbuf, root)


def allgatherv(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray,
               counts: Sequence[int], displs: Optional[Sequence[int]],
               algorithm: Optional[str] = None) -> None:
    """Gather blocks on every rank; ``sendbuf=None``: own block in place."""
    pair = getattr(t, "pair_allgather", None)   # a two-rank Allgather: flags once agreed
    if pair is not None and t.size == 2 and pair(sendbuf, recvbuf, counts, displs):
        return
    total = sum(int(c) for c in counts)
    nbytes = _nbytes(recvbuf, total)
    if (algorithm is None and ENV_PREFIX + "ALLGATHERV" not in os.environ
            and prefer_allgather_direct(getattr(t, "hosts", None), t.size, nbytes)):
        algorithm = "sched_direct"            # hosts of their own: one phase (collectives/wan.py)
    _run("allgatherv", (t, sendbuf, recvbuf, counts, displs), nbytes,
         t.size, total, True, algorithm)


def alltoallv(t: Transport, sendbuf: Optional[np.ndarray], scounts: Optional[Sequence[int]],
              sdispls: Optional[Sequence[int]], recvbuf: np.ndarray,
              rcounts: Sequence[int], rdispls: Optional[Sequence[int]],
              algorithm: Optional[str] = None) -> None:
    """Personalised all-to-all; ``sendbuf=None``: in place in ``recvbuf``."""
    local = sum(int(c) for c in rcounts)
    if sendbuf is not None and scounts is not None:
        local += sum(int(c) for c in scounts)
    _run("alltoallv", (t, sendbuf, scounts, sdispls, recvbuf, rcounts, rdispls),
         _nbytes(recvbuf, local), t.size, local, True, algorithm)


def reduce_scatter(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray,
                   recvcounts: Sequence[int], reduce_fn: ReduceFn,
                   commutative: bool = True, algorithm: Optional[str] = None) -> None:
    """Reduce a vector of sum(recvcounts) elements; rank r gets block r."""
    total = sum(int(c) for c in recvcounts)
    _run("reduce_scatter", (t, sendbuf, recvbuf, recvcounts, reduce_fn, commutative),
         _nbytes(recvbuf, total), t.size, total, commutative, algorithm)


def scan(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray,
         reduce_fn: ReduceFn, algorithm: Optional[str] = None) -> None:
    """Inclusive prefix reduction (rank order); ``sendbuf=None``: in place."""
    select("scan", recvbuf.nbytes, t.size, recvbuf.size, False, algorithm)(
        t, sendbuf, recvbuf, reduce_fn)


def exscan(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray,
           reduce_fn: ReduceFn, algorithm: Optional[str] = None) -> None:
    """Exclusive prefix reduction; rank 0's ``recvbuf`` is left untouched."""
    select("exscan", recvbuf.nbytes, t.size, recvbuf.size, False, algorithm)(
        t, sendbuf, recvbuf, reduce_fn)
