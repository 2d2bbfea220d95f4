"""Object p2p through util.pkl5 (mpi4py.util.pkl5 API) and large pickles."""
import numpy as np
from _mpi import MPI, check, done

if MPI.get_vendor()[0] == "erdmampi":
    from erdmampi.util import pkl5
else:
    from mpi4py.util import pkl5

comm = pkl5.Intracomm(MPI.COMM_WORLD)
r, n = comm.Get_rank(), comm.Get_size()
rt, lf = (r + 1) % n, (r - 1) % n
big = np.full(3_000_000, r, dtype="f8")          # 24 MB, out of band
sreq = comm.isend(big, rt, 1)
st = MPI.Status()
m = comm.mprobe(lf, 1, st)
check(isinstance(m, pkl5.Message) and st.Get_source() == lf, "pkl5 mprobe")
got = m.recv()
check(got.shape == big.shape and (got == lf).all(), "pkl5 big array")
sreq.wait()
check(isinstance(sreq, pkl5.Request), "pkl5 request type")
reqs = [comm.isend({"i": i, "r": r}, rt, 10 + i) for i in range(3)]
for i in range(3):
    check(comm.recv(source=lf, tag=10 + i) == {"i": i, "r": lf}, "pkl5 recv order")
pkl5.Request.waitall(reqs)
check(comm.sendrecv(r, rt, 2, None, lf, 2) == lf, "pkl5 sendrecv")
rq = comm.issend([r], rt, 3)
check(comm.recv(None, lf, 3) == [lf], "pkl5 issend")
rq.wait()
check(comm.bcast(big if r == 0 else None, 0)[0] == 0, "pkl5 bcast")
check(comm.allgather(r) == list(range(n)), "pkl5 allgather")
done("pkl5_obj")
