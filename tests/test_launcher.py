"""erdmarun: placement, environment contract, output, exit status, teardown, ssh."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from harness import erdmarun_cmd, rank_env, run_mpi

from erdmampi.launcher import cli, spawn

PY = sys.executable


def erdmarun(*args, timeout=60, env=None, **kw):
    return subprocess.run(erdmarun_cmd() + [str(a) for a in args], env=rank_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, **kw)


# -- pure functions ------------------------------------------------------------

def test_parse_hosts_and_assign():
    hosts = spawn.parse_hosts("a:2,b,user@c:3")
    assert [(h.name, h.slots) for h in hosts] == [("a", 2), ("b", 1), ("user@c", 3)]
    assert hosts[2].address == "c"
    names = [h.name for h in spawn.assign_hosts(8, hosts)]
    assert names == ["a", "a", "b", "user@c", "user@c", "user@c", "a", "a"]
    rr = [h.name for h in spawn.assign_hosts(5, spawn.parse_hosts("x,y"))]
    assert rr == ["x", "y", "x", "y", "x"]
    for bad in ("a:0", "a:x", ","):
        with pytest.raises(spawn.JobError):
            spawn.parse_hosts(bad)


def test_parse_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# cluster\nnode1 slots=4\n\nnode2   # one slot\nnode3:2\n")
    hosts = spawn.parse_hostfile(str(f))
    assert [(h.name, h.slots) for h in hosts] == [("node1", 4), ("node2", 1), ("node3", 2)]
    f.write_text("node1 cpus=4\n")
    with pytest.raises(spawn.JobError, match="hosts:1"):
        spawn.parse_hostfile(str(f))
    with pytest.raises(spawn.JobError, match="cannot read"):
        spawn.parse_hostfile(str(tmp_path / "missing"))


def test_split_argv_leaves_program_options_alone():
    opts, prog = cli.split_argv(["-n", "2", "--tag-output", "python", "-n", "5", "--timeout"])
    assert opts == ["-n", "2", "--tag-output"] and prog == ["python", "-n", "5", "--timeout"]
    opts, prog = cli.split_argv(["-n2", "--env", "A=1", "--", "-weird"])
    assert opts == ["-n2", "--env", "A=1"] and prog == ["-weird"]


def test_local_host_detection():
    assert spawn.is_local_host("localhost")
    assert spawn.is_local_host(socket.gethostname())
    assert not spawn.is_local_host("127.0.0.1")       # documented: goes through ssh
    assert spawn.route_address("127.0.0.1") == "127.0.0.1"


# -- usage errors ------------------------------------------------------------------

def test_help_is_helpful():
    r = erdmarun("--help")
    assert r.returncode == 0
    for word in ("-n N", "--hostfile", "--tag-output", "--timeout", "--env", "--launcher-cmd",
                 "ERDMA_RANK", "ERDMA_RENDEZVOUS", "ERDMA_LOCAL_RANK", "exit status", "124",
                 "128+S", "examples"):
        assert word in r.stdout, word


def test_no_program_is_a_usage_error():
    r = erdmarun("-n", "2")
    assert r.returncode == 2 and "no PROGRAM" in r.stderr


def test_program_not_found():
    r = erdmarun("-n", "2", "no-such-program-erdma")
    assert r.returncode == 127
    assert "'no-such-program-erdma' not found" in r.stderr
    r = erdmarun("-n", "1", "./no/such/path")
    assert r.returncode == 127 and "not found" in r.stderr


def test_bad_env_option():
    r = erdmarun("-n", "1", "--env", "NOEQUALS", PY, "-c", "pass")
    assert r.returncode == 2 and "K=V" in r.stderr


# -- jobs ------------------------------------------------------------------

@pytest.mark.slow
def test_exit_code_zero_and_nonzero():
    assert run_mpi(2, "pass").returncode == 0
    r = run_mpi(3, "import os, sys\nsys.exit(3 if os.environ['ERDMA_RANK'] == '1' else 0)")
    assert r.returncode == 3
    assert "rank 1" in r.stderr and "exited with code 3" in r.stderr


@pytest.mark.slow
def test_rank_killed_by_signal():
    r = run_mpi(2, "import os, signal, time\n"
                   "if os.environ['ERDMA_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
                   "time.sleep(60)\n", timeout=40)
    assert r.returncode == 128 + signal.SIGKILL
    assert "rank 1" in r.stderr and "SIGKILL" in r.stderr


@pytest.mark.slow
def test_failing_rank_tears_down_the_others():
    # without teardown the sleepers would outlive --timeout and the status would be 124
    r = run_mpi(4, "import os, sys, time\n"
                   "if os.environ['ERDMA_RANK'] == '2':\n"
                   "    print('rank 2 fails', flush=True); time.sleep(0.3); sys.exit(5)\n"
                   "time.sleep(60)\n", timeout=30)
    assert r.returncode == 5, r.stderr
    assert "rank 2 fails" in r.stdout
    assert "terminating the other 3 rank(s)" in r.stderr


@pytest.mark.slow
def test_teardown_escalates_to_sigkill():
    # rank 0 ignores SIGTERM; it must still go away after --kill-grace
    r = run_mpi(2, "import os, signal, sys, time\n"
                   "if os.environ['ERDMA_RANK'] == '0':\n"
                   "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   "    print('ready', flush=True); time.sleep(60)\n"
                   "time.sleep(0.5); sys.exit(9)\n", timeout=30, extra=["--kill-grace", "1"])
    assert r.returncode == 9, r.stderr


@pytest.mark.slow
def test_timeout_kills_the_job():
    r = run_mpi(2, "import time\nprint('started', flush=True)\ntime.sleep(60)\n", timeout=2)
    assert r.returncode == 124
    assert "timed out after 2 s" in r.stderr
    assert r.stdout.count("started") == 2


@pytest.mark.slow
def test_env_contract():
    script = (
        "import json, os\n"
        "from erdmampi.discovery import open_store\n"
        "e = {k: v for k, v in os.environ.items() if k.startswith(('ERDMA_', 'MY_'))}\n"
        "st = open_store(os.environ, timeout=20)\n"
        "st.set('rank/' + e['ERDMA_RANK'], e['ERDMA_RANK'])\n"
        "[st.get('rank/%d' % i) for i in range(int(e['ERDMA_SIZE']))]\n"
        "e['count'] = st.add('count', 1)\n"
        "print('ENV', json.dumps(e), flush=True)\n")
    r = run_mpi(3, script, env={"MY_PARENT": "p"}, extra=["--env", "MY_EXTRA=x=y"])
    assert r.returncode == 0, r.stderr
    envs = [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("ENV ")]
    assert sorted(int(e["ERDMA_RANK"]) for e in envs) == [0, 1, 2]
    assert sorted(e["count"] for e in envs) == [1, 2, 3]
    for e in envs:
        assert e["ERDMA_SIZE"] == "3"
        assert e["ERDMA_LOCAL_RANK"] == e["ERDMA_RANK"] and e["ERDMA_LOCAL_SIZE"] == "3"
        assert e["ERDMA_APPNUM"] == "0" and e["ERDMA_UNIVERSE_SIZE"] == "3"
        assert e["ERDMA_RENDEZVOUS"].startswith("127.0.0.1:")
        assert e["MY_PARENT"] == "p" and e["MY_EXTRA"] == "x=y"
    assert len({e["ERDMA_JOBID"] for e in envs}) == 1
    assert len({e["ERDMA_RENDEZVOUS"] for e in envs}) == 1
    assert len(envs[0]["ERDMA_JOBID"]) >= 16


@pytest.mark.slow
def test_localhost_hosts_run_directly_with_local_ranks():
    script = "import os\nprint('R', os.environ['ERDMA_RANK'], os.environ['ERDMA_LOCAL_RANK'], " \
             "os.environ['ERDMA_LOCAL_SIZE'], os.environ['ERDMA_UNIVERSE_SIZE'], 'SSH_CONNECTION' in os.environ)\n"
    r = run_mpi(3, script, extra=["-H", "localhost:4"], env={"SSH_CONNECTION": ""})
    assert r.returncode == 0, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if l.startswith("R "))
    assert lines == ["R 0 0 3 4 True", "R 1 1 3 4 True", "R 2 2 3 4 True"]


@pytest.mark.slow
def test_program_arguments_pass_through():
    r = run_mpi(1, "import sys\nprint(sys.argv[1:])\n", args=["-n", "5", "--timeout", "x y"])
    assert r.returncode == 0
    assert "['-n', '5', '--timeout', 'x y']" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("tag", [False, True])
def test_output_forwarding_loses_nothing(tag):
    n = 20000
    script = ("import os, sys\nr = os.environ['ERDMA_RANK']\n"
              f"for i in range({n}): print('out', r, i)\n"
              "print('err', r, file=sys.stderr)\n"
              "sys.stdout.write('tail ' + r)\n")
    r = run_mpi(2, script, extra=["--tag-output"] if tag else [])
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    for rank in (0, 1):
        prefix = f"[{rank}] " if tag else ""
        mine = [l for l in lines if l.startswith(f"{prefix}out {rank} ")]
        assert mine == [f"{prefix}out {rank} {i}" for i in range(n)]   # all, in order
        assert f"{prefix}err {rank}" in r.stderr.splitlines()
        assert f"{prefix}tail {rank}" in lines
    assert len(lines) == 2 * (n + 1)
    if tag:
        assert all(l.startswith(("[0] ", "[1] ")) for l in lines)


@pytest.mark.slow
def test_sigint_is_forwarded_to_the_ranks():
    code = ("import os, signal, sys, time\n"
            "def h(s, f): print('got', signal.Signals(s).name, os.environ['ERDMA_RANK'], flush=True); sys.exit(7)\n"
            "signal.signal(signal.SIGINT, h)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.py")
        with open(path, "w") as f:
            f.write(code)
        p = subprocess.Popen(erdmarun_cmd() + ["-n", "2", "--timeout", "40", PY, path],
                             env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        watchdog = threading.Timer(50, p.kill)
        watchdog.start()
        try:
            assert p.stdout.readline() == "ready\n"
            assert p.stdout.readline() == "ready\n"
            p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=45)
        finally:
            watchdog.cancel()
            p.kill()
            p.wait()
    assert p.returncode == 7, err
    assert sorted(out.split("\n")[:2]) == ["got SIGINT 0", "got SIGINT 1"]
    assert "received SIGINT" in err


# -- remote ranks ------------------------------------------------------------------

@pytest.fixture
def fake_ssh(tmp_path):
    """A launcher command that runs the remote script locally, like ssh would."""
    path = tmp_path / "fakessh"
    path.write_text('#!/bin/sh\nhost="$1"; shift\nexec env -i FAKE_SSH_HOST="$host" HOME="$HOME" sh -c "$*"\n')
    path.chmod(0o755)
    return str(path)


@pytest.mark.slow
def test_remote_path_with_fake_ssh(fake_ssh):
    # hostA/hostB are names only the fake ssh understands; rank 2 fails, the others are torn down
    script = ("import os, sys\n"
              "print('R', os.environ['ERDMA_RANK'], os.environ['FAKE_SSH_HOST'], "
              "os.environ['ERDMA_LOCAL_RANK'], os.environ['ERDMA_LOCAL_SIZE'], "
              "os.environ.get('MY_EXPORTED'), os.environ.get('MY_NOT_EXPORTED'), os.getcwd(), flush=True)\n"
              "from erdmampi.discovery import open_store\n"
              "st = open_store(os.environ, timeout=20)\n"
              "if os.environ['ERDMA_RANK'] == '2':\n"
              "    st.get('printed0', 30); st.get('printed1', 30); sys.exit(4)\n"
              "st.set('printed' + os.environ['ERDMA_RANK'], b'')\n"
              "import time; time.sleep(60)\n")
    with tempfile.TemporaryDirectory() as wdir:
        r = run_mpi(3, script, extra=["-H", "hostA:2,hostB", "--launcher-cmd", fake_ssh,
                                      "--wdir", wdir, "-x", "MY_EXPORTED",
                                      "--rendezvous-addr", "127.0.0.1"],
                    env={"MY_EXPORTED": "e", "MY_NOT_EXPORTED": "n"})
    assert r.returncode == 4, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if l.startswith("R "))
    real = os.path.realpath(wdir)
    assert [l.replace(real, "W").replace(wdir, "W") for l in lines] == [
        "R 0 hostA 0 2 e None W", "R 1 hostA 1 2 e None W", "R 2 hostB 0 1 e None W"]
    assert "rank 2 (pid" in r.stderr and "hostB) exited with code 4" in r.stderr


def _run_remote_script(script, close_stdin=False):
    p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        if close_stdin:
            p.stdin.close()
        return p.wait(20)
    finally:
        p.kill()
        p.wait()
        if not p.stdin.closed:
            p.stdin.close()


def test_remote_script_exit_status_and_stdin_watch():
    rc = spawn.remote_command
    assert _run_remote_script(rc("/", {"ERDMA_RANK": "0"}, [PY, "-c", "import sys; sys.exit(6)"])) == 6
    assert _run_remote_script(rc("/", {"A": "x y'z"}, [PY, "-c",
        "import os, sys; sys.exit(0 if os.environ['A'] == \"x y'z\" else 1)"])) == 0
    assert _run_remote_script(rc("/", {}, [PY, "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])) == 128 + signal.SIGKILL
    # closing stdin (what the ssh channel does when the launcher goes away) stops the program
    assert _run_remote_script(rc("/", {}, [PY, "-c", "import time; time.sleep(60)"]),
                              close_stdin=True) == 128 + signal.SIGTERM
    assert _run_remote_script(rc("/nonexistent-dir", {}, ["true"])) == 126
    assert _run_remote_script(rc("/", {}, ["no-such-program-erdma"])) == 127


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sshd(tmp_path):
    """A private sshd on 127.0.0.1:PORT with generated keys; yields (port, client_key)."""
    sshd_bin, keygen = "/usr/sbin/sshd", shutil.which("ssh-keygen")
    if not os.path.exists(sshd_bin) or not keygen or not shutil.which("ssh"):
        pytest.skip("openssh server/client not installed")
    for name in ("host_key", "client_key"):
        subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)],
                       check=True)
    shutil.copy(tmp_path / "client_key.pub", tmp_path / "authorized_keys")
    port = _free_port()
    (tmp_path / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {tmp_path / 'host_key'}\n"
        f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}\nPidFile {tmp_path / 'sshd.pid'}\n"
        "StrictModes no\nPermitRootLogin yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nPubkeyAuthentication yes\n"
        "PermitUserEnvironment no\nLogLevel ERROR\n")
    if os.geteuid() == 0 and not os.path.isdir("/run/sshd"):
        try:
            os.makedirs("/run/sshd", mode=0o755)   # sshd's privilege separation directory
        except OSError as e:
            pytest.skip(f"cannot create /run/sshd: {e}")
    p = subprocess.Popen([sshd_bin, "-D", "-e", "-f", str(tmp_path / "sshd_config")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            if p.poll() is not None:
                pytest.skip(f"sshd did not start: {p.stderr.read().strip()[:300]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.skip("sshd did not listen within 10 s")
                time.sleep(0.1)
        cmd = (f"ssh -p {port} -i {tmp_path / 'client_key'} -o StrictHostKeyChecking=no "
               f"-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR")
        probe = subprocess.run(shlex_split(cmd) + ["-o", "BatchMode=yes", "127.0.0.1", "true"],
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=20)
        if probe.returncode != 0:
            pytest.skip(f"cannot log in to the private sshd: {probe.stderr.strip()[:300]}")
        yield cmd
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stderr.close()


def shlex_split(s):
    import shlex
    return shlex.split(s)


@pytest.mark.slow
def test_ssh_ranks_run_remotely(sshd):
    script = ("import os\n"
              "from erdmampi.discovery import open_store\n"
              "st = open_store(os.environ, timeout=20)\n"
              "n = st.add('n', 1)\n"
              "print('R', os.environ['ERDMA_RANK'], os.environ['ERDMA_LOCAL_RANK'], "
              "bool(os.environ.get('SSH_CONNECTION')), os.getcwd() == os.environ['WANT_CWD'], flush=True)\n")
    r = run_mpi(2, script, extra=["-H", "127.0.0.1:2", "--launcher-cmd", sshd, "-x", "WANT_CWD"],
                env={"WANT_CWD": os.getcwd()})
    assert r.returncode == 0, r.stderr
    lines = sorted(l for l in r.stdout.splitlines() if l.startswith("R "))
    assert lines == ["R 0 0 True True", "R 1 1 True True"]


@pytest.mark.slow
def test_ssh_failing_rank_tears_down_remote_ranks(sshd):
    marker = f"erdma-marker-{os.getpid()}-{time.monotonic_ns()}"
    r = run_mpi(2, "import os, sys, time\n"
                   "if os.environ['ERDMA_RANK'] == '1': time.sleep(0.5); sys.exit(3)\n"
                   "time.sleep(60)\n", args=[marker], timeout=30,
                extra=["-H", "127.0.0.1", "--launcher-cmd", sshd])
    assert r.returncode == 3, r.stderr
    # the remote sleeper gets SIGTERM from the remote wrapper once its ssh goes away
    deadline = time.monotonic() + 15
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "remote rank outlived the job"
        time.sleep(0.2)


@pytest.mark.slow
def test_unresolvable_remote_host_falls_back_to_default_route(fake_ssh):
    r = run_mpi(1, "import os\nfrom erdmampi.discovery import open_store\n"
                   "open_store(os.environ, timeout=20).set('k', b'v')\n"
                   "print('stored')\n",
                extra=["-H", "alias-known-only-to-ssh.invalid", "--launcher-cmd", fake_ssh])
    if r.returncode == 2 and "cannot resolve" in r.stderr:
        pytest.skip("this machine has no default route")
    assert r.returncode == 0, r.stderr
    assert "stored" in r.stdout and "advertising the rendezvous store at" in r.stderr
