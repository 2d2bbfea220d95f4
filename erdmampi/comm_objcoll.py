"""Python-object (lowercase) collectives of ``Comm``, over pickled bytes.
"""

from ._commrt import (
    coll, _py_op, _sum)


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

    def bcast(self, obj, root=0):
        """Broadcast a Python object from ``root``."""
        root = self._root(root)
        t, d, l = self._obj_transport()
        with self._objlock("bcast"):
            return coll.bcast_obj(t, obj, root, d, l)

    def gather(self, sendobj, root=0):
        root = self._root(root)
        t, d, l = self._obj_transport()
        with self._objlock("gather"):
            return coll.gather_obj(t, sendobj, root, d, l)

    def scatter(self, sendobj, root=0):
        root = self._root(root)
        t, d, l = self._obj_transport()
        if self._rank == root and sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        with self._objlock("scatter"):
            return coll.scatter_obj(t, sendobj, root, d, l)

    def allgather(self, sendobj):
        t, d, l = self._obj_transport()
        with self._objlock("allgather"):
            return coll.allgather_obj(t, sendobj, d, l)

    def alltoall(self, sendobj):
        t, d, l = self._obj_transport()
        if sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        with self._objlock("alltoall"):
            return coll.alltoall_obj(t, sendobj, d, l)

    def reduce(self, sendobj, op=None, root=0):
        root = self._root(root)
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.reduce_obj(t, sendobj, fn, root, d, l)

    def allreduce(self, sendobj, op=None):
        fn = _py_op(_sum(op))
        t, d, l = self._obj_transport()
        return coll.allreduce_obj(t, sendobj, fn, d, l)
