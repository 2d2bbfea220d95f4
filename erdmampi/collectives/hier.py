"""Hierarchical (topology-aware) algorithms for ranks that span several hosts.

A transport may carry ``hosts``: one host label per communicator rank (the
comm layer takes them from ``erdmampi.bootstrap.world_info()['hosts']``).
Ranks with the same label share a host, so the engine moves their messages
through shared memory; the algorithms here keep the traffic between hosts
to one rank per host (the *leader*):

* allreduce: reduce to the leader within each host, allreduce among the
  leaders, broadcast within each host;
* bcast: broadcast among the leaders (the root is the leader of its host),
  then within each host.

Each phase runs the dispatcher of :mod:`erdmampi.collectives` on a
:class:`SubTransport` (a subset of the ranks, without ``hosts``), so it picks
the flat algorithm for its own size, schedules in C included.  Phases reuse
the caller's tags; that is safe because every rank runs the phases in the
same order and each phase completes before the next starts (messages
between one pair with one tag match in order).

Without ``hosts``, with one host, or with every rank on its own host, the
functions run the flat default.  A non-commutative op runs the flat default
too (the hierarchical order would not be the rank order).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from erdmampi.collectives.base import ReduceFn, Transport, check_root

__all__ = ["SubTransport", "host_groups", "is_multi_host",
           "allreduce_hierarchical", "bcast_hierarchical"]


class SubTransport:
    """The Transport of a subset ``ranks`` (parent ranks, in the new rank
    order) of a parent transport; this process must be one of them.  Has
    ``schedule`` when the parent has, and no ``hosts``."""

    hosts = None

    def __init__(self, parent: Transport, ranks: Sequence[int]):
        self._parent = parent
        self._ranks = list(ranks)
        self.rank = self._ranks.index(parent.rank)
        self.size = len(self._ranks)
        if callable(getattr(parent, "schedule", None)):
            self.schedule = self._schedule

    def isend(self, buf: np.ndarray, dest: int, tag: int):
        return self._parent.isend(buf, self._ranks[dest], tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int):
        return self._parent.irecv(buf, self._ranks[source], tag)

    def send_obj(self, obj: Any, dest: int, tag: int) -> None:
        self._parent.send_obj(obj, self._ranks[dest], tag)

    def recv_obj(self, source: int, tag: int) -> Any:
        return self._parent.recv_obj(self._ranks[source], tag)

    def waitall(self, reqs: list) -> None:
        self._parent.waitall(reqs)

    def _schedule(self, chunked: bool = True):
        return _SubSchedule(self._parent.schedule(chunked), self._ranks)


class _SubSchedule:
    """A schedule builder with peers renumbered to the parent's ranks."""

    def __init__(self, builder, ranks):
        self._b = builder
        self._ranks = ranks

    def send(self, arr, dest, tag):
        return self._b.send(arr, self._ranks[dest], tag)

    def recv(self, arr, source, tag):
        return self._b.recv(arr, self._ranks[source], tag)

    def __getattr__(self, name):
        return getattr(self._b, name)


def _hosts(t: Transport) -> Optional[list]:
    hosts = getattr(t, "hosts", None)
    if hosts is None:
        return None
    hosts = list(hosts)
    if len(hosts) != t.size:
        raise ValueError(f"transport has {len(hosts)} host labels for {t.size} ranks")
    return hosts


def is_multi_host(t: Transport) -> bool:
    """True when ``t.hosts`` puts the ranks on more than one host and at
    least one host has more than one rank (else hierarchy gains nothing)."""
    hosts = _hosts(t)
    if hosts is None:
        return False
    k = len(set(hosts))
    return 1 < k < t.size


def host_groups(hosts: Sequence) -> list[list[int]]:
    """Ranks per host, hosts ordered by their lowest rank."""
    groups: dict = {}
    for i, h in enumerate(hosts):
        groups.setdefault(h, []).append(i)
    return sorted(groups.values(), key=lambda g: g[0])


def _flat(t: Transport) -> SubTransport:
    return SubTransport(t, range(t.size))


def allreduce_hierarchical(t: Transport, sendbuf: Optional[np.ndarray],
                           recvbuf: np.ndarray, reduce_fn: ReduceFn,
                           commutative: bool = True) -> None:
    """Reduce within each host to its lowest rank, allreduce among those
    leaders, broadcast within each host.  One rank per host talks to other
    hosts.  Commutative ops only (others run the flat default); without
    several hosts it runs the flat default.  ``sendbuf=None``: in place."""
    from erdmampi import collectives as C
    if not commutative or not is_multi_host(t):
        return C.allreduce(_flat(t), sendbuf, recvbuf, reduce_fn, commutative)
    if sendbuf is not None:
        if sendbuf.size != recvbuf.size:
            raise ValueError(f"allreduce: send buffer has {sendbuf.size} elements, "
                             f"receive buffer {recvbuf.size}")
        recvbuf[...] = sendbuf
    if recvbuf.size == 0:
        return
    groups = host_groups(_hosts(t))
    local = next(g for g in groups if t.rank in g)
    lt = SubTransport(t, local)
    if len(local) > 1:
        C.reduce(lt, None if lt.rank == 0 else recvbuf, recvbuf, 0, reduce_fn, True)
    if lt.rank == 0:
        C.allreduce(SubTransport(t, [g[0] for g in groups]), None, recvbuf,
                    reduce_fn, True)
    if len(local) > 1:
        C.bcast(lt, recvbuf, 0)


def bcast_hierarchical(t: Transport, buf: np.ndarray, root: int) -> None:
    """Broadcast among one leader per host (the root leads its own host,
    elsewhere the lowest rank does), then within every host from its
    leader.  Without several hosts it runs the flat default."""
    from erdmampi import collectives as C
    root = check_root("bcast", root, t.size)
    if not is_multi_host(t):
        return C.bcast(_flat(t), buf, root)
    if buf.nbytes == 0:
        return
    groups = host_groups(_hosts(t))
    leaders = [root if root in g else g[0] for g in groups]
    local = next(g for g in groups if t.rank in g)
    if t.rank in leaders:
        lroot = next(i for i, g in enumerate(groups) if root in g)
        C.bcast(SubTransport(t, leaders), buf, lroot)
    if len(local) > 1:
        leader = root if root in local else local[0]
        C.bcast(SubTransport(t, local), buf, local.index(leader))
