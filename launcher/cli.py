"""``erdmarun``: start an erdmampi job (in the spirit of ``mpiexec``)."""
import argparse
import os
import sys

from . import spawn

__all__ = ["main", "build_parser", "split_argv"]

DESCRIPTION = """\
Start N copies of PROGRAM as the ranks of one erdmampi job (like mpiexec).

erdmarun runs a rendezvous key-value store (TCP) in its own process, starts the
ranks with the environment contract below, forwards their stdout/stderr line by
line, forwards Ctrl-C/SIGTERM to them, and exits with the job's status.
"""

EPILOG = """\
placement:
  Without -H/--hostfile every rank runs on this machine. With hosts, ranks fill
  each host up to its slots, in the order given, wrapping around when N exceeds
  the total (one slot per host when none is given = round-robin). Hosts named
  'localhost' or this machine's host name are started directly; every other
  host (even 127.0.0.1) is reached with
      LAUNCHER_CMD HOST 'cd CWD && env VARS... PROGRAM ARGS...'
  where LAUNCHER_CMD is --launcher-cmd, else $ERDMA_SSH, else
  'ssh -o BatchMode=yes'. Remote ranks get the ERDMA_* variables, --env values,
  PATH, LD_LIBRARY_PATH, PYTHONPATH, VIRTUAL_ENV and the --export names; local
  ranks get the whole environment of erdmarun. Ranks' stdin is /dev/null.

environment of each rank:
  ERDMA_RANK, ERDMA_SIZE           rank in COMM_WORLD and its size
  ERDMA_RENDEZVOUS                 host:port of the job's key-value store
  ERDMA_JOBID                      random job id (prefix of the job's keys)
  ERDMA_LOCAL_RANK, _LOCAL_SIZE    rank among the ranks on the same host
  ERDMA_APPNUM                     0
  ERDMA_UNIVERSE_SIZE              total slots (at least N)

exit status:
  0 when every rank exits 0; otherwise the status of the first rank that
  failed (a rank killed by signal S counts as 128+S), after the others are
  sent SIGTERM and, --kill-grace seconds later, SIGKILL. 124 when --timeout
  expires, 127 when PROGRAM is not found, 2 for bad usage.

examples:
  erdmarun -n 4 python train.py --epochs 3
  erdmarun -n 8 -H node1:4,node2:4 --tag-output python -m mypkg.job
  erdmarun -n 2 --timeout 600 --env ERDMA_CC=bbr -- ./a.out -x
"""

# options that take a value (for splitting erdmarun's options from the program's)
_VALUE_OPTS = {"-n", "-np", "--np", "-H", "--host", "--hosts", "--hostfile", "-f",
               "--machinefile", "--timeout", "--env", "-x", "--export", "--launcher-cmd",
               "--rendezvous-addr", "--wdir", "--kill-grace"}


def build_parser():
    p = argparse.ArgumentParser(
        prog="erdmarun", description=DESCRIPTION, epilog=EPILOG,
        usage="erdmarun [-n N] [-H HOST[:SLOTS],... | --hostfile FILE] [options] [--] PROGRAM [ARGS...]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "-np", "--np", dest="nprocs", type=int, metavar="N",
                   help="number of ranks (default: total slots of the hosts, else 1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("-H", "--host", "--hosts", dest="hosts", metavar="HOST[:SLOTS],...",
                   help="comma-separated hosts, each optionally with ':SLOTS' "
                        "(user@host works too)")
    g.add_argument("--hostfile", "-f", "--machinefile", dest="hostfile", metavar="FILE",
                   help="file with one 'host [slots=N]' per line ('#' comments)")
    p.add_argument("--tag-output", "-l", "--prepend-rank", dest="tag_output",
                   action="store_true",
                   help="prefix every output line with '[RANK] ' (stdout and stderr)")
    p.add_argument("--timeout", type=float, metavar="SEC",
                   help="kill the job after SEC seconds and exit with status 124")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set K=V in every rank's environment (repeatable)")
    p.add_argument("-x", "--export", action="append", default=[], metavar="NAME",
                   help="also send erdmarun's variable NAME to remote ranks (repeatable)")
    p.add_argument("--launcher-cmd", metavar="CMD",
                   help="command that starts remote ranks, e.g. 'ssh -p 2222 -i KEY' "
                        "(default: $ERDMA_SSH, else 'ssh -o BatchMode=yes'; "
                        "BatchMode=yes is added to ssh commands that lack it)")
    p.add_argument("--rendezvous-addr", metavar="HOST[:PORT]",
                   help="address the ranks use to reach the store (default: 127.0.0.1 "
                        "for local jobs, the address routing to the first remote host "
                        "otherwise); with PORT the store listens on that port")
    p.add_argument("--wdir", metavar="DIR",
                   help="working directory of the ranks (default: the current one; "
                        "it must exist on remote hosts)")
    p.add_argument("--kill-grace", type=float, default=5.0, metavar="SEC",
                   help="seconds between SIGTERM and SIGKILL on teardown (default 5)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print the store address and each rank's command")
    p.add_argument("--version", action="version", version=_version())
    return p


def _version():
    try:
        from importlib.metadata import version
        return f"erdmarun (erdmampi {version('erdmampi')})"
    except Exception:
        return "erdmarun (erdmampi, version unknown)"


def split_argv(argv):
    """Split ``argv`` into erdmarun's options and ``[PROGRAM, ARGS...]``.

    erdmarun's options end at ``--`` or at the first word that is not an option
    (or an option's value), so the program's own options are never parsed here.
    """
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], argv[i + 1:]
        if not a.startswith("-") or a == "-":
            return argv[:i], argv[i:]
        if a in _VALUE_OPTS:
            i += 2
            continue
        i += 1
    return argv, []


def _parse_env(items, parser):
    env = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            parser.error(f"--env needs K=V, got {item!r}")
        env[k] = v
    return env


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    opts, program = split_argv(argv)
    parser = build_parser()
    a = parser.parse_args(opts)
    if not program:
        parser.error("no PROGRAM given (try: erdmarun -n 2 python script.py)")
    if a.nprocs is not None and a.nprocs < 1:
        parser.error(f"-n must be at least 1, got {a.nprocs}")
    if a.timeout is not None and a.timeout <= 0:
        parser.error(f"--timeout must be positive, got {a.timeout:g}")
    if a.kill_grace < 0:
        parser.error("--kill-grace must not be negative")
    env = _parse_env(a.env, parser)
    try:
        hosts = None
        if a.hosts:
            hosts = spawn.parse_hosts(a.hosts)
        elif a.hostfile:
            hosts = spawn.parse_hostfile(a.hostfile)
        nprocs = a.nprocs
        if nprocs is None:
            nprocs = sum(h.slots for h in hosts) if hosts else 1
        if a.wdir and not hosts and not os.path.isdir(a.wdir):
            raise spawn.JobError(f"--wdir {a.wdir!r} is not a directory")
        job = spawn.Job(program, nprocs, hosts=hosts, env=env, exports=a.export,
                        tag_output=a.tag_output, timeout=a.timeout, grace=a.kill_grace,
                        launcher_cmd=a.launcher_cmd, rendezvous_addr=a.rendezvous_addr,
                        wdir=a.wdir, verbose=a.verbose)
        return job.run()
    except spawn.JobError as e:
        sys.stderr.write(f"erdmarun: error: {e}\n")
        return e.code


if __name__ == "__main__":
    sys.exit(main())
