"""Starting ranks without erdmarun: the environment contract of other launchers
(Slurm, Open MPI, MPICH/PMI), engine options, and a dead peer seen from MPI."""
import os
import subprocess
import sys
import time

import pytest

from erdmampi.launcher.store_server import StoreServer
from harness import REPO, run_mpi

ALLREDUCE = (
    "from erdmampi import MPI\n"
    "c = MPI.COMM_WORLD\n"
    "s = c.allreduce(c.rank + 1)\n"
    "print('rank', c.rank, 'of', c.size, 'sum', s, flush=True)\n"
)


def _spawn_ranks(n, rank_env, extra=None, code=ALLREDUCE, timeout=60):
    """Start n ranks by hand, as srun/mpiexec would, with a standalone store."""
    with StoreServer().start() as store:
        procs = []
        for r in range(n):
            env = {k: v for k, v in os.environ.items() if not k.startswith("ERDMA_")}
            env.update(rank_env(r, n))
            env.update(ERDMA_RENDEZVOUS=store.address, ERDMA_JOBID="handmade",
                       ERDMA_JOB_SECRET="5e" * 32)
            env.update(extra or {})
            procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=REPO,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = []
        try:
            for p in procs:
                outs.append((p.wait(timeout), p.stdout.read()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        return outs


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["slurm", "openmpi", "pmi"])
def test_other_launchers_environment(launcher):
    names = {"slurm": ("SLURM_PROCID", "SLURM_NTASKS"),
             "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
             "pmi": ("PMI_RANK", "PMI_SIZE")}[launcher]
    outs = _spawn_ranks(3, lambda r, n: {names[0]: str(r), names[1]: str(n)})
    for r, (rc, out) in enumerate(outs):
        assert rc == 0, out
        assert f"rank {r} of 3 sum 6" in out, out


def test_launcher_variables_without_rendezvous_fail_clearly():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERDMA_")}
    env.update(SLURM_PROCID="0", SLURM_NTASKS="2")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", "from erdmampi import MPI"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "ERDMA_RENDEZVOUS" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 30


def test_bad_rank_variables_fail_clearly():
    env = {k: v for k, v in os.environ.items() if not k.startswith("ERDMA_")}
    env.update(ERDMA_RANK="5", ERDMA_SIZE="2")
    p = subprocess.run([sys.executable, "-c", "from erdmampi import MPI"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "ERDMA_RANK=5 is not a rank of ERDMA_SIZE=2" in p.stderr, p.stderr


def test_plain_python_is_a_singleton():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ERDMA_", "SLURM_", "PMI_"))}
    p = subprocess.run([sys.executable, "-c", ALLREDUCE], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "rank 0 of 1 sum 1" in p.stdout, p.stdout + p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("cc", ["reno", "bbr", "bbr2"])
def test_congestion_control_choice(cc):
    code = ALLREDUCE + (
        "import numpy as np\n"
        "a = np.full(3 << 20, c.rank + 1.0, np.float32); b = np.empty_like(a)\n"
        "c.Allreduce(a, b)\n"
        "assert (b == 3.0).all()\n"
        "print('big ok', flush=True)\n")
    res = run_mpi(2, code, env={"ERDMA_CC": cc}, timeout=60)
    assert res.returncode == 0 and res.stdout.count("big ok") == 2, res.stdout + res.stderr


def test_unknown_congestion_control_is_refused():
    res = run_mpi(2, ALLREDUCE, env={"ERDMA_CC": "vegas"}, timeout=60)
    assert res.returncode == 2  # erdmarun refuses before starting ranks
    assert "ERDMA_CC='vegas' is not valid: expected auto, cubic, reno, bbr, bbr2" in res.stderr, \
        res.stderr


# the call rank 0 is in when its peer vanishes: the request path and the
# one-call paths (a block collective, a rooted one, the pickle API's)
DEAD_PEER_CALLS = {
    "Recv": "c.Recv(np.zeros(1), source=1, tag=3)",
    "Alltoall": "c.Alltoall(np.ones(2, np.float32), np.zeros(2, np.float32))",
    "Reduce": "c.Reduce(np.ones(4), np.zeros(4), MPI.SUM, 0)",
    "recv": "c.recv(source=1, tag=3)",
    "gather": "c.gather(1, 0)",
}


@pytest.mark.slow
@pytest.mark.parametrize("call", list(DEAD_PEER_CALLS))
@pytest.mark.parametrize("shm", ["0", "1"], ids=["quic", "shm"])
def test_dead_peer_raises_mpi_error_within_timeout(shm, call):
    code = (
        "import os, time\n"
        "from erdmampi import MPI\n"
        "c = MPI.COMM_WORLD\n"
        "c.Barrier()\n"
        "if c.rank == 1:\n"
        "    time.sleep(0.2)\n"
        "    os._exit(0)  # vanish without a goodbye\n"
        "import numpy as np\n"
        "t0 = time.monotonic()\n"
        "try:\n"
        f"    {DEAD_PEER_CALLS[call]}\n"
        "    print('received?!', flush=True)\n"
        "except MPI.Exception as e:\n"
        "    print('error class', e.Get_error_class(), 'after %.1f s' % (time.monotonic() - t0),\n"
        "          flush=True)\n"
        "os._exit(0)\n"
    )
    # over QUIC the silence is noticed after ERDMA_TIMEOUT; over shared memory
    # the peer's pid is watched, so it is noticed sooner
    res = run_mpi(2, code, env={"ERDMA_TIMEOUT": "2", "ERDMA_SHM": shm}, timeout=60)
    out = res.stdout + res.stderr
    assert "error class" in out, out
    line = next(l for l in res.stdout.splitlines() if l.startswith("error class"))
    elapsed = float(line.split()[-2])
    if shm == "0":
        assert 1.0 <= elapsed < 10.0, line
        assert "no reply within ERDMA_TIMEOUT" in res.stderr, res.stderr
    else:
        assert elapsed < 5.0, line
        assert "same host) has exited" in res.stderr, res.stderr


def test_start_up_leaves_the_avx_upper_halves_clear():
    """The rendezvous records' ChaCha20-Poly1305 leaves the AVX upper halves
    in use, which made every later SSE instruction of the rank's main thread
    (NumPy's among them) wait on them: start-up clears them (erdma_cpu.c)."""
    code = ("from erdmampi import MPI\n"
            "from erdmampi._engine import cpu_upper_in_use\n"
            "c = MPI.COMM_WORLD\n"
            "print('rank', c.rank, 'upper', cpu_upper_in_use(), flush=True)\n"
            "c.Barrier()\n")
    res = run_mpi(2, code, timeout=60)
    assert res.returncode == 0, res.stderr[-2000:]
    got = sorted(line.split()[-1] for line in res.stdout.splitlines() if " upper " in line)
    assert len(got) == 2, res.stdout
    if got[0] == "None":
        pytest.skip("this CPU does not report which register state is in use (XINUSE)")
    assert got == ["False", "False"], res.stdout
