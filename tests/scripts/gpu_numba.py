"""Numba CUDA device arrays through the buffer API, any number of ranks.

Two modes, chosen by the environment:

* ``NUMBA_ENABLE_CUDASIM=1`` (CI): Numba's CUDA simulator.  Its "device"
  arrays are host memory that export themselves through DLPack as CPU
  buffers (they have no ``__cuda_array_interface__``), so erdmampi reads
  and writes them in place: no staging.  This checks that numba.cuda code
  tested under the simulator runs unchanged against erdmampi.
* otherwise (a real GPU): Numba device arrays export
  ``__cuda_array_interface__`` and every message is staged through host
  memory (download on the call, upload on completion).

The script asserts which of the two paths each buffer took, so a run can
never pass in the wrong mode.
"""
import os
import sys

import numpy as np
from numba import cuda

from _mpi import MPI, check, done
from erdmampi import buffers

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
if not SIM and not cuda.is_available():
    print("gpu_numba: SKIP no CUDA GPU (set NUMBA_ENABLE_CUDASIM=1 for the simulator)")
    sys.exit(0)

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a) if a.flags.c_contiguous
                          else np.asfortranarray(a))


def host(d):
    return d.copy_to_host()


# which path: simulator arrays are CPU DLPack buffers, real ones are staged
probe = dev(np.zeros(3))
check(buffers.message_p2p(probe, True).device is (not SIM),
      f"staging path: device={buffers.message_p2p(probe, True).device} sim={SIM}")
check(SIM or hasattr(probe, "__cuda_array_interface__"), "real arrays export the CAI")


@cuda.jit
def fill(a, value):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = value + i


for c in (comm, comm.Dup()):
    r, n = c.Get_rank(), c.Get_size()
    rt, lf = (r + 1) % n, (r - 1) % n

    # Send/Recv ring (even ranks send first), typed and with explicit datatype
    for dt in ("i", "d", "F"):
        s = dev(np.full(5, r + 1, dt))
        d = dev(np.zeros(5, dt))
        if n == 1:
            c.Sendrecv(s, rt, 1, d, lf, 1)
        elif r % 2 == 0:
            c.Send(s, rt, 1)
            c.Recv(d, lf, 1)
        else:
            c.Recv(d, lf, 1)
            c.Send(s, rt, 1)
        check((host(d) == lf + 1).all(), f"Send/Recv {dt}: {host(d)}")
    st = MPI.Status()
    s = dev(np.arange(7, dtype="d") + r)
    d = dev(np.zeros(7))
    c.Sendrecv([s, MPI.DOUBLE], rt, 2, [d, MPI.DOUBLE], lf, 2, st)
    check(np.array_equal(host(d), np.arange(7) + lf), "Sendrecv")
    check(st.Get_count(MPI.DOUBLE) == 7 and st.Get_source() == lf, "Sendrecv status")

    # data written by a kernel on a user stream, sent without synchronising:
    # the CAI stream must be waited for before the device is read
    stream = cuda.stream()
    nk = 64 if SIM else 1 << 20  # the simulator runs one Python thread per GPU thread
    k = cuda.to_device(np.zeros(nk, "d"), stream=stream)
    fill[(nk + 31) // 32, 32, stream](k, float(r))
    d = dev(np.zeros(nk, "d"))
    c.Sendrecv(k, rt, 3, d, lf, 3)
    check(np.array_equal(host(d), np.arange(nk) + lf), "kernel on stream -> Sendrecv")

    # Isend/Irecv, small and large (rendezvous), Waitall and a Test loop
    for count in (0, 1, 300_000):
        s = dev(np.arange(count, dtype="d") * (r + 1))
        d = dev(np.full(count, -1.0))
        reqs = [c.Irecv(d, lf, 5), c.Isend(s, rt, 5)]
        MPI.Request.Waitall(reqs)
        check(np.array_equal(host(d), np.arange(count) * (lf + 1)), f"Isend/Irecv {count}")
    s = dev(np.full(3, r, "i"))
    d = dev(np.zeros(3, "i"))
    rq = c.Irecv(d, lf, 6)
    sq = c.Isend(s, rt, 6)
    while not rq.Test():
        pass
    sq.Wait()
    check((host(d) == lf).all(), "Irecv completed by Test")

    # short message: bytes past it keep their device contents
    d = dev(np.full(6, 9, "i"))
    sq = c.Isend(dev(np.array([r, r], "i")), rt, 7)
    st = MPI.Status()
    c.Recv(d, lf, 7, st)
    sq.Wait()
    check(host(d).tolist() == [lf, lf, 9, 9, 9, 9] and st.Get_count(MPI.INT) == 2,
          f"short message {host(d)}")
    # [buf, (count, displ), type]: bytes outside the message are untouched
    d = dev(np.full(6, -1, "i"))
    sq = c.Isend([dev(np.arange(6, dtype="i")), (3, 1), MPI.INT], rt, 8)
    c.Recv([d, (3, 2), MPI.INT], lf, 8)
    sq.Wait()
    check(host(d).tolist() == [-1, -1, 1, 2, 3, -1], f"displacements {host(d)}")
    # Fortran-ordered 2-D arrays
    a = np.asfortranarray(np.arange(12, dtype="f").reshape(3, 4) + r)
    d = dev(np.asfortranarray(np.zeros((3, 4), "f")))
    c.Sendrecv(dev(a), rt, 9, d, lf, 9)
    check(np.array_equal(host(d), np.arange(12, dtype="f").reshape(3, 4) + lf), "F order")

    # persistent receive (staged again on each Start), Mprobe + Message.Recv
    d = dev(np.zeros(2, "l"))
    pr = c.Recv_init(d, lf, 10)
    for it in range(2):
        pr.Start()
        sq = c.Isend(dev(np.array([r, it], "l")), rt, 10)
        pr.Wait()
        sq.Wait()
        check(host(d).tolist() == [lf, it], f"Recv_init round {it}: {host(d)}")
    pr.Free()
    sq = c.Isend(dev(np.arange(4, dtype="d") + r), rt, 11)
    m = c.Mprobe(lf, 11)
    d = dev(np.zeros(4))
    m.Recv(d)
    sq.Wait()
    check(np.array_equal(host(d), np.arange(4) + lf), "Mprobe/Message.Recv")

    # Bcast from every root
    for root in range(n):
        b = dev(np.arange(8, dtype="i") * (r + 1))
        c.Bcast(b, root)
        check(np.array_equal(host(b), np.arange(8) * (root + 1)), f"Bcast root {root}")
    b = dev(np.zeros(4, "d") if r else np.arange(4, dtype="d"))
    c.Ibcast(b, 0).Wait()
    check(np.array_equal(host(b), np.arange(4)), "Ibcast")

    # Allreduce, IN_PLACE, MAX, Iallreduce, Reduce
    total = n * (n + 1) // 2
    s = dev(np.full(10, r + 1, "d"))
    d = dev(np.zeros(10))
    c.Allreduce(s, d, MPI.SUM)
    check((host(d) == total).all(), f"Allreduce {host(d)}")
    d = dev(np.full(10, r + 1, "i"))
    c.Allreduce(MPI.IN_PLACE, d, MPI.SUM)
    check((host(d) == total).all(), f"Allreduce IN_PLACE {host(d)}")
    d = dev(np.full(3, r, "l"))
    c.Allreduce(MPI.IN_PLACE, [d, MPI.LONG], MPI.MAX)
    check((host(d) == n - 1).all(), "Allreduce IN_PLACE MAX")
    d = dev(np.zeros(10))
    c.Iallreduce(s, d, MPI.SUM).Wait()
    check((host(d) == total).all(), "Iallreduce")
    # large enough for the chunked C schedules (over 256 KiB)
    big = dev(np.arange(1 << 16, dtype="d") + r)
    want = n * np.arange(1 << 16, dtype="d") + total - n
    d = dev(np.zeros(1 << 16))
    c.Allreduce(big, d, MPI.SUM)
    check(np.array_equal(host(d), want), "Allreduce large")
    d = dev(np.arange(1 << 16, dtype="d") + r)
    c.Iallreduce(MPI.IN_PLACE, d, MPI.SUM).Wait()
    check(np.array_equal(host(d), want), "Iallreduce IN_PLACE large")
    d = dev(np.zeros(10))
    c.Reduce(s, d if r == 0 else None, MPI.SUM, 0)
    if r == 0:
        check((host(d) == total).all(), "Reduce")

    # Gather / Scatter / Allgather / Alltoall (and IN_PLACE at the root)
    s = dev(np.full(3, r, "i"))
    g = dev(np.full(3 * n, -1, "i")) if r == 0 else None
    c.Gather(s, g, 0)
    if r == 0:
        check(np.array_equal(host(g), np.repeat(np.arange(n), 3)), f"Gather {host(g)}")
    if r == 0:
        g = np.full(3 * n, -1, "i")
        g[:3] = 0  # the root's own block is already in place
        g = dev(g)
        c.Gather(MPI.IN_PLACE, g, 0)
        check(np.array_equal(host(g), np.repeat(np.arange(n), 3)), "Gather IN_PLACE")
    else:
        c.Gather(dev(np.full(3, r, "i")), None, 0)
    src = dev(np.arange(2 * n, dtype="d") * 10) if r == 0 else None
    d = dev(np.zeros(2))
    c.Scatter(src, d, 0)
    check(host(d).tolist() == [20.0 * r, 20.0 * r + 10], f"Scatter {host(d)}")
    d = dev(np.zeros(2))
    c.Iscatter(src, d, 0).Wait()
    check(host(d).tolist() == [20.0 * r, 20.0 * r + 10], "Iscatter")
    d = dev(np.zeros(2 * n, "i"))
    c.Allgather(dev(np.array([r, -r], "i")), d)
    check(host(d).reshape(n, 2).tolist() == [[i, -i] for i in range(n)], "Allgather")
    s = dev(np.arange(n, dtype="l") + 100 * r)
    d = dev(np.zeros(n, "l"))
    c.Alltoall(s, d)
    check(host(d).tolist() == [100 * i + r for i in range(n)], f"Alltoall {host(d)}")
    d = dev(np.zeros(n, "l"))
    c.Ialltoall(s, d).Wait()
    check(host(d).tolist() == [100 * i + r for i in range(n)], "Ialltoall")
    d = dev(np.arange(n, dtype="l") + 100 * r)
    c.Alltoall(MPI.IN_PLACE, d)
    check(host(d).tolist() == [100 * i + r for i in range(n)], "Alltoall IN_PLACE")
    if c is not comm:
        c.Free()

done("gpu_numba")
