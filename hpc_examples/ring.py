"""Pass a token around a ring of processes with Send/Recv.

Rank 0 starts each lap with a nonblocking send (so that a ring of one process
does not deadlock on a send to itself); every other rank receives the token,
adds its rank number and sends it on. After the last lap rank 0 checks the
total.

    erdmarun -n 4 python hpc_examples/ring.py [laps]
"""
import sys

import numpy as np

from erdmampi import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
laps = int(sys.argv[1]) if len(sys.argv) > 1 else 3

TAG = 7
nxt = (rank + 1) % size
prev = (rank - 1) % size
token = np.zeros(1, dtype=np.int64)
status = MPI.Status()

for lap in range(laps):
    if rank == 0:
        out = token.copy()
        req = comm.Isend([out, MPI.INT64_T], dest=nxt, tag=TAG)
        comm.Recv([token, MPI.INT64_T], source=prev, tag=TAG, status=status)
        req.Wait()
    else:
        comm.Recv([token, MPI.INT64_T], source=prev, tag=TAG, status=status)
        token += rank
        comm.Send([token, MPI.INT64_T], dest=nxt, tag=TAG)
    assert status.Get_source() == prev and status.Get_tag() == TAG, status
    assert status.Get_count(MPI.INT64_T) == 1
    if rank == 0:
        print("lap %d: token %d back from rank %d" % (lap + 1, token[0], status.Get_source()))

if rank == 0:
    expected = laps * size * (size - 1) // 2
    print("ring of %d ranks, %d laps: token %d, expected %d: %s"
          % (size, laps, token[0], expected, "OK" if token[0] == expected else "WRONG"))
