"""Fault-tolerance calls of MPI 5's ULFM chapter (Comm mixin).

The engine fails a peer that exits, stops answering for ``ERDMA_TIMEOUT``
seconds (QUIC idle timeout; shared-memory heartbeat), or loses its
connection; erdmarun then ends the job, but until then the survivors see
ULFM's errors: operations with the failed rank raise ``ERR_PROC_FAILED``,
and receives from ``ANY_SOURCE`` on a communicator with a failed member
raise ``ERR_PROC_FAILED`` (blocking) or ``ERR_PROC_FAILED_PENDING`` (a
nonblocking one's ``Wait``/``Test``; the request stays pending) until
``Ack_failed`` acknowledges the failure.  ``Get_failed`` is the group of
failed members known here, in the order they failed.  ``Shrink``
duplicates and ``Agree`` is a bitwise-AND reduction (neither leaves failed
members out).  ``Revoke`` marks the communicator revoked in this process
(later communication on it raises ``ERR_REVOKED``); the notice is not
propagated to other members.
"""

import numpy as np

from .exceptions import ERR_ARG, ERR_REVOKED, raise_error

__all__ = ["CommULFM"]

# agreement's tags, on the point-to-point context: clear of user tags (up to
# 2**28 - 1) and of Create_group's (from 2**29, 2**26 wide)
_AGREE_TAG_BASE = (1 << 29) + (1 << 28)


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

    def _failed(self):
        """(failed world ranks of the peers, in failure order; how many acked)."""
        from ._commrt import _rt
        self._check()
        if _rt.engine is None:
            return [], 0
        return _rt.engine.ctx_failed(self._ctx)

    def Get_failed(self):
        from .group import Group
        failed, _ = self._failed()
        return Group._from_ranks(failed)

    def Ack_failed(self, num_to_ack=None):
        """Acknowledge the first ``num_to_ack`` failed members (all: None);
        returns how many are acknowledged.  Receives from ANY_SOURCE then
        proceed until another member fails."""
        from ._commrt import _rt
        self._check()
        if num_to_ack is not None and int(num_to_ack) < 0:
            raise_error(ERR_ARG, "negative number of failures to acknowledge")
        failed, nacked = self._failed()
        upto = len(failed) if num_to_ack is None else int(num_to_ack)
        if not failed or upto <= nacked:
            return nacked
        return _rt.engine.ctx_ack(self._ctx, upto)

    def _agree_run(self, buf):
        """AND ``buf`` (one C int) over the communicator, on tags of its own:
        agreement does not take a place in the order of the collectives
        (a rank may call it between two others), as MPI's does not."""
        from . import collectives as coll
        from ._commrt import _CollTransport
        seq = self.__dict__.get("_agree_seq", 0)
        self._agree_seq = seq + 1
        t = _CollTransport(self, self._ctx, _AGREE_TAG_BASE + (seq % 1024) * 1024)

        def run():
            coll.allreduce(t, None, buf, lambda a, io: np.bitwise_and(a, io, out=io))
        return run

    def Agree(self, flag):
        from .op import BAND
        from .datatype import INT
        self._check_revoked()
        buf = np.array([int(flag)], dtype=np.intc)
        if self.Is_inter():
            # an intercomm Allreduce gives the other group's AND; a second
            # one brings back this group's: both together are everyone's
            theirs, mine = np.empty_like(buf), np.empty_like(buf)
            self.Allreduce([buf, INT], [theirs, INT], BAND)
            self.Allreduce([theirs, INT], [mine, INT], BAND)
            return int(theirs[0] & mine[0])
        self._agree_run(buf)()
        return int(buf[0])

    def Iagree(self, flag):
        self._check_revoked()
        mv = memoryview(flag)   # TypeError for a non-buffer, as mpi4py
        if mv.nbytes != np.dtype(np.intc).itemsize:
            raise ValueError(f"expecting buffer of size {np.dtype(np.intc).itemsize}, "
                             f"got {mv.nbytes}")
        value = np.frombuffer(mv.cast("B"), dtype=np.intc)
        if self.Is_inter():
            from .request import Request, _DoneOp
            value[0] = self.Agree(int(value[0]))
            return Request._new(_DoneOp())
        from ._commrt import _icoll
        return _icoll(self._agree_run(value))

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
