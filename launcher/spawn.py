"""Start the ranks of a job, forward their output and signals, aggregate exit codes.

Pure Python; imports :mod:`erdmampi.rendezvous` (through the store server) only.
The launcher and the ranks talk through environment variables (docs/launcher.md).
"""
import errno
import functools
import os
import queue
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

from erdmampi import config
from erdmampi.jobauth import SECRET_ENV, SECRET_FILE_ENV, generate_secret

from .store_server import StoreServer

__all__ = ["Host", "Job", "JobError", "EXIT_JOIN", "parse_hosts", "parse_hostfile", "assign_hosts",
           "is_local_host", "route_address", "remote_command", "EXIT_TIMEOUT"]

EXIT_TIMEOUT = 124
EXIT_NOT_FOUND = 127
EXIT_CANNOT_EXEC = 126
DUMP_WAIT = 2.0          # seconds the ranks get to print their stacks on --timeout
EXIT_JOIN = 124          # another site's ranks did not join within the connect timeout
EXIT_AUTH = 77           # the rendezvous refused the job's secret (sysexits' EX_NOPERM)
DEFAULT_SSH = "ssh -o BatchMode=yes"

#: Parent variables handed to remote ranks (besides every ERDMA_* variable and --export NAME).
REMOTE_EXPORTS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV",
                  "PYTHONUNBUFFERED", "PYTHONHASHSEED", "OMP_NUM_THREADS")


class JobError(Exception):
    """Bad launcher input (hosts, program); the message is meant for the user."""

    def __init__(self, message, code=2):
        super().__init__(message)
        self.code = code


# -- hosts -------------------------------------------------------------------

@dataclass
class Host:
    name: str          # as given, may be user@host
    slots: int = 1
    explicit_slots: bool = False

    @property
    def address(self):
        """Host part without ``user@``."""
        return self.name.rpartition("@")[2]


def _split_host(item):
    item = item.strip()
    if item.startswith("[") or "@[" in item:            # [v6] or user@[v6], optional :slots
        head, _, rest = item.partition("]")
        slots = rest[1:] if rest.startswith(":") else ""
        return head.replace("[", "") , slots
    name, sep, slots = item.rpartition(":")
    if not sep:
        return item, ""
    return name, slots


def parse_hosts(spec):
    """``"a:2,b,c:4"`` -> ``[Host('a', 2), Host('b', 1), Host('c', 4)]``."""
    hosts = []
    for item in spec.split(","):
        if not item.strip():
            continue
        name, slots = _split_host(item)
        if slots:
            try:
                n = int(slots)
            except ValueError:
                raise JobError(f"bad host entry {item.strip()!r}: slots after ':' must be a number") from None
            if n < 1:
                raise JobError(f"bad host entry {item.strip()!r}: slots must be at least 1")
            hosts.append(Host(name, n, True))
        else:
            hosts.append(Host(name))
    if not hosts:
        raise JobError(f"no hosts in {spec!r}")
    return hosts


def parse_hostfile(path):
    """Lines ``host [slots=N]`` (``host:N`` also accepted); ``#`` starts a comment."""
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        raise JobError(f"cannot read hostfile {path!r}: {e.strerror}") from None
    hosts = []
    for lineno, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        host = parse_hosts(words[0])[0]
        for w in words[1:]:
            key, eq, val = w.partition("=")
            if key in ("slots", "max_slots", "max-slots") and eq:
                try:
                    n = int(val)
                except ValueError:
                    n = 0
                if n < 1:
                    raise JobError(f"{path}:{lineno}: bad {key} value {val!r}")
                if key == "slots":
                    host.slots, host.explicit_slots = n, True
            else:
                raise JobError(f"{path}:{lineno}: unknown hostfile attribute {w!r} "
                               f"(expected 'host [slots=N]')")
        hosts.append(host)
    if not hosts:
        raise JobError(f"hostfile {path!r} lists no hosts")
    return hosts


def assign_hosts(n, hosts):
    """Host of each rank: fill each host up to its slots, in order, wrapping around.

    With no slots given this is round-robin (every host has one slot).
    """
    out = []
    while len(out) < n:
        for h in hosts:
            take = min(h.slots, n - len(out))
            out.extend([h] * take)
            if len(out) == n:
                break
    return out


def is_local_host(name):
    """True for ``localhost`` and this machine's host name: those ranks are started directly.

    Any other name or address (even ``127.0.0.1``) goes through the ssh launcher.
    """
    return "@" not in name and name in _local_names()


@functools.lru_cache(maxsize=1)
def _local_names():
    local = {"localhost", socket.gethostname(), socket.gethostname().split(".")[0]}
    try:
        local.add(socket.getfqdn())
    except OSError:
        pass
    return frozenset(local)


def route_address(host):
    """The local address the kernel would use to reach ``host`` (no packet is sent)."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except socket.gaierror as e:
        raise JobError(f"cannot resolve host {host!r}: {e.strerror}") from None
    last = None
    for family, _, _, _, sa in infos:
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.connect(sa)
            return s.getsockname()[0]
        except OSError as e:
            last = e
        finally:
            s.close()
    raise JobError(f"no route to host {host!r}: {last}")


# -- ranks -------------------------------------------------------------------

def remote_command(cwd, env, argv, secret_on_stdin=False):
    """The shell script run by ssh on a remote host.

    It starts the program in the background and watches stdin: when the
    launcher's ssh goes away (job teardown, Ctrl-C), the channel's stdin reaches
    EOF and the program gets SIGTERM (SIGKILL 5 s later). The script's exit
    status is the program's (128+N when it died of signal N).

    With ``secret_on_stdin`` the script first reads one line from stdin into
    ``ERDMA_JOB_SECRET`` (exported to the program), so the job secret never
    appears on a command line (``ps``) on either machine.
    """
    q = shlex.quote
    assigns = " ".join(q(f"{k}={v}") for k, v in env.items())
    prog = " ".join(q(a) for a in argv)
    secret = (f"IFS= read -r {SECRET_ENV} || exit {EXIT_CANNOT_EXEC}; export {SECRET_ENV}; "
              if secret_on_stdin else "")
    return (f"{secret}cd {q(cwd)} || exit {EXIT_CANNOT_EXEC}; "
            f"exec 3<&0; "
            f"env {assigns} {prog} </dev/null & p=$!; "
            f"( read -r _ <&3; kill -TERM $p; sleep 5; kill -KILL $p ) >/dev/null 2>&1 & w=$!; "
            f"exec 3<&-; "
            f"wait $p; r=$?; kill $w 2>/dev/null; exit $r")


@dataclass
class Rank:
    rank: int
    host: str
    local: bool
    argv: list
    env: dict
    proc: subprocess.Popen = None
    returncode: int = None
    readers: list = field(default_factory=list)

    @property
    def where(self):
        return "local" if self.local else self.host


def exit_status(returncode):
    """Popen return code -> shell-style status (signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_status(returncode, local=True):
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by signal {-returncode} ({name})"
    if returncode == EXIT_NOT_FOUND:
        return f"exited with code {returncode} (command not found?)"
    if returncode == 255 and not local:
        return f"exited with code {returncode} (ssh failed? see its message above)"
    return f"exited with code {returncode}"


class _Output:
    """Line-by-line forwarding of rank output to our stdout/stderr.

    Whole lines are written atomically (lines of different ranks never mix,
    except for lines longer than 64 KiB); a last line without a newline gets one.
    """

    def __init__(self, tag):
        self.tag = tag
        self.lock = threading.Lock()
        self.dead = {1: False, 2: False}

    def write(self, fd, data):
        if self.dead[fd]:
            return
        with self.lock:
            try:
                view = memoryview(data)
                while view:
                    n = os.write(fd, view)
                    view = view[n:]
            except BrokenPipeError:
                self.dead[fd] = True      # e.g. `erdmarun ... | head`; keep draining the ranks
            except OSError:
                self.dead[fd] = True

    def pump(self, rank, pipe, fd):
        prefix = f"[{rank}] ".encode() if self.tag else b""
        at_start, pending = True, b""
        try:
            while True:
                chunk = pipe.readline(1 << 16)
                if not chunk:
                    break
                if chunk.endswith(b"\n"):
                    self.write(fd, (prefix if at_start else b"") + pending + chunk)
                    pending, at_start = b"", True
                else:            # EOF without a newline, or a line longer than 64 KiB
                    pending += chunk
                    if len(pending) >= 1 << 16:
                        self.write(fd, (prefix if at_start else b"") + pending)
                        pending, at_start = b"", False
            if pending or not at_start:   # end the last line here, in the same write
                self.write(fd, (prefix if at_start else b"") + pending + b"\n")
        except (OSError, ValueError):
            pass
        finally:
            try:
                pipe.close()
            except OSError:
                pass


class Job:
    """One erdmarun job.

    :param argv: program and its arguments.
    :param nprocs: number of ranks.
    :param hosts: list of :class:`Host` (None: all ranks local).
    :param env: extra variables (``--env K=V``), applied over the parent environment.
    :param exports: parent variable names also sent to remote ranks.
    :param timeout: seconds before the job is killed (exit code 124); None for no limit.
    :param grace: seconds between SIGTERM and SIGKILL when tearing the job down.
    :param world_size: size of COMM_WORLD when this erdmarun starts only some of
        the job's ranks (Internet join); default ``nprocs``.
    :param first_rank: COMM_WORLD rank of this erdmarun's first rank (its ranks
        are ``first_rank .. first_rank+nprocs-1``).
    :param rendezvous: ``host:port`` of a store that already runs (no store is
        started here).
    :param jobid: the job id (default: random).
    :param secret: the job secret as hex (default: a fresh one; ``""``: none); local
        ranks get it in ``ERDMA_JOB_SECRET``, ssh ranks on the remote command's stdin.
    :param join: an object with ``start(report)`` and ``close()``: watches that
        every site joined; ``report(message)`` fails the job (exit 124).
    :param rank_env: extra contract variables for every rank (e.g. ``ERDMA_CONNECT_TIMEOUT``).
    """

    def __init__(self, argv, nprocs, hosts=None, env=None, exports=(), tag_output=False,
                 timeout=None, grace=5.0, launcher_cmd=None, rendezvous_addr=None,
                 wdir=None, verbose=False, world_size=None, first_rank=0, rendezvous=None,
                 jobid=None, secret=None, join=None, rank_env=None):
        if not argv:
            raise JobError("no program given")
        if nprocs < 1:
            raise JobError(f"the number of processes must be at least 1, got {nprocs}")
        self.argv = list(argv)
        self.nprocs = nprocs
        self.hosts = hosts
        self.extra_env = dict(env or {})
        self.exports = list(exports)
        self.timeout = timeout
        self.grace = grace
        self.verbose = verbose
        self.wdir = os.path.abspath(wdir) if wdir else os.getcwd()
        cmd = launcher_cmd or config.get("ERDMA_SSH", default=DEFAULT_SSH)
        self.launcher_argv = shlex.split(cmd)
        if not self.launcher_argv:
            raise JobError("the launcher command (--launcher-cmd / ERDMA_SSH) is empty")
        if (os.path.basename(self.launcher_argv[0]) == "ssh"
                and "batchmode" not in cmd.lower()):
            self.launcher_argv[1:1] = ["-o", "BatchMode=yes"]
        self.rendezvous_addr = rendezvous_addr
        self.output = _Output(tag_output)
        self.jobid = jobid or secrets.token_hex(8)
        self.world_size = world_size or nprocs
        self.first_rank = first_rank
        if not 0 <= first_rank <= self.world_size - nprocs:
            raise JobError(f"ranks {first_rank}-{first_rank + nprocs - 1} are not ranks "
                           f"of a job of {self.world_size}")
        self.external_rendezvous = rendezvous
        self.secret = generate_secret() if secret is None else (secret or None)
        self.join = join
        self.rank_env = dict(rank_env or {})
        self.ranks = []
        self.server = None
        self._events = queue.SimpleQueue()   # put() is safe from a signal handler
        self._signals = []

    # -- public --

    def check(self):
        """Raise :class:`JobError` now if the program cannot be started here."""
        self._check_program(self._placement())

    def run(self):
        """Run the job to completion; returns erdmarun's exit status."""
        placement = self._placement()
        self._check_program(placement)
        if self.external_rendezvous:
            self.rendezvous = self.external_rendezvous
        else:
            self.server = self._start_store(placement)
        old = self._install_signal_handlers()
        try:
            if self.join is not None:
                self.join.start(lambda msg: self._events.put(("join", None, msg)))
            return self._run(placement)
        finally:
            if self.join is not None:
                self.join.close()
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self._teardown(signal.SIGKILL)
            end = time.monotonic() + 3.0      # a rank's orphans may hold its pipes open
            for r in self.ranks:
                for t in r.readers:
                    t.join(max(0.0, end - time.monotonic()))
            if self.server is not None:
                self.server.close()
            self._remove_shm_segments()

    # Private

    def _remove_shm_segments(self):
        """Shared-memory segments of local ranks that died before every peer
        mapped them (ranks unlink them themselves otherwise)."""
        import glob
        for path in glob.glob(f"/dev/shm/erdma-{self.jobid}-*"):
            try:
                os.unlink(path)
            except OSError:
                pass

    def _say(self, msg):
        self.output.write(2, f"erdmarun: {msg}\n".encode())

    def _placement(self):
        if not self.hosts:
            return [None] * self.nprocs
        return assign_hosts(self.nprocs, self.hosts)

    def _check_program(self, placement):
        if not any(h is None or is_local_host(h.name) for h in placement):
            return  # remote only: the remote shell reports it (exit 127)
        prog = self.argv[0]
        path = self.extra_env.get("PATH", os.environ.get("PATH", os.defpath))
        if os.sep in prog:
            if not os.path.exists(prog):
                raise JobError(f"program {prog!r} not found", EXIT_NOT_FOUND)
            if os.path.isdir(prog) or not os.access(prog, os.X_OK):
                raise JobError(f"program {prog!r} is not executable", EXIT_CANNOT_EXEC)
        elif shutil.which(prog, path=path) is None:
            raise JobError(f"program {prog!r} not found in PATH", EXIT_NOT_FOUND)

    def _start_store(self, placement):
        remote = [h for h in placement if h is not None and not is_local_host(h.name)]
        bind_port = 0
        advertise = None
        if self.rendezvous_addr:
            host, _, port = self.rendezvous_addr.rpartition(":")
            if host and port.isdigit():
                advertise, bind_port = host.strip("[]"), int(port)
            else:
                advertise = self.rendezvous_addr.strip("[]")
        if remote:
            if not advertise:
                try:
                    advertise = route_address(remote[0].address)
                except JobError as e:    # e.g. a host alias known only to ssh_config
                    try:
                        advertise = route_address("192.0.2.1")    # the default route's address
                    except JobError:
                        raise e from None
                    self._say(f"{e}; advertising the rendezvous store at {advertise} "
                              f"(choose another with --rendezvous-addr)")
            # only the interface the ranks use, not every address of this machine
            bind = advertise
        elif advertise:
            # local ranks that reach the store by an address of ours (e.g. ranks
            # started in other network namespaces by a wrapper): listen on it
            bind = advertise
        else:
            bind = "127.0.0.1"
            advertise = "127.0.0.1"
        if ":" in advertise and bind in ("0.0.0.0", "127.0.0.1"):
            bind = "::" if bind == "0.0.0.0" else "::1"
        # only this job's ranks (they hold its secret) may create a space or store
        # anything; room for every rank's connections even from one address
        n = self.nprocs
        opts = dict(require_auth=bool(self.secret), admit=[self.secret] if self.secret else [],
                    max_conns_per_source=max(256, 4 * n + 16), max_conns=max(4096, 4 * n + 64))
        try:
            server = StoreServer(bind, bind_port, **opts).start()
        except OSError as e:
            if e.errno != errno.EADDRNOTAVAIL or not remote:
                raise JobError(f"cannot start the rendezvous store on {bind}:{bind_port}: "
                               f"{e.strerror}")
            # the advertised address is not this machine's (e.g. forwarded to it)
            self._say(f"{bind} is not an address of this machine; the rendezvous store "
                      f"listens on all addresses (it requires the job's secret)")
            bind = "::" if ":" in bind else "0.0.0.0"
            try:
                server = StoreServer(bind, bind_port, **opts).start()
            except OSError as e2:
                raise JobError(f"cannot start the rendezvous store on {bind}:{bind_port}: "
                               f"{e2.strerror}")
        host = f"[{advertise}]" if ":" in advertise else advertise
        self.rendezvous = f"{host}:{server.port}"
        if self.verbose:
            self._say(f"rendezvous store listening on {server.address}, advertised as {self.rendezvous}")
        return server

    def _rank_env(self, rank, host, local_rank, local_size):
        size = self.world_size
        universe = max(size, sum(h.slots for h in self.hosts)) if self.hosts else size
        return {
            **self.rank_env,
            "ERDMA_RANK": str(rank),
            "ERDMA_SIZE": str(size),
            "ERDMA_RENDEZVOUS": self.rendezvous,
            "ERDMA_JOBID": self.jobid,
            "ERDMA_LOCAL_RANK": str(local_rank),
            "ERDMA_LOCAL_SIZE": str(local_size),
            "ERDMA_APPNUM": "0",
            "ERDMA_UNIVERSE_SIZE": str(universe),
            # torchrun's names, so unmodified torch.distributed scripts find
            # their rank, device and env:// store
            "RANK": str(rank),
            "WORLD_SIZE": str(size),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size),
            **self._torch_master(),
        }

    def _torch_master(self):
        """MASTER_ADDR/MASTER_PORT for torch's env:// store (rank 0 hosts it):
        as given to erdmarun or its environment, else rank 0's host and a
        port free here (rank 0 local) or derived from the job id (the same in
        every erdmarun of a job)."""
        if getattr(self, "_master", None) is None:
            given = {**os.environ, **self.extra_env}
            addr, port = given.get("MASTER_ADDR"), given.get("MASTER_PORT")
            first = self._placement_cache[0] if self.first_rank == 0 else None
            rank0_here = self.first_rank == 0 and (first is None or is_local_host(first.name))
            if not addr:
                if self.first_rank == 0 and not rank0_here:
                    addr = first.address
                else:
                    addr = self.rendezvous.rpartition(":")[0].strip("[]") or "127.0.0.1"
            if not port:
                port = None
                if rank0_here:
                    try:
                        with socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET) as s:
                            s.bind(("::" if ":" in addr else "", 0))
                            port = s.getsockname()[1]
                    except OSError:
                        pass
                if port is None:
                    port = 20000 + int.from_bytes(self.jobid.encode()[-4:], "big") % 20000
            self._master = {"MASTER_ADDR": addr, "MASTER_PORT": str(port)}
        return self._master

    def _remote_env(self, contract):
        env = {}
        for k in REMOTE_EXPORTS:
            if k in os.environ:
                env[k] = os.environ[k]
        for k, v in os.environ.items():
            if k.startswith("ERDMA_") and k not in ("ERDMA_SSH", SECRET_ENV, SECRET_FILE_ENV):
                env[k] = v
        for k in self.exports:
            if k in os.environ:
                env[k] = os.environ[k]
        env.update(self.extra_env)
        env.update(contract)
        return env

    def _spawn(self, placement):
        self._placement_cache = placement
        keys = ["" if h is None or is_local_host(h.name) else h.name for h in placement]
        counts = {}
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
        seen = {}
        for index, (h, key) in enumerate(zip(placement, keys)):
            rank = self.first_rank + index
            local_rank = seen.get(key, 0)
            seen[key] = local_rank + 1
            contract = self._rank_env(rank, h, local_rank, counts[key])
            if key == "":
                env = dict(os.environ)
                env.update(self.extra_env)
                env.update(contract)
                # the ranks' common ancestor: they let it and its descendants
                # (each other) read them with CMA under Yama, nobody else
                env["ERDMA_LAUNCHER_PID"] = str(os.getpid())
                if self.secret:
                    env.pop(SECRET_FILE_ENV, None)
                    env[SECRET_ENV] = self.secret
                r = Rank(rank, "localhost", True, self.argv, env)
                cmd, stdin = self.argv, subprocess.DEVNULL
            else:
                env = self._remote_env(contract)
                r = Rank(rank, key, False, self.argv, env)
                cmd = self.launcher_argv + [key, remote_command(self.wdir, env, self.argv,
                                                                bool(self.secret))]
                env, stdin = None, subprocess.PIPE
            if self.verbose:
                self._say(f"rank {rank} on {r.where}: {shlex.join(cmd)}")
            try:
                r.proc = subprocess.Popen(cmd, env=env, cwd=self.wdir if r.local else None,
                                          stdin=stdin, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True)
            except FileNotFoundError as e:
                raise JobError(f"cannot start rank {rank}: {cmd[0]!r} not found "
                               f"({e.strerror})", EXIT_NOT_FOUND) from None
            except OSError as e:
                raise JobError(f"cannot start rank {rank}: {cmd[0]!r}: {e.strerror}",
                               EXIT_CANNOT_EXEC) from None
            self.ranks.append(r)
            if not r.local and self.secret:
                try:                 # the remote script reads it first (never on a command line)
                    r.proc.stdin.write(f"{self.secret}\n".encode())
                    r.proc.stdin.flush()
                except OSError:
                    pass             # ssh died at once: reported as its exit status
            for pipe, fd in ((r.proc.stdout, 1), (r.proc.stderr, 2)):
                t = threading.Thread(target=self.output.pump, args=(rank, pipe, fd),
                                     name=f"erdma-out-{rank}-{fd}", daemon=True)
                t.start()
                r.readers.append(t)
            threading.Thread(target=self._reap, args=(r,), name=f"erdma-wait-{rank}",
                             daemon=True).start()

    def _reap(self, r):
        code = r.proc.wait()
        self._events.put(("exit", r, code))

    def _install_signal_handlers(self):
        old = {}

        def handler(signum, frame):
            self._signals.append(signum)
            self._events.put(("signal", None, signum))

        if threading.current_thread() is not threading.main_thread():
            return old
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                    signal.SIGUSR1, signal.SIGUSR2):
            old[sig] = signal.signal(sig, handler)
        return old

    def _kill(self, r, sig):
        if r.returncode is not None or r.proc is None:
            return
        try:
            os.killpg(r.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                r.proc.send_signal(sig)
            except OSError:
                pass

    def _teardown(self, sig):
        for r in self.ranks:
            if r.returncode is None:
                self._kill(r, sig)

    def _run(self, placement):
        try:
            self._spawn(placement)
        except JobError:
            self._teardown(signal.SIGKILL)
            raise
        deadline = time.monotonic() + self.timeout if self.timeout else None
        alive = len(self.ranks)
        status = None           # the exit status once decided
        failed = None           # first failing rank
        kill_at = None          # when to escalate to SIGKILL
        interrupted = None      # signal received by erdmarun
        while alive:
            wait = 0.5
            now = time.monotonic()
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - now))
            if kill_at is not None:
                wait = min(wait, max(0.0, kill_at - now))
            try:
                kind, r, value = self._events.get(timeout=wait)
            except queue.Empty:
                kind = None
            now = time.monotonic()
            if kind == "exit":
                alive -= 1
                r.returncode = value
                if value != 0 and failed is None and status is None:
                    failed = r
                    for t in r.readers:           # its last words come before ours
                        t.join(1.0)
                    status = exit_status(value)
                    self._say(f"rank {r.rank} (pid {r.proc.pid}, {r.where}) "
                              f"{describe_status(value, r.local)}"
                              + (f"; terminating the other {alive} rank(s)" if alive else ""))
                    self._teardown(signal.SIGTERM)
                    kill_at = now + self.grace
            elif kind == "join":
                if status is None:
                    status = EXIT_JOIN
                    self._say(f"{value}; terminating {alive} rank(s)")
                    self._teardown(signal.SIGTERM)
                    kill_at = now + self.grace
            elif kind == "signal":
                if value in (signal.SIGUSR1, signal.SIGUSR2):
                    self._teardown(value)          # forwarded as is, job goes on
                    continue
                if interrupted is not None:        # second signal: no more grace
                    self._teardown(signal.SIGKILL)
                    continue
                interrupted = value
                self._say(f"received {signal.Signals(value).name}; forwarding it to "
                          f"{alive} rank(s)")
                self._teardown(value)
                kill_at = now + self.grace
            if deadline is not None and now >= deadline and status is None:
                status = EXIT_TIMEOUT
                deadline = None
                # first ask each rank where it is (erdmampi.stackdump), then end it
                self._say(f"job timed out after {self.timeout:g} s; asking {alive} rank(s) "
                          f"for their stacks (SIGUSR1), then terminating them")
                self._teardown(signal.SIGUSR1)
                dump_until = now + DUMP_WAIT
                while alive and time.monotonic() < dump_until:
                    try:
                        kind, r, value = self._events.get(
                            timeout=max(0.0, dump_until - time.monotonic()))
                    except queue.Empty:
                        break
                    if kind == "exit":
                        alive -= 1
                        r.returncode = value
                self._teardown(signal.SIGTERM)
                kill_at = time.monotonic() + self.grace
            if kill_at is not None and now >= kill_at and alive:
                self._teardown(signal.SIGKILL)
                kill_at = None
        if status is None:
            # every rank exited 0; after an interrupt that is still not a success
            status = 128 + interrupted if interrupted is not None else 0
        return status
