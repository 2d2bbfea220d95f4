"""``erdmarun``: start an erdmampi job (in the spirit of ``mpiexec``)."""
import argparse
import os
import sys

from erdmampi import config

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
  expires, 127 when PROGRAM is not found, 2 for bad usage, 77 when the
  rendezvous refuses the job's secret.

joining one job from several sites (docs/internet.md):
  Run erdmarun on each site with the same --job-id, -n and secret. Each starts
  its share of the ranks (--local-n K: the next K free ranks, contiguous;
  --ranks A-B: exactly those) and they meet at a rendezvous store every site
  reaches (--rendezvous HOST:PORT, e.g. one started with --serve-rendezvous)
  or, without any server, in a Kademlia DHT (--dht PEERS, each site's erdmarun
  runs a node: --dht-listen). The secret (--secret-file FILE, else
  $ERDMA_JOB_SECRET / $ERDMA_JOB_SECRET_FILE; make one with
  'python -m erdmampi.jobauth') authenticates the job to the store and seals
  its records; erdmarun refuses to join without one unless --insecure. If some
  ranks have not joined within --connect-timeout seconds, every site stops
  with status 124 and names the missing ranks.

environment of each rank (also):
  ERDMA_JOB_SECRET                 the job secret (a fresh one for local/ssh
                                   jobs; ssh ranks read it from stdin, never
                                   from the command line)
  ERDMA_INSECURE                   1 with --insecure: ranks may bootstrap without a
                                   secret (they refuse to otherwise)

diagnostics:
  --env ERDMA_VERBOSE=1   each rank prints one start-up line: version, bind
                          address, congestion control, compression, and its
                          route to each peer (shm / direct / relay); 2: per peer
  --env ERDMA_STATS=1     each rank prints its traffic counters and per-peer
                          RTT/congestion figures when it finalizes
  erdmarun --dump <pid of erdmarun> (or kill -USR1 it), or --timeout expiring:
                          every rank prints its Python stacks and pending
                          operations (peer, tag, size)
  an uncaught exception on one rank ends the job (ERDMA_ABORT_ON_EXCEPTION=0:
                          keep Python's plain exit)

examples:
  erdmarun -n 4 python train.py --epochs 3
  erdmarun -n 8 -H node1:4,node2:4 --tag-output python -m mypkg.job
  erdmarun -n 2 --timeout 600 --env ERDMA_CC=bbr -- ./a.out -x
  erdmarun --serve-rendezvous 0.0.0.0:29500 --require-auth --admit-file job.key
  erdmarun --rendezvous rdv.example.org:29500 --job-id run42 --secret-file job.key \\
           -n 8 --local-n 4 python train.py              (on each of two sites)
  erdmarun --dht-listen 0.0.0.0:29600 --dht siteB:29600 --job-id run42 \\
           --secret-file job.key -n 8 --ranks 0-3 python train.py
"""

# Options of other launchers that erdmarun cannot honour, with what to do
# instead (the value each takes, so the split still finds the program).
_NO_PINNING = ("erdmarun does not pin ranks to cores; start the program under taskset or "
               "numactl, e.g. erdmarun -n 2 numactl -N 0 python x.py")
_EXPLAINED = {
    "--bind-to": (1, _NO_PINNING),
    "-bind-to": (1, _NO_PINNING),
    "--mca": (2, "Open MPI's MCA parameters mean nothing to erdmampi; its settings are "
                 "ERDMA_* variables (docs/guide/tuning.md), passed with --env K=V"),
    "--report-bindings": (0, "erdmarun does not pin ranks to cores, so there are no "
                             "bindings to report"),
}


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviations, naming the nearest option on a typo."""

    def __init__(self, **kw):
        super().__init__(allow_abbrev=False, **kw)

    def error(self, message):
        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            import difflib
            known = [s for a in self._actions for s in a.option_strings]
            for word in message[len(prefix):].split():
                opt = word.split("=", 1)[0]
                if not opt.startswith("-"):
                    continue
                if opt in _EXPLAINED:
                    message = f"{opt} is not supported: {_EXPLAINED[opt][1]}"
                    break
                near = difflib.get_close_matches(opt, known, n=1, cutoff=0.6)
                if near:
                    message = f"unrecognized option {opt} (did you mean {near[0]}?)"
                    break
        super().error(message)


def build_parser():
    p = _Parser(
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
                   help="after SEC seconds print every rank's stack and pending operations, "
                        "end the job and exit with status 124 (default $MPIEXEC_TIMEOUT)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="set K=V in every rank's environment (repeatable)")
    p.add_argument("-genv", dest="genv", action="append", default=[], nargs=2,
                   metavar=("K", "V"), help="MPICH's form of --env K=V (repeatable)")
    p.add_argument("-x", "--export", action="append", default=[], metavar="NAME[=VALUE]",
                   help="also send erdmarun's variable NAME to remote ranks; NAME=VALUE "
                        "sets it in every rank, as Open MPI's -x does (repeatable)")
    p.add_argument("-ppn", "-N", "--npernode", dest="ppn", type=int, metavar="N",
                   help="ranks per host (MPICH -ppn, Open MPI -N): each host gets N slots; "
                        "-n defaults to N times the number of hosts")
    p.add_argument("--map-by", metavar="HOW",
                   help="placement, as Open MPI names it: 'slot' (default: fill each host's "
                        "slots in order), 'node' (one rank per host in turn) or 'ppr:N:node' "
                        "(N ranks per host, as -ppn N)")
    p.add_argument("--oversubscribe", action="store_true",
                   help="accepted for Open MPI's command lines: erdmarun always lets -n "
                        "exceed the slots (placement wraps around the hosts)")
    p.add_argument("--allow-run-as-root", action="store_true",
                   help="accepted for Open MPI's command lines (erdmarun runs as any user)")
    for opt, (nvals, why) in _EXPLAINED.items():
        dest = "explained_" + opt.strip("-").replace("-", "_")
        if nvals:
            p.add_argument(opt, dest=dest, nargs=nvals, action="append", help=argparse.SUPPRESS)
        else:
            p.add_argument(opt, dest=dest, action="store_true", help=argparse.SUPPRESS)
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
    j = p.add_argument_group("joining one job from several sites")
    j.add_argument("--rendezvous", metavar="HOST:PORT",
                   help="join job --job-id at this rendezvous store (shared by all sites)")
    j.add_argument("--dht", metavar="HOST:PORT[,...]",
                   help="join job --job-id through the Kademlia DHT, bootstrapping from these "
                        "peers (other sites' --dht-listen addresses, or --serve-dht nodes)")
    j.add_argument("--dht-listen", metavar="HOST:PORT", default=None,
                   help="UDP address of this site's DHT node (default 0.0.0.0:0; give a fixed "
                        "port so other sites can bootstrap from it)")
    j.add_argument("--job-id", metavar="ID",
                   help="the job's id: the same on every site (use a fresh one per run)")
    j.add_argument("--local-n", type=int, metavar="K",
                   help="start K ranks here: the next K free ranks of the job "
                        "(--rendezvous only; default -n)")
    j.add_argument("--ranks", metavar="A-B",
                   help="start exactly ranks A..B here (needed with --dht)")
    j.add_argument("--secret-file", metavar="FILE",
                   help="file holding the job secret as hex (default $ERDMA_JOB_SECRET, "
                        "$ERDMA_JOB_SECRET_FILE)")
    j.add_argument("--insecure", action="store_true",
                   help="run without authentication: sets ERDMA_INSECURE=1 in the ranks "
                        "(they bootstrap without a job secret, with a warning) and lets a "
                        "join go without one; anyone who reaches the rendezvous can then "
                        "read and forge the job's records")
    j.add_argument("--connect-timeout", type=float, metavar="SEC",
                   help="seconds the other sites have to join, also the ranks' "
                        "ERDMA_CONNECT_TIMEOUT (default $ERDMA_CONNECT_TIMEOUT, else 60)")
    s = p.add_argument_group("servers (no PROGRAM)")
    s.add_argument("--serve-rendezvous", metavar="HOST:PORT",
                   help="run a standalone rendezvous store for any number of jobs until "
                        "SIGINT/SIGTERM (prints host:port once listening)")
    s.add_argument("--require-auth", action="store_true",
                   help="with --serve-rendezvous: serve only jobs that prove a secret "
                        "given with --admit-file")
    s.add_argument("--admit-file", action="append", default=[], metavar="FILE",
                   help="with --serve-rendezvous: hex job secrets, one a line; only jobs "
                        "with one of them may create a job space (repeatable; see "
                        "python -m erdmampi.launcher.store_server --help for the limits)")
    s.add_argument("--job-ttl", type=float, default=24 * 3600.0, metavar="SEC",
                   help="with --serve-rendezvous: forget a job's records after SEC idle "
                        "seconds (default 86400)")
    s.add_argument("--dump", type=int, metavar="PID",
                   help="ask the running job of erdmarun PID where its ranks are: each rank "
                        "prints its Python stacks and pending operations (the job goes on)")
    s.add_argument("--serve-dht", metavar="HOST:PORT",
                   help="run a standalone DHT node (a bootstrap peer for --dht) until "
                        "SIGINT/SIGTERM; --dht adds peers to join")
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


def _value_counts(parser):
    """How many words each of the parser's options takes (None: optional value)."""
    counts = {}
    for act in parser._actions:
        n = act.nargs
        k = 0 if n == 0 else 1 if n is None else n if isinstance(n, int) else None
        for opt in act.option_strings:
            counts[opt] = k
    return counts


def split_argv(argv, parser=None):
    """Split ``argv`` into erdmarun's options and ``[PROGRAM, ARGS...]``.

    erdmarun's options end at ``--`` or at the first word that is not an option
    (or an option's value), so the program's own options are never parsed here.
    Which options take values comes from the parser itself.
    """
    counts = _value_counts(parser or build_parser())
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], argv[i + 1:]
        if not a.startswith("-") or a == "-":
            return argv[:i], argv[i:]
        if "=" in a and a.startswith("--"):
            i += 1
            continue
        n = counts.get(a, 0)
        i += 1 + (n or 0)
    return argv, []


def _parse_env(items, parser):
    env = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k:
            parser.error(f"--env needs K=V, got {item!r}")
        env[k] = v
    return env


def _hostport(text, what, parser, default_host="0.0.0.0"):
    host, sep, port = str(text).rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isdigit() or not 0 <= int(port) < 65536:
        parser.error(f"{what} takes HOST:PORT, got {text!r}")
    return host.strip("[]") or default_host, int(port)


def _serve_dht(a, parser):
    import signal
    import threading
    from erdmampi.dht import DhtNode, DhtError
    host, port = _hostport(a.serve_dht, "--serve-dht", parser)
    try:
        node = DhtNode(host, port)
    except DhtError as e:
        sys.stderr.write(f"erdmarun: error: {e}\n")
        return 1
    stop = threading.Event()
    old = {sig: signal.signal(sig, lambda *_: stop.set())
           for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"{node.address[0]}:{node.address[1]}", flush=True)
        if a.dht:
            try:
                node.bootstrap(a.dht, _connect_timeout(a, parser))
            except (TimeoutError, ValueError) as e:
                sys.stderr.write(f"erdmarun: warning: {e}; serving alone until a peer "
                                 f"contacts this node\n")
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        node.close()


def _connect_timeout(a, parser):
    t = a.connect_timeout
    if t is None:
        try:
            t = config.get("ERDMA_CONNECT_TIMEOUT")
        except config.ConfigError as e:
            parser.error(str(e))
    if t <= 0:
        parser.error("--connect-timeout must be positive")
    return t


def _join(a, program, env, hosts, parser):
    """erdmarun --rendezvous/--dht --job-id: start this site's share of a job."""
    from erdmampi import discovery, jobauth
    from erdmampi.rendezvous import StoreAuthError, StoreError
    if a.nprocs is None:
        parser.error("joining a job needs -n N (the job's total number of ranks, the same "
                     "on every site)")
    if not a.job_id:
        parser.error("--rendezvous/--dht need --job-id ID (the same on every site)")
    if a.local_n is not None and a.ranks:
        parser.error("give either --local-n or --ranks, not both")
    n = a.nprocs
    try:
        first = None
        count = a.local_n if a.local_n is not None else n
        if a.ranks:
            first, count = discovery.parse_ranks(a.ranks, n)
        if not 1 <= count <= n:
            parser.error(f"--local-n must be between 1 and -n ({n}), got {count}")
        secret = (jobauth.read_secret_file(a.secret_file) if a.secret_file
                  else jobauth.load_secret(os.environ))
    except ValueError as e:
        parser.error(str(e))
    if secret is None and not a.insecure:
        parser.error("joining a job across machines needs the job's secret: --secret-file "
                     "FILE or ERDMA_JOB_SECRET (make one with: python -m erdmampi.jobauth); "
                     "--insecure joins without one (anyone who reaches the rendezvous can "
                     "then read and forge the job's records)")
    timeout = _connect_timeout(a, parser)
    node = proxy = store = join = None
    say = lambda msg: sys.stderr.write(f"erdmarun: {msg}\n")  # noqa: E731
    try:
        if a.rendezvous:
            try:
                store = discovery.store_for(a.job_id, secret, rendezvous=a.rendezvous,
                                            timeout=timeout)
            except ValueError as e:
                parser.error(str(e))
            rank_rdv = a.rendezvous
        else:
            if hosts and not all(spawn.is_local_host(h.name) for h in hosts):
                parser.error("with --dht every rank of a site runs on the machine of its "
                             "erdmarun (run one erdmarun per machine, or use --rendezvous)")
            from erdmampi.dht import DhtError, DhtNode, parse_peers
            host, port = _hostport(a.dht_listen or "0.0.0.0:0", "--dht-listen", parser)
            try:
                node = DhtNode(host, port)
            except DhtError as e:
                raise spawn.JobError(str(e), 1) from None
            if a.verbose or a.dht_listen is None:
                say(f"DHT node of this site listening on {node.address[0]}:{node.address[1]}")
            try:
                node.bootstrap(a.dht or "", timeout)
            except ValueError as e:
                parser.error(str(e))
            except TimeoutError as e:
                raise spawn.JobError(f"cannot join the DHT: {e}", spawn.EXIT_JOIN) from None
            proxy = discovery.DhtStoreServer(node, a.job_id, secret).start()
            if config.get("ERDMA_BIND", {**os.environ, **env}) is None:
                # the ranks' store is on loopback: bind them where the other sites are
                peers = parse_peers(a.dht or "")
                if host not in ("0.0.0.0", ""):
                    env["ERDMA_BIND"] = host
                elif peers:
                    env["ERDMA_BIND"] = spawn.route_address(peers[0][0])
            store = discovery.store_for(a.job_id, secret, dht_node=node, timeout=timeout)
            rank_rdv = proxy.address
        job = spawn.Job(program, count, hosts=hosts, env=env, exports=a.export,
                        tag_output=a.tag_output, timeout=a.timeout, grace=a.kill_grace,
                        launcher_cmd=a.launcher_cmd, wdir=a.wdir, verbose=a.verbose,
                        world_size=n, first_rank=0, rendezvous=rank_rdv, jobid=a.job_id,
                        secret=secret.hex() if secret else "",
                        rank_env={"ERDMA_CONNECT_TIMEOUT": f"{timeout:g}"})
        job.check()                       # before taking ranks that could not be started
        try:
            first, count = discovery.claim_ranks(store, n, count=count, first=first)
        except ValueError as e:
            raise spawn.JobError(f"job {a.job_id}: {e}") from None
        if a.verbose:
            say(f"job {a.job_id}: this site runs ranks {first}-{first + count - 1} of {n}")
        job.first_rank = first
        job.join = join = discovery.JoinWatch(store, n, first, count, timeout, jobid=a.job_id,
                                              progress=say)
        store = None                      # the JoinWatch closes it
        return job.run()
    except StoreAuthError as e:
        raise spawn.JobError(f"job {a.job_id}: {e}", spawn.EXIT_AUTH) from None
    except (ConnectionError, StoreError) as e:
        raise spawn.JobError(f"job {a.job_id}: {e}", spawn.EXIT_JOIN) from None
    finally:
        if join is not None:
            join.close()
        if store is not None:
            store.close()
        if proxy is not None:
            proxy.close()
        if node is not None:
            node.close()


def _dump(pid):
    """erdmarun --dump PID: SIGUSR1 to a running erdmarun, which forwards it to
    its ranks (erdmampi.stackdump prints where each one is)."""
    import signal
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        sys.stderr.write(f"erdmarun: error: no process {pid}\n")
        return 1
    if "erdmarun" not in cmd and "erdmampi.launcher" not in cmd:
        sys.stderr.write(f"erdmarun: error: process {pid} is not erdmarun ({cmd.strip()[:80]})\n")
        return 1
    os.kill(pid, signal.SIGUSR1)
    sys.stderr.write(f"erdmarun: asked the job of erdmarun {pid} for its ranks' stacks "
                     f"(they print on that job's stderr)\n")
    return 0


def _check_config(env, parser):
    """Every ERDMA_* value the ranks will see, checked before any rank starts."""
    errors, warnings = config.validate({**os.environ, **env})
    for w in warnings:
        sys.stderr.write(f"erdmarun: warning: {w}\n")
    if errors:
        parser.error("; ".join(errors) + " (docs/config.md lists every variable)")


def _placement(a, hosts, parser):
    """Apply -ppn and --map-by to the host list (None: this host only)."""
    how = (a.map_by or "slot").lower()
    ppn = a.ppn
    if how.startswith("ppr:"):
        parts = how.split(":")
        if len(parts) != 3 or not parts[1].isdigit() or parts[2] != "node":
            parser.error(f"--map-by {a.map_by}: erdmarun understands ppr:N:node only")
        ppn = int(parts[1])
        how = "slot"
    if how not in ("slot", "node"):
        parser.error(f"--map-by {a.map_by} is not supported: erdmarun places ranks by host "
                     f"('slot', 'node' or 'ppr:N:node') and does not pin them to cores")
    if ppn is not None and ppn < 1:
        parser.error(f"ranks per host must be at least 1, got {ppn}")
    a.ppn = ppn
    if hosts and ppn:
        hosts = [spawn.Host(h.name, ppn, True) for h in hosts]
    if hosts and how == "node":
        # one rank per host in turn: the fill of one-slot hosts wraps around
        nslots = sum(h.slots for h in hosts)
        if a.nprocs is None:
            a.nprocs = nslots
        hosts = [spawn.Host(h.name, 1, True) for h in hosts]
    return hosts


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    opts, program = split_argv(argv, parser)
    a = parser.parse_args(opts)
    for opt, (_, why) in _EXPLAINED.items():
        if getattr(a, "explained_" + opt.strip("-").replace("-", "_"), None):
            parser.error(f"{opt} is not supported: {why}")
    if a.serve_rendezvous:
        from .store_server import serve, server_options
        host, port = _hostport(a.serve_rendezvous, "--serve-rendezvous", parser)
        try:
            admit, limits = server_options(a)
        except ValueError as e:
            parser.error(str(e))
        return serve(host, port, require_auth=a.require_auth,
                     job_ttl=a.job_ttl if a.job_ttl and a.job_ttl > 0 else None,
                     admit=admit, **limits)
    if a.serve_dht:
        return _serve_dht(a, parser)
    if a.dump is not None:
        return _dump(a.dump)
    if a.rendezvous and a.dht:
        parser.error("give either --rendezvous or --dht, not both")
    joining = bool(a.rendezvous) or a.dht is not None or a.dht_listen is not None
    if not joining:
        for opt, val in (("--job-id", a.job_id), ("--local-n", a.local_n),
                         ("--ranks", a.ranks), ("--secret-file", a.secret_file)):
            if val is not None:
                parser.error(f"{opt} is for joining a job: add --rendezvous HOST:PORT or "
                             f"--dht PEERS")
    if not program:
        parser.error("no PROGRAM given (try: erdmarun -n 2 python script.py)")
    if a.nprocs is not None and a.nprocs < 1:
        parser.error(f"-n must be at least 1, got {a.nprocs}")
    if a.timeout is not None and a.timeout <= 0:
        parser.error(f"--timeout must be positive, got {a.timeout:g}")
    if a.kill_grace < 0:
        parser.error("--kill-grace must not be negative")
    if a.timeout is None and os.environ.get("MPIEXEC_TIMEOUT"):
        text = os.environ["MPIEXEC_TIMEOUT"]
        try:
            a.timeout = float(text)
        except ValueError:
            parser.error(f"MPIEXEC_TIMEOUT={text!r} is not a number of seconds")
        if a.timeout <= 0:
            a.timeout = None            # MPICH: 0 means no limit
    env = _parse_env(a.env + [f"{k}={v}" for k, v in a.genv], parser)
    _check_config(env, parser)
    exports = []
    for item in a.export:               # Open MPI: -x NAME=VALUE sets it too
        name, eq, value = item.partition("=")
        if not name:
            parser.error(f"-x needs NAME or NAME=VALUE, got {item!r}")
        if eq:
            env[name] = value
        exports.append(name)
    a.export = exports
    if a.insecure:
        from erdmampi.jobauth import INSECURE_ENV
        env[INSECURE_ENV] = "1"
    try:
        hosts = None
        if a.hosts:
            hosts = spawn.parse_hosts(a.hosts)
        elif a.hostfile:
            hosts = spawn.parse_hostfile(a.hostfile)
        hosts = _placement(a, hosts, parser)
        nprocs = a.nprocs
        if nprocs is None:
            nprocs = sum(h.slots for h in hosts) if hosts else (a.ppn or 1)
        elif not hosts and a.ppn and nprocs > a.ppn:
            parser.error(f"-n {nprocs} ranks do not fit {a.ppn} per host on this one host "
                         f"(add hosts with -H, or drop -ppn)")
        if a.wdir and not hosts and not os.path.isdir(a.wdir):
            raise spawn.JobError(f"--wdir {a.wdir!r} is not a directory")
        if joining:
            return _join(a, program, env, hosts, parser)
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
