"""Start N local processes of a torch.distributed (gloo) job, like a minimal torchrun.

    python -m bench.gloorun -n 4 python -m bench.collectives

Each process gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR
(127.0.0.1), MASTER_PORT (a free port; rank 0 serves torch's TCP store there),
GLOO_SOCKET_IFNAME=lo and OMP_NUM_THREADS=1 unless already set. When a process
fails the others are terminated; the exit status is the first failure's
(128+S for a signal S), 124 after --timeout.
"""
import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m bench.gloorun",
                                description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--np", type=int, required=True, help="number of processes")
    p.add_argument("--timeout", type=float, default=None, help="seconds before the job is killed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="program and arguments")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.np < 1 or not cmd:
        p.error("need -n N >= 1 and a command")

    port = free_port()
    procs = []
    for rank in range(args.np):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.np), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.np), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            procs.append(subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL))
        except OSError as e:
            print("gloorun: cannot start %s: %s" % (cmd[0], e), file=sys.stderr)
            _stop(procs)
            return 127

    def on_signal(signum, frame):
        _stop(procs)
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    status = 0
    while True:
        codes = [q.poll() for q in procs]
        failed = [c for c in codes if c not in (None, 0)]
        if failed:
            c = failed[0]
            status = 128 - c if c < 0 else c
            print("gloorun: a process exited with %d; stopping the others" % status,
                  file=sys.stderr)
            _stop(procs)
            break
        if all(c == 0 for c in codes):
            break
        if deadline is not None and time.monotonic() > deadline:
            print("gloorun: timeout after %g s" % args.timeout, file=sys.stderr)
            _stop(procs)
            status = 124
            break
        time.sleep(0.05)
    return status


def _stop(procs, grace=3.0):
    for q in procs:
        if q.poll() is None:
            q.terminate()
    end = time.monotonic() + grace
    for q in procs:
        try:
            q.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            q.kill()
            q.wait()


if __name__ == "__main__":
    sys.exit(main())
