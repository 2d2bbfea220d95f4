"""Fault-tolerance calls of MPI 5's ULFM chapter (Comm mixin).

erdmampi ends a job when a rank dies (the launcher tears it down), so a
live communicator never has failed members here: ``Get_failed`` is empty,
``Ack_failed`` acknowledges nothing, ``Shrink`` duplicates and ``Agree`` is
a bitwise-AND reduction.  ``Revoke`` marks the communicator revoked in
this process (later communication on it raises ``ERR_REVOKED``); the
notice is not propagated to other members.
"""

import numpy as np

from .exceptions import ERR_ARG, ERR_REVOKED, raise_error

__all__ = ["CommULFM"]


class CommULFM:
    _revoked = False

    def _check_revoked(self):
        if self._revoked:
            raise_error(ERR_REVOKED, "communicator revoked")

    def Revoke(self):
        self._check()
        self._revoked = True
        # the one-call fast paths keep no check of their own: drop them
        self._fast = None
        self._csmall = None

    def Is_revoked(self):
        self._check()
        return bool(self._revoked)

    def Get_failed(self):
        self._check()
        from .group import Group
        return Group._from_ranks(())

    def Ack_failed(self, num_to_ack=None):
        self._check()
        if num_to_ack is not None and int(num_to_ack) < 0:
            raise_error(ERR_ARG, "negative number of failures to acknowledge")
        return 0

    def Agree(self, flag):
        from .op import BAND
        from .datatype import INT
        self._check_revoked()
        buf = np.array([int(flag)], dtype=np.intc)
        self.Allreduce(_in_place(), [buf, INT], BAND)
        return int(buf[0])

    def Iagree(self, flag):
        from .op import BAND
        from .datatype import INT
        self._check_revoked()
        mv = memoryview(flag)   # TypeError for a non-buffer, as mpi4py
        if mv.nbytes != np.dtype(np.intc).itemsize:
            raise ValueError(f"expecting buffer of size {np.dtype(np.intc).itemsize}, "
                             f"got {mv.nbytes}")
        return self.Iallreduce(_in_place(), [flag, 1, INT], BAND)

    def Shrink(self):
        self._check()
        return self.Dup()

    def Ishrink(self):
        from .request import Request, _DoneOp
        comm = self.Shrink()
        return comm, Request._new(_DoneOp())


def _in_place():
    from .buffers import IN_PLACE
    return IN_PLACE
