"""Group: an ordered set of processes, held as a tuple of COMM_WORLD ranks."""

import itertools
import threading

from ._objmodel import HandleBase
from .exceptions import (ERR_ARG, ERR_GROUP, ERR_RANK, raise_error)

UNDEFINED = -32766
PROC_NULL = -1
IDENT, CONGRUENT, SIMILAR, UNEQUAL = 0, 1, 2, 3

_world_rank = [0]          # this process's COMM_WORLD rank, set at Init


def _set_world_rank(rank):
    _world_rank[0] = rank


class Group(HandleBase):
    """Process group, as ``MPI.Group``.

    ``_ranks`` is a tuple of COMM_WORLD ranks, or None for ``GROUP_NULL``.
    A handle names a member list and is made on demand (``handle``), which
    stores it in the object's C memory (``_h``, see ``HandleBase``; the null
    handle or 0 until then).  A null object into which a group handle was
    written (``MPI._addressof``) takes that member list when first checked
    (``_adopt``).
    """

    __slots__ = ("_ranks", "_index", "_predef", "__weakref__")

    def __init__(self, group=None):
        self._predef = False
        if group is None:
            self._ranks = None
            self._index = None
            self._h = _NULL_HANDLE
        elif isinstance(group, Group):
            self._ranks = group._ranks
            self._index = group._index
        else:
            raise TypeError(f"expected Group, got {type(group).__name__}")

    @classmethod
    def _from_ranks(cls, ranks):
        g = cls()
        g._ranks = tuple(ranks)
        g._index = {w: i for i, w in enumerate(g._ranks)}
        return g

    def __reduce__(self):
        from ._objmodel import reduce_predefined
        return reduce_predefined(self, (("GROUP_NULL", GROUP_NULL),
                                        ("GROUP_EMPTY", GROUP_EMPTY)))

    # Private

    def _check(self):
        if self._ranks is None and not self._adopt():
            raise_error(ERR_GROUP, "invalid group (GROUP_NULL)")
        return self._ranks

    def _adopt(self):
        """Take the member list named by a handle written into this object.

        The handle was written into this null object's memory; False when
        it names no group.
        """
        h = self._h
        if h == 0 or h == _NULL_HANDLE:
            return False
        ranks = () if h == _EMPTY_HANDLE else _ranks_of.get(h)
        if ranks is None:
            return False
        self._ranks = ranks
        self._index = {w: i for i, w in enumerate(ranks)}
        return True

    def _world(self, rank):
        """World rank of group rank ``rank``."""
        return self._ranks[rank]

    def _rank_of(self, world_rank):
        return self._index.get(world_rank, UNDEFINED)

    def _check_ranks(self, ranks):
        size = len(self._check())
        out = []
        for r in ranks:
            r = int(r)
            if r < 0 or r >= size:
                raise_error(ERR_RANK, f"invalid rank {r} for group of size {size}")
            out.append(r)
        return out

    # Public API

    def __eq__(self, other):
        if not isinstance(other, Group):
            return NotImplemented
        if self._ranks is None or other._ranks is None:
            a = self._ranks is None and not self._adopt()
            b = other._ranks is None and not other._adopt()
            if a or b:
                return a and b
        return self is other or (self._ranks == other._ranks)

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None  # unhashable, as mpi4py's

    def __bool__(self):
        return self._ranks is not None or self._adopt()

    def __repr__(self):
        if not self:
            return "<Group GROUP_NULL>"
        return f"<Group size={len(self._ranks)}>"

    def Get_size(self):
        """Number of processes in the group."""
        return len(self._check())

    def Get_rank(self):
        """Rank of this process in the group, or UNDEFINED."""
        self._check()
        return self._index.get(_world_rank[0], UNDEFINED)

    size = property(Get_size, doc="number of processes")
    rank = property(Get_rank, doc="rank of this process")

    def Translate_ranks(self, ranks=None, group=None):
        """Translate ``ranks`` of this group to ranks of ``group`` (UNDEFINED if absent)."""
        mine = self._check()
        if ranks is None:
            ranks = range(len(mine))
        ranks = list(ranks)
        if group is None:
            return [r for r in self._check_ranks_or_null(ranks)]
        group._check()
        out = []
        for r in self._check_ranks_or_null(ranks):
            out.append(r if r == PROC_NULL else group._index.get(mine[r], UNDEFINED))
        return out

    def _check_ranks_or_null(self, ranks):
        size = len(self._check())
        for r in ranks:
            r = int(r)
            if r != PROC_NULL and (r < 0 or r >= size):
                raise_error(ERR_RANK, f"invalid rank {r} for group of size {size}")
        return [int(r) for r in ranks]

    def Compare(self, group):
        """IDENT, SIMILAR or UNEQUAL."""
        a, b = self._check(), group._check()
        if a == b:
            return IDENT
        if sorted(a) == sorted(b):
            return SIMILAR
        return UNEQUAL

    @classmethod
    def Union(cls, group1, group2):
        """The processes of ``group1`` followed by those of ``group2`` not in ``group1``."""
        a, b = group1._check(), group2._check()
        seen = set(a)
        return cls._from_ranks(list(a) + [w for w in b if w not in seen])

    @classmethod
    def Intersection(cls, group1, group2):
        """The group of the processes of ``group1`` also in ``group2``, in ``group1``'s order."""
        a, b = group1._check(), set(group2._check())
        return cls._from_ranks([w for w in a if w in b])

    @classmethod
    def Difference(cls, group1, group2):
        """The group of the processes of ``group1`` not in ``group2``."""
        a, b = group1._check(), set(group2._check())
        return cls._from_ranks([w for w in a if w not in b])

    def Incl(self, ranks):
        """Group of the listed ranks, in that order."""
        ranks = self._check_ranks(ranks)
        if len(set(ranks)) != len(ranks):
            raise_error(ERR_RANK, "duplicate ranks in Group.Incl")
        return Group._from_ranks([self._ranks[r] for r in ranks])

    def Excl(self, ranks):
        """Group without the listed ranks."""
        ranks = self._check_ranks(ranks)
        if len(set(ranks)) != len(ranks):
            raise_error(ERR_RANK, "duplicate ranks in Group.Excl")
        drop = set(ranks)
        return Group._from_ranks([w for i, w in enumerate(self._ranks) if i not in drop])

    def _expand(self, triples):
        size = len(self._check())
        out = []
        for t in triples:
            first, last, stride = (int(x) for x in t)
            if stride == 0:
                raise_error(ERR_ARG, "zero stride in range")
            if not (0 <= first < size and 0 <= last < size):
                # MPICH reports ranges outside the group as MPI_ERR_ARG
                raise_error(ERR_ARG, f"range ({first}, {last}, {stride}) outside a group "
                                     f"of size {size}")
            stop = last + (1 if stride > 0 else -1)
            out.extend(range(first, stop, stride))
        return out

    def Range_incl(self, ranks):
        """The group of the ranks in ``(first, last, stride)`` ranges, in that order."""
        return self.Incl(self._expand(ranks))

    def Range_excl(self, ranks):
        """The group without the ranks in ``(first, last, stride)`` ranges."""
        return self.Excl(self._expand(ranks))

    def Dup(self):
        """A duplicate of the group."""
        self._check()
        return Group._from_ranks(self._ranks)

    def Free(self):
        """Free the group: it becomes GROUP_NULL."""
        self._check()
        if self._predef:
            raise_error(ERR_GROUP, "cannot free a predefined group")
        self._ranks = None
        self._index = None
        self._h = _NULL_HANDLE

    def free(self):
        """Call Free if not null or predefined."""
        if self and not self._predef:
            self.Free()

    @classmethod
    def Create_from_session_pset(cls, session, pset_name):
        """The group of a process set of ``session`` (MPI_Group_from_session_pset)."""
        return session.Create_group(pset_name)

    @classmethod
    def Intersect(cls, group1, group2):
        """The intersection of two groups (same as `Intersection`)."""
        return cls.Intersection(group1, group2)

    # -- handles: groups are values here; a handle names the member list --

    @property
    def handle(self):
        """MPI handle (also stored in the object's memory, ``_h``)."""
        if not self:
            h = _NULL_HANDLE
        elif not self._ranks:
            h = _EMPTY_HANDLE
        else:
            with _handles_lock:
                h = _handle_of.get(self._ranks)
                if h is None:
                    h = _handle_of[self._ranks] = next(_next_handle)
                    _ranks_of[h] = self._ranks
        self._h = h
        return h

    _sync_handle = handle.fget

    @classmethod
    def fromhandle(cls, handle):
        """The group of an integer handle."""
        handle = int(handle)
        if handle == _NULL_HANDLE:
            return GROUP_NULL
        if handle == _EMPTY_HANDLE:
            return GROUP_EMPTY
        ranks = _ranks_of.get(handle)
        if ranks is None:
            raise_error(ERR_GROUP, f"unknown group handle {handle:#x}")
        return cls._from_ranks(ranks)

    def toint(self):
        """The integer handle of the group."""
        return self.handle

    @classmethod
    def fromint(cls, arg):
        """The group of an integer handle."""
        return cls.fromhandle(arg)

    def py2f(self):
        """The Fortran integer handle of the group."""
        return self.handle

    @classmethod
    def f2py(cls, arg):
        """The group of a Fortran integer handle."""
        return cls.fromhandle(arg)


# MPICH's MPI_GROUP_NULL and MPI_GROUP_EMPTY; other handles name member lists
_NULL_HANDLE = 0x08000000
_EMPTY_HANDLE = 0x48000000
_handles_lock = threading.Lock()
_next_handle = itertools.count(0x88000000)
_handle_of = {}
_ranks_of = {}


Group.__module__ = "erdmampi.MPI"
GROUP_NULL = Group()
GROUP_NULL._predef = True
GROUP_EMPTY = Group._from_ranks(())
GROUP_EMPTY._predef = True
