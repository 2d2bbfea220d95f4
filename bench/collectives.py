"""Collective bandwidth, reported as nccl-tests does: Allreduce, Bcast,
Allgather, Alltoall and Reduce_scatter on float32 (or --dtype) data.

The same module runs on the three stacks (see bench/common.py):

    erdmarun -n 4 python -m bench.collectives
    mpiexec.mpich -n 4 python -m bench.collectives --ops allreduce,bcast
    python -m bench.gloorun -n 4 python -m bench.collectives

``bytes`` is the size nccl-tests reports: the whole array for allreduce and
bcast, the gathered (output) array for allgather, the input array for
reduce_scatter, and each rank's send array for alltoall (each rank sends
bytes/n to every rank, itself included). For every size (4 KiB to 256 MiB,
doubling) the result is checked once, then after warm-up calls ``--repeats``
repetitions of ``iters`` calls are timed, each after a barrier (iters =
budget/size clamped to 1..200, lowered to about --target-time seconds per
repetition going by the warm-up); a
repetition's time is the slowest rank's mean per call and the reported time
is the median over repetitions. algbw = bytes / time and busbw = algbw * f,
f = 2(n-1)/n for allreduce, (n-1)/n for allgather, reduce_scatter and
alltoall, 1 for bcast (10^9 bytes/s).

``--timing each`` times every call alone after a barrier (as OSU's
benchmarks do) and reports the median call; ``--fresh`` (implies ``--timing
each``) gives every timed call new buffers mapped from the kernel (the send
buffer filled, the receive buffer untouched; malloc would hand back pages
it kept), so first-touch page faults and anything cached per buffer are
part of the time.  ``--dtype`` (float32,
float64, int32, int64, uint8) sets the element type; sizes stay in bytes.
``--plain`` passes bare arrays to the MPI stacks instead of ``[array,
datatype]``.  ``--page-offset S,R`` places the send and receive buffers S
and R bytes into pages of their own: a copy whose destination lies 1-63
bytes after its source modulo the page can run 10-20x slower (glibc's and
the kernel's `rep movsb` on AMD), and where NumPy's malloc puts two arrays
allocated one after the other (16 bytes apart modulo the page when their
size is a multiple of it) decides whether a benchmark meets that case.

Calls: MPI ``Allreduce``, ``Bcast`` (root 0), ``Allgather``, ``Alltoall``,
``Reduce_scatter_block`` (op SUM); gloo ``all_reduce`` (in place),
``broadcast``, ``all_gather_single``, ``all_to_all_single``,
``reduce_scatter_single``.
"""
import argparse
import os
import sys

if __package__ in (None, ""):  # run as a file: python bench/collectives.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import (KIB, MIB, add_common_args, fail, open_stack, parse_size, say,  # noqa: E402
                          sizes, time_calls, time_each, write_json)

OPS = ("allreduce", "bcast", "allgather", "alltoall", "reduce_scatter")
DTYPES = ("float32", "float64", "int32", "int64", "uint8")


def busbw_factor(op, n):
    """nccl-tests' bus bandwidth factor for ``n`` ranks."""
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op in ("allgather", "reduce_scatter", "alltoall"):
        return (n - 1) / n
    if op == "bcast":
        return 1.0
    raise ValueError("unknown collective %r" % op)


def parse_ops(text):
    ops = [o.strip().lower() for o in text.split(",") if o.strip()]
    for o in ops:
        if o not in OPS:
            raise argparse.ArgumentTypeError("unknown collective %r (choose from %s)"
                                             % (o, ",".join(OPS)))
    return ops


def parse_args(argv=None, default_ops=OPS):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    add_common_args(p)
    p.add_argument("--ops", type=parse_ops, default=list(default_ops),
                   help="comma-separated collectives (default %s)" % ",".join(default_ops))
    p.add_argument("--min-size", type=parse_size, default=4 * KIB,
                   help="smallest size in bytes (default 4KiB)")
    p.add_argument("--max-size", type=parse_size, default=256 * MIB,
                   help="largest size in bytes (default 256MiB)")
    p.add_argument("--warmup", type=int, default=5,
                   help="untimed calls per size, 1..iters (default 5)")
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="element type (default float32)")
    p.add_argument("--timing", choices=("batch", "each"), default="batch",
                   help="batch: repetitions of back-to-back calls (default); each: every "
                        "call alone after a barrier, the median call (OSU style)")
    p.add_argument("--plain", action="store_true",
                   help="MPI stacks: pass bare arrays, not [array, datatype]")
    p.add_argument("--fresh", action="store_true",
                   help="new buffers for every timed call (implies --timing each)")
    p.add_argument("--budget", type=parse_size, default=64 * MIB,
                   help="bytes per repetition; sets iters = budget/size, clamped to "
                        "1..200 (default 64MiB)")
    p.add_argument("--page-offset", type=_offsets, default=None, metavar="S[,R]",
                   help="place the send buffer S bytes and the receive buffer R bytes "
                        "(default S) into a page of their own (0-4095); default: where "
                        "NumPy's malloc puts them, which depends on earlier allocations")
    args = p.parse_args(argv)
    if args.fresh:
        args.timing = "each"
    return args


def _offsets(text):
    parts = [int(x) for x in text.split(",")]
    if not 1 <= len(parts) <= 2 or not all(0 <= x < 4096 for x in parts):
        raise argparse.ArgumentTypeError("S or S,R with each in 0..4095")
    return (parts[0], parts[-1])


def layout(op, nbytes, n, itemsize=4):
    """(send elements, recv elements) for a reported size ``nbytes``."""
    total = max(n, (nbytes // itemsize) // n * n)  # a multiple of n elements
    if op in ("allreduce", "alltoall"):
        return total, total
    if op == "bcast":
        return total, 0
    if op == "allgather":
        return total // n, total
    return total, total // n  # reduce_scatter


def fill_and_expect(op, rank, n, send, recv):
    """Put known values in send; return a function checking recv afterwards
    (values stay below 256: exact in every --dtype)."""
    import numpy as np
    dt = send.dtype
    if op == "allreduce":
        send[:] = rank + 1
        if recv is not send:
            recv[:] = 0
        return lambda: bool(np.all(recv == n * (n + 1) // 2))
    if op == "bcast":
        send[:] = 7 if rank == 0 else 0
        return lambda: bool(np.all(send == 7))
    if op == "allgather":
        send[:] = rank + 1
        recv[:] = 0
        want = np.repeat(np.arange(1, n + 1, dtype=dt), send.size)
        return lambda: bool(np.array_equal(recv, want))
    if op == "alltoall":
        block = send.size // n
        send[:] = np.repeat((rank * n + np.arange(n)) % 251, block)
        recv[:] = 0
        want = np.repeat(((np.arange(n) * n + rank) % 251).astype(dt), block)
        return lambda: bool(np.array_equal(recv, want))
    send[:] = rank + 1  # reduce_scatter
    recv[:] = 0
    return lambda: bool(np.all(recv == n * (n + 1) // 2))


def _maker(stack, op, scount, rcount, dt, fn, fresh, offsets=(None, None)):
    """The calls --timing each times: ``fn`` on the size's buffers, or with
    --fresh the same collective on new buffers each time (at ``offsets``
    into their pages, as --page-offset asks)."""
    if not fresh:
        return lambda: fn

    def make():
        send, send_view = stack.alloc(scount, dt, fresh=True, offset=offsets[0])
        send_view[:] = 1                       # touched, as a program's data is
        recv, _ = (stack.alloc(rcount, dt, fresh=True, offset=offsets[1]) if rcount
                   else (None, None))
        if op == "allreduce" and stack.allreduce_in_place:
            send = recv
        return stack.op(op, send, recv)
    return make


def run(stack, args):
    import numpy as np
    n = stack.size
    dt = np.dtype(args.dtype)
    results = []
    soff, roff = args.page_offset or (None, None)
    bufs = ", fresh buffers" if args.fresh else ""
    if args.page_offset:
        bufs += ", buffers %d,%d bytes into a page" % args.page_offset
    for op in args.ops:
        say(args, stack, "# %s %s, %s, %d processes, timing %s%s\n# %12s %8s %12s %12s %12s"
            % (op, dt.name, stack.library(), n, args.timing, bufs, "bytes", "iters", "time_us",
               "algbw_GBps", "busbw_GBps"))
        for nbytes in sizes(args.min_size, args.max_size):
            scount, rcount = layout(op, nbytes, n, dt.itemsize)
            send, send_view = stack.alloc(scount, dt, offset=soff)
            if rcount:
                recv, recv_view = stack.alloc(rcount, dt, offset=roff)
            else:
                recv, recv_view = None, None
            if op == "allreduce" and stack.allreduce_in_place:
                send, send_view = recv, recv_view
            fn = stack.op(op, send, recv)
            check = fill_and_expect(op, stack.rank, n, send_view, recv_view)
            fn()
            ok = stack.all(check())
            # time on zeros: values stay finite however often they are summed
            send_view[:] = 0
            if recv_view is not None:
                recv_view[:] = 0
            iters = max(1, min(200, args.budget // nbytes))
            if args.timing == "batch":
                t, times, iters = time_calls(stack, fn, iters, min(args.warmup, iters),
                                             args.repeats, args.target_time)
            else:
                t, times, iters = time_each(stack, _maker(stack, op, scount, rcount, dt, fn,
                                                          args.fresh, (soff, roff)),
                                            max(5, min(iters, 50)), min(args.warmup, iters))
            real = (scount if op in ("allreduce", "bcast", "alltoall", "reduce_scatter")
                    else rcount) * dt.itemsize
            algbw = real / t / 1e9
            row = {"op": op, "bytes": real, "dtype": dt.name, "timing": args.timing,
                   "fresh": args.fresh, "page_offset": args.page_offset, "iters": iters,
                   "repeats": args.repeats,
                   "time_us": t * 1e6, "algbw_GBps": algbw,
                   "busbw_GBps": algbw * busbw_factor(op, n), "correct": ok,
                   "time_us_all": [x * 1e6 for x in times]}
            results.append(row)
            say(args, stack, "  %12d %8d %12.1f %12.4f %12.4f%s"
                % (real, iters, row["time_us"], algbw, row["busbw_GBps"],
                   "" if ok else "  WRONG RESULT"))
            del fn, send, recv, send_view, recv_view
    return results


def main(argv=None, default_ops=OPS):
    args = parse_args(argv, default_ops)
    if args.repeats < 1:
        return fail("--repeats must be at least 1")
    stack = open_stack(args.stack)
    stack.plain = args.plain
    settings = stack.settings()
    for key, per_rank in settings.items():
        say(args, stack, "# %s by rank: %s" % (key, ", ".join(map(str, per_rank))))
    results = run(stack, args)
    if stack.rank == 0 and args.json:
        write_json(args.json, "collectives", stack, args, results, settings)
    stack.close()
    bad = [r for r in results if not r["correct"]]
    if bad and stack.rank == 0:
        fail("wrong results: " + ", ".join("%s %d B" % (r["op"], r["bytes"]) for r in bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
