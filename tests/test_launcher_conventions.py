"""Command lines written for mpiexec (MPICH) and mpirun (Open MPI) work with
erdmarun, or say why not: -x NAME=VALUE, -genv, -ppn/-N/--map-by,
--oversubscribe, MPIEXEC_TIMEOUT, no abbreviations and a suggestion on typos."""
import os
import subprocess
import sys
import time

import pytest

from harness import erdmarun_cmd, rank_env

from erdmampi.launcher import cli, spawn

SHOW = "import os; print('env', os.environ.get('FOO'), os.environ.get('A'), " \
       "os.environ['ERDMA_RANK'], os.environ['ERDMA_SIZE'], flush=True)"


def erdmarun(*args, env=None, timeout=60):
    return subprocess.run(erdmarun_cmd() + [str(a) for a in args], env=rank_env(env),
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def lines(out):
    return sorted(ln for ln in out.splitlines() if ln.startswith("env "))


def test_open_mpi_x_sets_a_value():
    r = erdmarun("-n", "2", "-x", "FOO=bar", sys.executable, "-c", SHOW)
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == ["env bar None 0 2", "env bar None 1 2"]


def test_mpich_genv():
    r = erdmarun("-np", "1", "-genv", "A", "1 2", sys.executable, "-c", SHOW)
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == ["env None 1 2 0 1"]


def test_ranks_per_host():
    r = erdmarun("-ppn", "2", sys.executable, "-c", SHOW)
    assert r.returncode == 0, r.stderr
    assert lines(r.stdout) == ["env None None 0 2", "env None None 1 2"]
    r = erdmarun("-H", "localhost,localhost", "-N", "2", sys.executable, "-c", SHOW)
    assert r.returncode == 0, r.stderr
    assert len(lines(r.stdout)) == 4
    r = erdmarun("-ppn", "2", "-n", "3", sys.executable, "-c", SHOW)
    assert r.returncode == 2 and "do not fit 2 per host" in r.stderr


def test_map_by_places_as_open_mpi_does():
    parser = cli.build_parser()

    def placed(*args, n=None):
        a = parser.parse_args(list(args))
        hosts = cli._placement(a, spawn.parse_hosts(a.hosts), parser)
        return [h.name for h in spawn.assign_hosts(n or a.nprocs, hosts)]

    assert placed("-H", "a:2,b:2", "-n", "4") == ["a", "a", "b", "b"]
    assert placed("-H", "a:2,b:2", "-n", "4", "--map-by", "node") == ["a", "b", "a", "b"]
    assert placed("-H", "a,b", "--map-by", "ppr:2:node", "-n", "4") == ["a", "a", "b", "b"]
    a = parser.parse_args(["-H", "a:3,b:3", "--map-by", "node"])
    cli._placement(a, spawn.parse_hosts(a.hosts), parser)
    assert a.nprocs == 6  # -n defaults to the slots


def test_oversubscribe_and_run_as_root_are_accepted():
    r = erdmarun("-n", "1", "--oversubscribe", "--allow-run-as-root", sys.executable, "-c", SHOW)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args, says", [
    (["--bind-to", "core"], "--bind-to is not supported: erdmarun does not pin ranks"),
    (["--mca", "btl", "tcp,self"], "--mca is not supported: Open MPI's MCA parameters"),
    (["--map-by", "socket"], "--map-by socket is not supported"),
    (["--n", "2"], "unrecognized option --n (did you mean --np?)"),
    (["--tiemout", "3"], "unrecognized option --tiemout (did you mean --timeout?)"),
    (["--time", "3"], "unrecognized option --time (did you mean --timeout?)"),  # no abbrev.
])
def test_what_erdmarun_cannot_do_is_explained(args, says):
    r = erdmarun(*args, "-n", "1", sys.executable, "-c", SHOW)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert says in r.stderr
    assert "env" not in r.stdout


def test_the_split_follows_the_parser():
    # options with two values, and the program's own options left alone
    opts, prog = cli.split_argv(["-genv", "A", "B", "--mca", "x", "y", "-n", "2", "python",
                                 "-n", "5"])
    assert opts == ["-genv", "A", "B", "--mca", "x", "y", "-n", "2"]
    assert prog == ["python", "-n", "5"]
    opts, prog = cli.split_argv(["--timeout=5", "-ppn", "2", "prog"])
    assert opts == ["--timeout=5", "-ppn", "2"] and prog == ["prog"]


def test_mpiexec_timeout_is_honoured():
    t0 = time.monotonic()
    r = erdmarun("-n", "1", sys.executable, "-c", "import time; time.sleep(60)",
                 env={"MPIEXEC_TIMEOUT": "2"})
    assert r.returncode == 124, r.stderr
    assert time.monotonic() - t0 < 20
    assert "timed out after 2 s" in r.stderr
    r = erdmarun("-n", "1", sys.executable, "-c", SHOW, env={"MPIEXEC_TIMEOUT": "soon"})
    assert r.returncode == 2 and "MPIEXEC_TIMEOUT='soon'" in r.stderr


def test_jobauth_help_and_bad_sizes():
    run = lambda *a: subprocess.run([sys.executable, "-m", "erdmampi.jobauth", *a],  # noqa: E731
                                    capture_output=True, text=True, env=rank_env(None))
    r = run("--help")
    assert r.returncode == 0 and "job secret" in r.stdout
    r = run("8")
    assert r.returncode == 2 and "at least 16 bytes" in r.stderr
    r = run()
    assert r.returncode == 0 and len(r.stdout.strip()) == 64


def test_a_refused_secret_is_not_a_timeout(tmp_path):
    admitted, other = tmp_path / "a.key", tmp_path / "b.key"
    for f in (admitted, other):
        f.write_text(subprocess.run([sys.executable, "-m", "erdmampi.jobauth"], check=True,
                                    capture_output=True, text=True).stdout)
        os.chmod(f, 0o600)
    srv = subprocess.Popen(erdmarun_cmd() + ["--serve-rendezvous", "127.0.0.1:0",
                                             "--require-auth", "--admit-file", str(admitted)],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                           env=rank_env(None))
    try:
        addr = srv.stdout.readline().strip()
        t0 = time.monotonic()
        r = erdmarun("--rendezvous", addr, "--job-id", "j1", "--secret-file", other, "-n", "2",
                     "--connect-timeout", "30", sys.executable, "-c", SHOW)
        assert r.returncode == spawn.EXIT_AUTH == 77, r.stderr
        assert "job authentication refused" in r.stderr
        assert time.monotonic() - t0 < 15  # refused at once, not after the timeout
    finally:
        srv.terminate()
        srv.wait(10)
