"""Compressed collectives on device arrays (Numba; under NUMBA_ENABLE_CUDASIM=1
in CI): encoded on the device, only encodings cross to the host, decoded on
the device.  Small sizes: the simulator runs every CUDA thread in Python."""
import numpy as np
from _mpi import MPI, check, done
from numba import cuda

from erdmampi import compression as cz

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
N = 96
x = (np.arange(N, dtype=np.float32) - 40) * (r + 1)
want = (np.arange(N, dtype=np.float32) - 40) * (n * (n + 1) // 2)
cz.reset_stats()

dx, dout = cuda.to_device(x), cuda.device_array(N, np.float32)
world.Allreduce(dx, dout, compress="lossless")
check(np.array_equal(dout.copy_to_host(), want), "device Allreduce lossless")

dq = cuda.device_array(N, np.float32)
world.Allreduce(dx, dq, compress="int8")
q = dq.copy_to_host()
check(np.abs(q - want).max() <= np.abs(want).max() / 254 * n + 1e-3, f"device int8 {q - want}")
allq = np.zeros((n, N), np.float32)
world.Allgather(q, allq, compress="off")
check(all(np.array_equal(allq[p], allq[0]) for p in range(n)), "device int8: ranks differ")

b = cuda.to_device(np.arange(N, dtype=np.int64) if r == 0 else np.zeros(N, np.int64))
world.Bcast(b, 0, compress="lossless")
check(np.array_equal(b.copy_to_host(), np.arange(N)), "device Bcast")

dg = cuda.device_array(N * n, np.float32)
world.Allgather(dx, dg, compress="lossless")
check(np.array_equal(dg.copy_to_host(),
                     np.concatenate([(np.arange(N, dtype=np.float32) - 40) * (p + 1)
                                     for p in range(n)])), "device Allgather")
st = cz.stats()
check(st["device_calls"] == 4, f"device calls {st}")
done("compress_gpu")
