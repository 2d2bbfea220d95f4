"""Python-object (lowercase) collectives of ``Comm``, over pickled bytes.
"""

from ._commrt import (
    coll, _py_op, _sum)


class CommObjColl:
    """Python-object (lowercase) collectives of ``Comm``."""

    __slots__ = ()

    # -- Collectives: Python objects ----------------------------------------

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
        return coll.bcast_obj(t, obj, root, d, l)

    def gather(self, sendobj, root=0):
        root = self._root(root)
        t, d, l = self._obj_transport()
        return coll.gather_obj(t, sendobj, root, d, l)

    def scatter(self, sendobj, root=0):
        root = self._root(root)
        t, d, l = self._obj_transport()
        if self._rank == root and sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
        return coll.scatter_obj(t, sendobj, root, d, l)

    def allgather(self, sendobj):
        t, d, l = self._obj_transport()
        return coll.allgather_obj(t, sendobj, d, l)

    def alltoall(self, sendobj):
        t, d, l = self._obj_transport()
        if sendobj is not None:
            sendobj = list(sendobj)
            if len(sendobj) != len(self._ranks):
                raise ValueError(f"expecting {len(self._ranks)} items, got {len(sendobj)}")
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
