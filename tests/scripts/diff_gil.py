"""Blocking calls release the GIL: while rank 0 waits in Recv for a message that
rank 1 sends about 1 s later, a Python thread on rank 0 keeps counting."""
import threading
import time

import numpy as np
from _mpi import MPI

comm = MPI.COMM_WORLD
r = comm.Get_rank()
comm.Barrier()
if r == 0:
    count = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            count[0] += 1

    t = threading.Thread(target=spin)
    buf = np.zeros(4, "i8")
    t.start()
    t0 = time.perf_counter()
    before = count[0]
    comm.Recv(buf, source=1, tag=3)
    waited = time.perf_counter() - t0
    during = count[0] - before
    ob = comm.recv(source=1, tag=4)        # object receive: also blocking
    during_obj = count[0] - before - during
    stop.set()
    t.join()
    ok = (buf.tolist() == [1, 2, 3, 4] and ob == "later" and waited > 0.5
          and during > 100_000 and during_obj > 100_000)
    print(f"GIL {'ok' if ok else 'FAIL'}: waited {waited:.2f}s, thread counted {during} "
          f"(Recv) and {during_obj} (recv)", flush=True)
    comm.Barrier()
    raise SystemExit(0 if ok else 1)
elif r == 1:
    time.sleep(1.0)
    comm.Send(np.array([1, 2, 3, 4], "i8"), 0, 3)
    time.sleep(1.0)
    comm.send("later", 0, 4)
comm.Barrier()
