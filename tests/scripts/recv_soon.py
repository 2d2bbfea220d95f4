"""erdma_recv_soon_alloc, the receive of a lowercase recv (and sendrecv, and
a two-rank object collective) that reads the shared-memory rings itself for
a short while before it posts a request: a message that lands during the
spin is taken whole, with its status; nothing, a message of another tag, a
rendezvous message or a refused buffer leave it in the queue for the
receive that follows, and the spin ends on time.  Two ranks; rank 1 sends
to rank 0.  erdmampi only (the engine's C API)."""
import os
import time

import numpy as np
from _mpi import MPI, check, done

from erdmampi._commrt import _rt
from erdmampi._engine import ffi, lib

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
eng = _rt.engine._h
if len(os.sched_getaffinity(0)) < comm.Get_size():   # ranks outnumber the CPUs: no spin
    done("recv_soon")             # (exits)
held = []


@ffi.callback("void *(*)(void *, uint64_t)")
def alloc(arg, n):
    if arg != ffi.NULL:                     # told to refuse
        return ffi.NULL
    buf = ffi.new("char[]", max(int(n), 1))
    held.append((buf, int(n)))
    return ffi.cast("void *", buf)


def soon(tag, spin_s, refuse=False, source=1):
    """(taken, the bytes, status, seconds) of one erdma_recv_soon_alloc."""
    out = ffi.new("erdma_blocking *")
    held.clear()
    t = time.perf_counter()
    got = lib.erdma_recv_soon_alloc(eng, comm._ranks[source], tag, comm._ctx, alloc,
                                    ffi.cast("void *", 1) if refuse else ffi.NULL,
                                    int(spin_s * 1e9), out)
    dt = time.perf_counter() - t
    data = bytes(ffi.buffer(held[0][0], out.nbytes)) if got else None
    return got, data, out, dt


if rank == 1:
    comm.Barrier()
    time.sleep(0.05)                        # rank 0 spins already
    comm.Send(np.arange(25, dtype=np.int32), dest=0, tag=7)
    comm.Barrier()                          # rank 0 spun for tag 8 and saw nothing
    time.sleep(0.01)
    comm.Send(np.arange(5, dtype=np.int32), dest=0, tag=9)     # not the tag it waits for
    comm.Barrier()
    comm.Send(np.arange(3, dtype=np.int32), dest=0, tag=10)
    comm.Send(np.arange(1 << 20, dtype=np.int32), dest=0, tag=11)   # 4 MiB: rendezvous
    comm.Barrier()
elif rank == 0:
    comm.Barrier()
    got, data, st, dt = soon(7, 5.0)
    check(got == 1, f"landed during the spin: taken ({got})")
    check(data == np.arange(25, dtype=np.int32).tobytes(), "landed: the bytes")
    check((st.source, st.tag, st.error, st.nbytes) == (comm._ranks[1], 7, 0, 100),
          f"landed: the status {(st.source, st.tag, st.error, st.nbytes)}")
    check(0.02 < dt < 2.0, f"landed: taken as it came, after {dt:.3f} s")

    got, _, _, dt = soon(8, 0.05)
    check(got == 0, "nothing for tag 8: not taken")
    check(0.045 < dt < 1.0, f"nothing: the spin ends on time ({dt:.3f} s of 0.05)")
    comm.Barrier()

    got, _, _, dt = soon(8, 0.1)
    check(got == 0 and dt < 1.0, f"tag 9 came, tag 8 waited for: not taken ({got}, {dt:.3f} s)")
    a = np.zeros(5, np.int32)
    comm.Recv(a, source=1, tag=9)
    check(bool((a == np.arange(5)).all()), "the other tag's message stays for its receive")
    comm.Barrier()

    time.sleep(0.2)                         # both sent
    got, _, _, _ = soon(10, 0.01, refuse=True)
    check(got == 0, "a refused buffer: not taken")
    got, data, st, _ = soon(10, 0.01)
    check(got == 1 and data == np.arange(3, dtype=np.int32).tobytes(),
          "after a refused buffer the message is still first")
    got, _, _, _ = soon(11, 0.01)
    check(got == 0, "a rendezvous message: not taken here")
    big = np.zeros(1 << 20, np.int32)
    comm.Recv(big, source=1, tag=11)
    check(bool((big == np.arange(1 << 20)).all()), "the rendezvous message's receive")
    got, _, _, dt = soon(12, 5.0, source=0)
    check(got == 0 and dt < 0.5, f"from itself: no spin ({dt:.3f} s)")
    comm.Barrier()

done("recv_soon")
