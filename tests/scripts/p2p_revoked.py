"""Point-to-point calls on a revoked communicator raise ERR_REVOKED on every
path, the one-call paths of plain arrays included (they are warm first)."""
import numpy as np
from _mpi import MPI, check, done, raises

c = MPI.COMM_WORLD.Dup()
r = c.Get_rank()
a = np.zeros(4)
b = np.zeros(4)
for _ in range(3):          # the specs are remembered: the next calls are one C call
    c.Sendrecv(a, 1 - r, 0, b, 1 - r, 0)
    q = c.Irecv(b, 1 - r, 1)
    c.Isend(a, 1 - r, 1).Wait()
    q.Wait()
    if r == 0:
        c.Send(a, 1, 2)
        c.Recv(b, 1, 2)
    else:
        c.Recv(b, 0, 2)
        c.Send(a, 0, 2)
c.Barrier()
if r == 0:
    c.Revoke()
    check(raises(MPI.ERR_REVOKED, c.Send, a, 1, 2), "Send after Revoke")
    check(raises(MPI.ERR_REVOKED, c.Recv, b, 1, 2), "Recv after Revoke")
    check(raises(MPI.ERR_REVOKED, c.Isend, a, 1, 1), "Isend after Revoke")
    check(raises(MPI.ERR_REVOKED, c.Irecv, b, 1, 1), "Irecv after Revoke")
    check(raises(MPI.ERR_REVOKED, c.Sendrecv, a, 1, 0, b, 1, 0), "Sendrecv after Revoke")
MPI.COMM_WORLD.Barrier()
done("p2p_revoked")
