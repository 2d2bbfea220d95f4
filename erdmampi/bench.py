"""``python -m erdmampi.bench``: mpi4py's command-line checks of an MPI job.

    erdmarun -n 4 python -m erdmampi.bench helloworld [-q]
    erdmarun -n 4 python -m erdmampi.bench ringtest [-n BYTES] [-l LOOPS] [-s SKIP] [-q]

``helloworld`` prints one line per rank, in rank order; ``ringtest`` times a
message of ``BYTES`` going around the ring of ranks.  (The project's
comparative benchmarks are the ``bench/`` folder of the repository.)
"""

import argparse
import sys

__all__ = ["helloworld", "ringtest", "main"]


def _parser(cmd):
    return argparse.ArgumentParser(prog=f"{__spec__.parent}.bench {cmd}", allow_abbrev=False)


def helloworld(comm, args=None, verbose=True):
    """Hello, World! from every rank, in rank order."""
    from . import MPI
    p = _parser("helloworld")
    p.add_argument("-q", "--quiet", action="store_false", dest="verbose", default=verbose)
    opts = p.parse_args(args)
    size, rank = comm.Get_size(), comm.Get_rank()
    message = (f"Hello, World! I am process {rank:{len(str(size - 1))}d} of {size} "
               f"on {MPI.Get_processor_name()}.\n")
    comm.Barrier()
    if rank > 0:
        comm.Recv([None, "B"], rank - 1)
    if opts.verbose:
        sys.stdout.write(message)
        sys.stdout.flush()
    if rank < size - 1:
        comm.Send([None, "B"], rank + 1)
    comm.Barrier()
    return message


def ringtest(comm, args=None, verbose=True):
    """Seconds for a message to go around the ring (rank 0 prints them)."""
    from . import MPI
    p = _parser("ringtest")
    p.add_argument("-q", "--quiet", action="store_false", dest="verbose", default=verbose)
    p.add_argument("-n", "--size", type=int, default=1, dest="size", help="message bytes")
    p.add_argument("-s", "--skip", type=int, default=0, dest="skip", help="untimed loops")
    p.add_argument("-l", "--loop", type=int, default=1, dest="loop", help="timed loops")
    opts = p.parse_args(args)
    size, rank = comm.Get_size(), comm.Get_rank()
    sbuf, rbuf = bytearray(opts.size), bytearray(opts.size)
    src, dst = (rank - 1) % size, (rank + 1) % size
    t0 = 0.0
    comm.Barrier()
    for i in range(opts.loop + opts.skip):
        if i == opts.skip:
            t0 = MPI.Wtime()
        if size == 1:
            rbuf[:] = sbuf
        elif rank == 0:
            comm.Send(sbuf, dst)
            comm.Recv(rbuf, src)
        else:
            comm.Recv(rbuf, src)
            comm.Send(rbuf, dst)
    elapsed = MPI.Wtime() - t0
    comm.Barrier()
    if opts.verbose and rank == 0:
        print(f"time for {opts.loop} loops = {elapsed:g} seconds "
              f"({size} processes, {opts.size} bytes)", flush=True)
    return elapsed


_COMMANDS = {"helloworld": helloworld, "ringtest": ringtest}


def main(args=None):
    from . import MPI
    p = argparse.ArgumentParser(prog=f"{__spec__.parent}.bench", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=sorted(_COMMANDS))
    p.add_argument("args", nargs=argparse.REMAINDER)
    opts = p.parse_args(args)
    _COMMANDS[opts.command](MPI.COMM_WORLD, opts.args)


if __name__ == "__main__":
    main()
