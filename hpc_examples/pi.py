"""Compute pi by integrating 4/(1+x^2) over [0, 1] with the midpoint rule.

Rank 0 broadcasts the number of intervals (Bcast), every rank sums its share of
the intervals, and the partial sums are added on rank 0 (Reduce).

    erdmarun -n 4 python hpc_examples/pi.py [intervals]
"""
import math
import sys

import numpy as np

from erdmampi import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
size = comm.Get_size()

n = np.zeros(1, dtype=np.int64)
if rank == 0:
    n[0] = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
comm.Bcast([n, MPI.INT64_T], root=0)
intervals = int(n[0])

h = 1.0 / intervals
x = h * (np.arange(rank, intervals, size, dtype=np.float64) + 0.5)
mypi = np.array(h * np.sum(4.0 / (1.0 + x * x)), dtype=np.float64)

pi = np.zeros(1, dtype=np.float64)
comm.Reduce([mypi, MPI.DOUBLE], [pi, MPI.DOUBLE], op=MPI.SUM, root=0)

if rank == 0:
    # The midpoint-rule error (about 1/(12 n^2)) dwarfs rounding, so these
    # digits do not depend on the order in which the partial sums were added.
    print("ranks: %d, intervals: %d" % (size, intervals))
    print("pi is approximately %.10f, error %.3e" % (pi[0], pi[0] - math.pi))
