"""An uncaught exception on one rank ends the job, with its traceback and a
non-zero exit status, instead of leaving the other ranks waiting (as
``python -m mpi4py`` does for mpi4py); ERDMA_ABORT_ON_EXCEPTION=0 opts out."""
import time

import pytest

from harness import run_mpi

# rank 1 fails before sending what rank 0 waits for
FAILS_ON_RANK_1 = """
import atexit
from erdmampi import MPI
c = MPI.COMM_WORLD
atexit.register(lambda: print("user atexit ran on", c.rank, flush=True))
if c.rank == 1:
    raise ValueError("boom on rank 1")
c.recv(source=1)
print("rank", c.rank, "received", flush=True)
"""


def test_exception_on_one_rank_ends_the_job():
    t0 = time.monotonic()
    r = run_mpi(2, FAILS_ON_RANK_1, timeout=60)
    took = time.monotonic() - t0
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert took < 20, took
    assert "ValueError: boom on rank 1" in r.stderr
    assert "Traceback" in r.stderr
    assert "MPI_Abort" in r.stderr
    assert "received" not in r.stdout
    # handlers the program registered after importing MPI still run
    assert "user atexit ran on 1" in r.stdout


@pytest.mark.slow
def test_opt_out_keeps_the_plain_exit():
    # without the abort rank 1 waits in Finalize and rank 0 in its receive,
    # until erdmarun's --timeout
    r = run_mpi(2, FAILS_ON_RANK_1, timeout=8, env={"ERDMA_ABORT_ON_EXCEPTION": "0"})
    assert r.returncode == 124, (r.returncode, r.stdout, r.stderr)
    assert "ValueError: boom on rank 1" in r.stderr
    assert "MPI_Abort" not in r.stderr


def test_single_rank_exits_with_python_status():
    r = run_mpi(1, "from erdmampi import MPI\nraise KeyError('k')\n", timeout=60)
    assert r.returncode == 1
    assert "KeyError: 'k'" in r.stderr


def test_systemexit_is_not_an_error():
    r = run_mpi(2, "from erdmampi import MPI\nimport sys\nMPI.COMM_WORLD.Barrier()\n"
                   "sys.exit(0)\n", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "MPI_Abort" not in r.stderr


def test_a_bad_setting_is_named():
    r = run_mpi(1, "from erdmampi import MPI\n", timeout=60,
                env={"ERDMA_ABORT_ON_EXCEPTION": "maybe"})
    assert r.returncode == 2  # erdmarun checks the ranks' environment first
    assert "ERDMA_ABORT_ON_EXCEPTION='maybe' is not valid" in r.stderr


# -- where is each rank? -------------------------------------------------------
DEADLOCK = """
import numpy as np
from erdmampi import MPI
c = MPI.COMM_WORLD
buf = np.zeros(10)
print("ready", flush=True)
if c.rank == 0:
    c.Recv(buf, source=1, tag=5)
else:
    c.Recv(buf, source=0, tag=7)
"""


def test_timeout_prints_every_ranks_stack_and_pending_operations():
    r = run_mpi(2, DEADLOCK, timeout=5)
    assert r.returncode == 124, (r.stdout, r.stderr)
    err = r.stderr
    assert "asking 2 rank(s) for their stacks" in err
    for rank, (src, tag) in ((0, (1, 5)), (1, (0, 7))):
        mine = [ln for ln in err.splitlines() if ln.startswith(f"[rank {rank}] ")]
        text = "\n".join(mine)
        assert "erdmampi: stack dump of pid" in text, err
        assert f"c.Recv(buf, source={src}, tag={tag})" in text, err
        assert f"posted receive: source {src} tag {tag} ctx" in text, err
        assert "stackdump.py" not in text  # the dump's own frames are left out


def test_sigusr1_dumps_and_the_job_goes_on():
    script = """
import os, signal, time
from erdmampi import MPI
c = MPI.COMM_WORLD
if c.rank == 0:
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.5)
c.Barrier()
print("done", c.rank, flush=True)
"""
    r = run_mpi(2, script, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("done") == 2
    assert "[rank 0] erdmampi: stack dump of pid" in r.stderr
    assert "[rank 0] pending operations:" in r.stderr


def test_a_program_handler_for_sigusr1_is_kept():
    script = """
import os, signal, time
signal.signal(signal.SIGUSR1, lambda *a: print("mine", flush=True))
from erdmampi import MPI
os.kill(os.getpid(), signal.SIGUSR1)
time.sleep(0.2)
"""
    r = run_mpi(1, script, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "mine" in r.stdout
    assert "stack dump" not in r.stderr


def test_erdmarun_dump_asks_a_running_job():
    import os
    import subprocess
    import sys
    from harness import erdmarun_cmd, rank_env
    job = subprocess.Popen(erdmarun_cmd() + ["-n", "2", "--timeout", "60", sys.executable, "-c",
                                             DEADLOCK], env=rank_env(None), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert job.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        d = subprocess.run(erdmarun_cmd() + ["--dump", str(job.pid)], env=rank_env(None),
                           capture_output=True, text=True, timeout=30)
        assert d.returncode == 0, d.stderr
        time.sleep(2.0)
        bad = subprocess.run(erdmarun_cmd() + ["--dump", str(os.getpid())], env=rank_env(None),
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1 and "is not erdmarun" in bad.stderr
    finally:
        job.terminate()
        out, err = job.communicate(timeout=30)
    for rank, (src, tag) in ((0, (1, 5)), (1, (0, 7))):
        assert f"[rank {rank}] erdmampi: stack dump of pid" in err, err
        assert f"[rank {rank}]   posted receive: source {src} tag {tag}" in err, err
