"""Allreduce numpy arrays of several types and sizes and check the results.

Every rank fills its arrays from its rank number, so each rank can compute the
expected result locally. Rank 0 prints one line per case and OK at the end.

    erdmarun -n 4 python hpc_examples/allreduce_numpy.py
"""
import numpy as np

from erdmampi import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()
ranks = np.arange(size)

# (dtype, MPI datatype, op, op name, count, expected element values given indices i)
CASES = [
    (np.float64, MPI.DOUBLE, MPI.SUM, "SUM", 1000, lambda i: ranks.sum() + size * i),
    (np.float32, MPI.FLOAT, MPI.SUM, "SUM", 1 << 20, lambda i: ranks.sum() + size * (i % 256)),
    (np.int32, MPI.INT, MPI.MAX, "MAX", 4097, lambda i: (size - 1) + i),
    (np.int64, MPI.INT64_T, MPI.MIN, "MIN", 33, lambda i: i),
    (np.float64, MPI.DOUBLE, MPI.PROD, "PROD", 10, lambda i: np.prod(ranks + 1.0) + 0 * i),
]


def local_values(dtype, op, count):
    i = np.arange(count)
    if op == MPI.PROD:
        return np.full(count, rank + 1, dtype=dtype)
    if dtype is np.float32:
        return (rank + i % 256).astype(dtype)  # exactly representable sums
    return (rank + i).astype(dtype)


failures = 0
for dtype, mpitype, op, opname, count, expect in CASES:
    send = local_values(dtype, op, count)
    recv = np.empty_like(send)
    comm.Allreduce([send, mpitype], [recv, mpitype], op=op)
    expected = expect(np.arange(count)).astype(dtype)
    ok = np.array_equal(recv, expected)
    # the same reduction in place
    inplace = send.copy()
    comm.Allreduce(MPI.IN_PLACE, [inplace, mpitype], op=op)
    ok = ok and np.array_equal(inplace, expected)
    failures += not ok
    if rank == 0:
        print("Allreduce %-4s %-7s x %7d: %s"
              % (opname, np.dtype(dtype).name, count, "ok" if ok else "WRONG"))

total = np.zeros(1, dtype=np.int64)
comm.Allreduce([np.array([failures], dtype=np.int64), MPI.INT64_T], [total, MPI.INT64_T],
               op=MPI.SUM)
if rank == 0:
    print("%d ranks: %s" % (size, "OK" if total[0] == 0 else "%d FAILED" % total[0]))
