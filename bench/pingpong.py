"""OSU-style ping-pong between ranks 0 and 1: latency and bandwidth.

The same module runs on the three stacks (see bench/common.py):

    erdmarun -n 2 python -m bench.pingpong
    mpiexec.mpich -n 2 python -m bench.pingpong
    python -m bench.gloorun -n 2 python -m bench.pingpong

For each message size (8 B to 64 MiB, doubling), rank 0 sends a uint8 buffer
to rank 1, which sends it back (blocking Send/Recv; torch.distributed
send/recv for gloo). After warm-up round trips, ``--repeats`` repetitions of
``iters`` round trips are timed, each after a barrier (iters = budget/size
clamped to 1..1000, lowered to about --target-time seconds per repetition
going by the warm-up). The one-way latency of a repetition is the slower of
ranks 0 and 1's time / (2 * iters); the reported latency is the median over
repetitions and the bandwidth is size / latency (10^9 bytes/s).
Ranks other than 0 and 1 only take part in the barriers.

``--buffers`` chooses what is sent.  ``one`` (default): each rank sends the
buffer it has just received into, so the data is in the sender's cache, as
in a program that forwards what it got.  ``two``: a send buffer apart from
the receive buffer, never changed (OSU's latency test); the receiver's
cache may still hold its lines from the last round trip, which favours a
receiver that reads the sender's memory directly (CMA).  ``rewrite``: as
``two``, but each rank rewrites its whole send buffer before every send,
as a program sends data it has just computed (the rewrite is in the time,
the same on every stack).
"""
import argparse
import os
import sys

if __package__ in (None, ""):  # run as a file: python bench/pingpong.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import (MIB, add_common_args, fail, open_stack, parse_size, say,  # noqa: E402
                          sizes, time_calls, write_json)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    add_common_args(p)
    p.add_argument("--min-size", type=parse_size, default=8, help="smallest message (default 8)")
    p.add_argument("--max-size", type=parse_size, default=64 * MIB,
                   help="largest message (default 64MiB)")
    p.add_argument("--buffers", choices=("one", "two", "rewrite"), default="one",
                   help="what is sent (see below; default one)")
    p.add_argument("--warmup", type=int, default=10,
                   help="untimed round trips per size, 1..iters (default 10)")
    p.add_argument("--budget", type=parse_size, default=32 * MIB,
                   help="bytes sent one way per repetition; sets iters = budget/size, "
                        "clamped to 1..1000 (default 32MiB)")
    return p.parse_args(argv)


def run(stack, args):
    import numpy as np
    rank = stack.rank
    results = []
    say(args, stack, "# pingpong, %s, %d processes, ranks 0 <-> 1\n# %12s %8s %14s %14s"
        % (stack.library(), stack.size, "bytes", "iters", "latency_us", "bandwidth_GBps"))
    for size in sizes(args.min_size, args.max_size):
        buf, view = stack.alloc(size, np.uint8)
        view[:] = np.arange(size) % 251                   # data, not zero pages
        sbuf = sview = buf
        if args.buffers != "one":
            sbuf, sview = stack.alloc(size, np.uint8)
            sview[:] = np.arange(size) % 241
        touch = _rewriter(sview) if args.buffers == "rewrite" else None
        if rank in (0, 1):
            send, recv = stack.send(sbuf, 1 - rank), stack.recv(buf, 1 - rank)
            if touch is None:
                step = _step(rank, send, recv)
            else:
                def send_new(send=send, touch=touch):
                    touch()
                    send()
                step = _step(rank, send_new, recv)
        else:
            def step():
                pass
        iters = max(1, min(1000, args.budget // size))
        t, times, iters = time_calls(stack, step, iters, min(args.warmup, iters), args.repeats,
                                     args.target_time)
        times = [x / 2 for x in times]
        if rank == 0:
            lat = t / 2
            row = {"op": "pingpong", "bytes": size, "iters": iters, "repeats": args.repeats,
                   "latency_us": lat * 1e6, "bandwidth_GBps": size / lat / 1e9,
                   "latency_us_all": [t * 1e6 for t in times]}
            results.append(row)
            say(args, stack, "  %12d %8d %14.2f %14.4f"
                % (size, iters, row["latency_us"], row["bandwidth_GBps"]))
        del buf, view, sbuf, sview
    return results


def _step(rank, send, recv):
    """One round trip: rank 0 sends first, rank 1 answers."""
    if rank == 0:
        def step():
            send()
            recv()
    else:
        def step():
            recv()
            send()
    return step


def _rewriter(view):
    """A call that rewrites every byte of ``view`` (8 bytes at a time where
    it can): the sender's fresh data for --buffers rewrite."""
    import numpy as np
    words = view[:view.size // 8 * 8].view(np.uint64)
    tail = view[words.size * 8:]

    def touch():
        np.add(words, 1, out=words)
        if tail.size:
            np.add(tail, 1, out=tail)
    return touch


def main(argv=None):
    args = parse_args(argv)
    if args.repeats < 1:
        return fail("--repeats must be at least 1")
    stack = open_stack(args.stack)
    if stack.size < 2:
        if stack.rank == 0:
            fail("pingpong needs at least 2 processes")
        return 2
    results = run(stack, args)
    if stack.rank == 0 and args.json:
        write_json(args.json, "pingpong", stack, args, results)
    stack.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
