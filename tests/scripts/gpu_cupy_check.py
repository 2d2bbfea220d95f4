"""CuPy device buffers through erdmampi, for a maintainer with a GPU.

    erdmarun -n 2 python tests/scripts/gpu_cupy_check.py

Prints ``gpu_cupy_check: OK size=N`` (or ``FAIL`` lines naming each failed
check); prints ``SKIP`` and exits 0 without CuPy or without a GPU.  Covers
every receive path that must copy back to the device (blocking,
nonblocking, persistent, matched, collectives and their I-variants), the
``__cuda_array_interface__`` stream (data written on a non-blocking stream
and sent without synchronising), DLPack-only producers, each staging
backend (CuPy, Numba, libcudart) and, with two GPUs, a buffer on a device
other than the current one.
"""
import sys

import numpy as np

try:
    import cupy as cp
    ngpu = cp.cuda.runtime.getDeviceCount()
except Exception as exc:  # noqa: BLE001  (ImportError, or no driver/GPU)
    print(f"gpu_cupy_check: SKIP CuPy with a GPU is needed ({type(exc).__name__}: {exc})")
    sys.exit(0)

from _mpi import MPI, check, done
from erdmampi import buffers

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
right, left = (rank + 1) % size, (rank - 1) % size
H = cp.asnumpy


class DLPackOnly:
    """A CuPy array seen only through DLPack (no CAI, no buffer protocol)."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kw):
        return self._arr.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


check(buffers.message_p2p(cp.zeros(2), True).device, "CuPy arrays are staged")

# -- point-to-point ------------------------------------------------------------
for dt in ("i", "d", "F"):
    s = cp.full(5, rank + 1, dt)
    d = cp.zeros(5, dt)
    comm.Sendrecv(s, right, 1, d, left, 1)
    check(bool((d == left + 1).all()), f"Sendrecv {dt}: {d}")
for count in (0, 1, 1 << 20):
    s = cp.arange(count, dtype="d") * (rank + 1)
    d = cp.full(count, -1.0)
    MPI.Request.Waitall([comm.Irecv(d, left, 2), comm.Isend(s, right, 2)])
    check(bool((d == cp.arange(count) * (left + 1)).all()), f"Isend/Irecv {count}")
d = cp.zeros(3, "i")
rq, sq = comm.Irecv(d, left, 3), comm.Isend(cp.full(3, rank, "i"), right, 3)
while not rq.Test():
    pass
sq.Wait()
check(H(d).tolist() == [left] * 3, "Irecv completed by Test")
d = cp.full(6, 9, "i")
sq = comm.Isend(cp.array([rank, rank], "i"), right, 4)
comm.Recv(d, left, 4)
sq.Wait()
check(H(d).tolist() == [left, left, 9, 9, 9, 9], f"short message {d}")
d = cp.full(6, -1, "i")
sq = comm.Isend([cp.arange(6, dtype="i"), (3, 1), MPI.INT], right, 5)
comm.Recv([d, (3, 2), MPI.INT], left, 5)
sq.Wait()
check(H(d).tolist() == [-1, -1, 1, 2, 3, -1], f"displacements {d}")
d = cp.zeros((3, 4), "f", order="F")
comm.Sendrecv(cp.asfortranarray(cp.arange(12, dtype="f").reshape(3, 4) + rank), right, 6,
              d, left, 6)
check(bool((d == cp.arange(12, dtype="f").reshape(3, 4) + left).all()), "F order")
d = cp.zeros(2, "l")
pr = comm.Recv_init(d, left, 7)
for it in range(2):
    pr.Start()
    sq = comm.Isend(cp.array([rank, it], "l"), right, 7)
    pr.Wait()
    sq.Wait()
    check(H(d).tolist() == [left, it], f"Recv_init round {it}")
pr.Free()
sq = comm.Isend(cp.arange(4.0) + rank, right, 8)
d = cp.zeros(4)
comm.Mprobe(left, 8).Recv(d)
sq.Wait()
check(bool((d == cp.arange(4.0) + left).all()), "Mprobe/Message.Recv")
b = cp.arange(4.0) * (rank + 1)
comm.Sendrecv_replace(b, right, 9, left, 9)
check(bool((b == cp.arange(4.0) * (left + 1)).all()), "Sendrecv_replace")

# -- stream ordering: written on a non-blocking stream, sent without a sync ----
stream = cp.cuda.Stream(non_blocking=True)
with stream:
    big = cp.zeros(1 << 24, "d")
    for _ in range(20):        # keep the stream busy for a while
        big += 1.0
    big += rank
    # CuPy exports its current stream in the CAI; erdmampi must wait for it
    iface = big.__cuda_array_interface__
    d = cp.zeros(1 << 24, "d")
    comm.Sendrecv(big, right, 10, d, left, 10)
check(iface.get("stream") not in (None, 0, 1, 2), f"CuPy exports its stream: {iface}")
check(bool((d == 20.0 + left).all()), "CAI stream synchronised before the send")

# -- DLPack-only producers -----------------------------------------------------
d = cp.zeros(5)
comm.Sendrecv(DLPackOnly(cp.full(5, rank + 0.5)), right, 11, DLPackOnly(d), left, 11)
check(bool((d == left + 0.5).all()), "DLPack-only send and receive")
try:
    import torch
    if torch.cuda.is_available():
        t = torch.full((5,), rank, dtype=torch.int32, device="cuda")
        u = torch.zeros(5, dtype=torch.int32, device="cuda")
        comm.Sendrecv(t, right, 12, u, left, 12)
        check(u.cpu().tolist() == [left] * 5, "torch CUDA tensors")
except ImportError:
    pass

# -- every staging backend, directly --------------------------------------------
a = cp.arange(16, dtype="u1")
for name in ("numba", "libcudart"):
    if name == "numba":
        cuda = buffers._numba_cuda()
        if cuda is None:
            continue
        down, up = buffers._numba_copier(cuda, a, a.data.ptr, None)
    else:
        if buffers._CudaRuntime.load() is None:
            continue
        down, up = buffers._CudaRuntime.copier(a.data.ptr, None)
    host = np.zeros(16, "u1")
    down(host, 4, 12)
    check(host.tolist() == [0] * 4 + list(range(4, 12)) + [0] * 4, f"{name} download")
    host[:] = 200
    up(host, 2, 6)
    check(H(a).tolist()[:8] == [0, 1, 200, 200, 200, 200, 6, 7], f"{name} upload")
    a = cp.arange(16, dtype="u1")

# -- collectives ---------------------------------------------------------------
total = size * (size + 1) // 2
for root in range(size):
    b = cp.arange(8, dtype="i") * (rank + 1)
    comm.Bcast(b, root)
    check(bool((b == cp.arange(8) * (root + 1)).all()), f"Bcast {root}")
b = cp.arange(4.0) if rank == 0 else cp.zeros(4)
comm.Ibcast(b, 0).Wait()
check(bool((b == cp.arange(4.0)).all()), "Ibcast")
s = cp.full(10, rank + 1.0)
for fn in (lambda d: comm.Allreduce(s, d), lambda d: comm.Iallreduce(s, d).Wait()):
    d = cp.zeros(10)
    fn(d)
    check(bool((d == total).all()), "Allreduce/Iallreduce")
d = cp.full(10, rank + 1, "i")
comm.Allreduce(MPI.IN_PLACE, d, MPI.SUM)
check(bool((d == total).all()), "Allreduce IN_PLACE")
d = cp.zeros(10)
comm.Reduce(s, d if rank == 0 else None, MPI.SUM, 0)
check(rank != 0 or bool((d == total).all()), "Reduce")
d = cp.zeros(3)
comm.Scan(cp.full(3, rank + 1.0), d)
check(bool((d == (rank + 1) * (rank + 2) / 2).all()), "Scan")
g = cp.full(3 * size, -1, "i") if rank == 0 else None
comm.Gather(cp.full(3, rank, "i"), g, 0)
check(rank != 0 or H(g).tolist() == list(np.repeat(np.arange(size), 3)), "Gather")
g = cp.full(3 * size, -1, "i") if rank == 0 else None
comm.Igather(cp.full(3, rank, "i"), g, 0).Wait()
check(rank != 0 or H(g).tolist() == list(np.repeat(np.arange(size), 3)), "Igather")
src = cp.arange(2 * size, dtype="d") * 10 if rank == 0 else None
d = cp.zeros(2)
comm.Scatter(src, d, 0)
check(H(d).tolist() == [20.0 * rank, 20.0 * rank + 10], "Scatter")
counts = [i + 1 for i in range(size)]
d = cp.zeros(sum(counts), "i")
comm.Allgatherv(cp.full(rank + 1, rank, "i"), [d, counts])
check(H(d).tolist() == [i for i in range(size) for _ in range(i + 1)], "Allgatherv")
d = cp.zeros(size, "l")
comm.Alltoall(cp.arange(size, dtype="l") + 100 * rank, d)
check(H(d).tolist() == [100 * i + rank for i in range(size)], "Alltoall")
d = cp.arange(size, dtype="l") + 100 * rank
comm.Alltoall(MPI.IN_PLACE, d)
check(H(d).tolist() == [100 * i + rank for i in range(size)], "Alltoall IN_PLACE")
d = cp.zeros(size, "l")
comm.Ialltoall(cp.arange(size, dtype="l") + 100 * rank, d).Wait()
check(H(d).tolist() == [100 * i + rank for i in range(size)], "Ialltoall")
d = cp.zeros(1, "d")
comm.Reduce_scatter_block(cp.full(size, rank + 1.0), d)
check(float(d[0]) == total, "Reduce_scatter_block")

# -- a buffer on another device than the current one ---------------------------
if ngpu > 1:
    with cp.cuda.Device(1):
        s1 = cp.full(4, rank, "i")
        d1 = cp.zeros(4, "i")
    with cp.cuda.Device(0):
        comm.Sendrecv(s1, right, 13, d1, left, 13)
    check(H(d1).tolist() == [left] * 4 and d1.device.id == 1, "buffer on device 1")

done("gpu_cupy_check")
