"""Messages larger than 2 GiB (past MPI's int count), as bytes and pickled with pkl5."""
import os
import sys

import numpy as np

from _mpi import MPI, FAILURES, check

if os.environ.get("ERDMA_REFERENCE") == "mpi4py":
    from mpi4py.util import pkl5
else:
    from erdmampi.util import pkl5

comm = MPI.COMM_WORLD
N = (2 << 30) + 4096 + 7  # just over 2 GiB

if comm.rank == 0:
    a = np.ones(N, np.uint8)
    a[::4096] = 7
    a[-1] = 9
    comm.Send([a, MPI.BYTE], dest=1, tag=1)
    del a
    big = {"name": "weights", "data": np.arange(N // 8 + 3, dtype=np.int64)}
    pkl5.Intracomm(comm).send(big, dest=1, tag=2)
    del big
else:
    b = np.zeros(N, np.uint8)
    st = MPI.Status()
    comm.Recv([b, MPI.BYTE], source=0, tag=1, status=st)
    check(st.Get_count(MPI.BYTE) == N, f"count {st.Get_count(MPI.BYTE)}")
    check(b[-1] == 9 and b[4096] == 7 and b[1] == 1 and b[:4096].sum() == 4096 + 6,
          "buffer contents")
    del b
    got = pkl5.Intracomm(comm).recv(source=0, tag=2)
    d = got["data"]
    check(got["name"] == "weights" and d.size == N // 8 + 3 and d[-1] == N // 8 + 2
          and d[12345] == 12345, "pkl5 object")
    del got, d
comm.Barrier()
print(f"rank {comm.rank}: {'OK' if not FAILURES else 'FAILED'}", flush=True)
sys.exit(1 if FAILURES else 0)
