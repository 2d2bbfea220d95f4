"""Intracomm.Create_intercomm (a mixin of :class:`~erdmampi.comm.Intracomm`).

The two leaders swap their groups' COMM_WORLD ranks and context-id
proposals through ``peer_comm`` (object messages on ``tag``); each leader
broadcasts the other side's answer to its group.  The classes come from
:mod:`erdmampi.intercomm` when called (it builds on ``Intracomm``).
"""

from ._commrt import _rt
from .exceptions import ERR_RANK, raise_error
from .op import MAX


class IntracommInter:
    """Intracomm's inter-communicator constructor, and the check that an
    inter-communicator is not taken for an intra-communicator."""

    __slots__ = ()

    def _construct(self, comm=None):
        # an inter-communicator is the communicator with a remote group
        if getattr(comm, "_rgroup", None) is not None and comm._ranks is not None:
            raise TypeError("expecting an intracommunicator")
        super()._construct(comm)

    def Create_intercomm(self, local_leader, peer_comm, remote_leader, tag=0):
        """Inter-communicator between this group and the group whose leader is
        ``remote_leader`` of ``peer_comm``."""
        from .intercomm import _new_intercomm
        ranks = self._check()
        local_leader, remote_leader, tag = int(local_leader), int(remote_leader), int(tag)
        if not 0 <= local_leader < len(ranks):
            raise_error(ERR_RANK, f"invalid local leader {local_leader} "
                                  f"(communicator size {len(ranks)})")
        # (group, context-id proposal, leader): the group whose leader has
        # the smaller COMM_WORLD rank comes first when merged by default
        mine = (tuple(ranks), _propose(self), ranks[local_leader])
        theirs = None
        if self._rank == local_leader:
            peer_comm._check()
            if not 0 <= remote_leader < peer_comm.Get_size():
                raise_error(ERR_RANK, f"invalid remote leader {remote_leader} "
                                      f"(peer communicator size {peer_comm.Get_size()})")
            theirs = peer_comm.sendrecv(mine, remote_leader, tag, None, remote_leader, tag)
        theirs = self.bcast(theirs, local_leader)
        return _new_intercomm(ranks, theirs[0], max(mine[1], theirs[1]), mine[2] < theirs[2])


def _propose(comm):
    """This group's context-id proposal (the largest next_ctx of its members)."""
    return comm.allreduce(_rt.next_ctx, op=MAX)
