"""Import MPI for rank scripts: erdmampi, or mpi4py when ERDMA_REFERENCE=mpi4py
(to check that a script's expectations hold for the reference too)."""
import os
import sys

if os.environ.get("ERDMA_REFERENCE") == "mpi4py":
    from mpi4py import MPI  # noqa: F401
else:
    from erdmampi import MPI  # noqa: F401

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL rank {MPI.COMM_WORLD.Get_rank()}: {what}", flush=True)


def raises(errclass, fn, *args, **kw):
    try:
        fn(*args, **kw)
    except MPI.Exception as e:
        return e.Get_error_class() == errclass or (print(
            f"  got error class {e.Get_error_class()} expected {errclass}") and False)
    except Exception as e:  # noqa: BLE001
        print(f"  got {type(e).__name__}: {e}")
        return False
    return False


def on_two_comms(comm, body):
    """``body(c, what)`` on two fresh duplicates of comm at once, a thread
    each (under THREAD_MULTIPLE; else nothing), after three Barriers on
    each; an exception in a thread is a failure."""
    import threading
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return
    comms = [comm.Dup(), comm.Dup()]
    for c in comms:
        for _ in range(3):
            c.Barrier()
    errs = []

    def run(c, what):
        try:
            body(c, what)
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))

    ts = [threading.Thread(target=run, args=(c, f"thread {i}")) for i, c in enumerate(comms)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    check(not errs, f"threads: {errs}")
    for c in comms:
        c.Free()


def done(name):
    comm = MPI.COMM_WORLD
    nfail = comm.allreduce(len(FAILURES))
    if comm.Get_rank() == 0:
        print(f"{name}: {'OK' if nfail == 0 else f'{nfail} FAILURES'} size={comm.Get_size()}",
              flush=True)
    sys.exit(1 if FAILURES else 0)
