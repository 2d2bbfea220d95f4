"""The C engine through its Python wrapper, between real processes over QUIC."""
import time

import pytest

from harness import run_mpi, REPO

SCRIPTS = REPO / "tests" / "scripts"


@pytest.mark.slow
@pytest.mark.parametrize("shm,cma", [("1", "1"), ("1", "0"), ("0", "0")],
                         ids=["shm-cma", "shm-ring", "quic"])
def test_engine_p2p_semantics(shm, cma):
    # ERDMA_SHM=0 forces QUIC between ranks on one host; ERDMA_SHM_CMA=0 sends
    # large messages through the shared-memory ring instead of one-copy reads
    res = run_mpi(2, SCRIPTS / "engine_p2p.py", timeout=120,
                  env={"ERDMA_TIMEOUT": "2", "ERDMA_SHM": shm, "ERDMA_SHM_CMA": cma,
                       "ERDMA_SHM_RING": "65536"})
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "[0] OK" in out and "[1] OK" in out, out


@pytest.mark.slow
def test_sixteen_ranks_connect_quickly():
    code = (
        "import time; t0 = time.monotonic()\n"
        "from erdmampi import bootstrap\n"
        "e = bootstrap.init_world()\n"
        "import numpy as np\n"
        "a = np.array([e.rank], 'i8'); b = np.zeros(e.size, 'i8')\n"
        "rs = [e.irecv(b[i:].ctypes.data, 8, i, 1, 0) for i in range(e.size)]\n"
        "ss = [e.isend(a.ctypes.data, 8, i, 1, 0) for i in range(e.size)]\n"
        "[r.wait() for r in rs + ss]\n"
        "assert b.tolist() == list(range(e.size)), b\n"
        "print('setup', e.rank, round(time.monotonic() - t0, 3), flush=True)\n"
        "bootstrap.shutdown_world()\n"
    )
    t0 = time.monotonic()
    res = run_mpi(16, code, timeout=120)
    wall = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    times = [float(l.split()[2]) for l in res.stdout.splitlines() if l.startswith("setup")]
    assert len(times) == 16
    # the bound: a 16-rank mesh on one machine forms in a few seconds
    assert max(times) < 5.0, times
    assert wall < 30, wall


def test_engine_never_shares_its_udp_port():
    # with SO_REUSEADDR on both sockets Linux lets two bind one port (and may
    # give two port-0 binds the same one): a rank then receives another's
    # handshakes and its peers fail with a foreign certificate
    import socket
    from erdmampi._engine import Engine, EngineError
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    try:
        with pytest.raises(EngineError, match="in use"):
            e = Engine.create(0, 2, bind="127.0.0.1", port=port, insecure=True)
            e.shutdown(1.0)
    finally:
        s.close()


@pytest.mark.slow
def test_crashed_job_leaves_no_shared_memory():
    # rank 1 dies between creating its segment and mapping rank 0's, so no
    # segment is ever fully mapped (and unlinked) by the ranks themselves
    code = (
        "import glob, os, time\n"
        "from erdmampi import _engine\n"
        "def die(self):\n"
        "    job = os.environ['ERDMA_JOBID']\n"
        "    while len(glob.glob(f'/dev/shm/erdma-{job}-*')) < 2:\n"
        "        time.sleep(0.01)\n"
        "    print('segments exist', flush=True)\n"
        "    os._exit(3)\n"
        "if os.environ['ERDMA_RANK'] == '1':\n"
        "    _engine.Engine.connect = die\n"
        "from erdmampi import MPI\n"
    )
    import glob
    before = set(glob.glob("/dev/shm/erdma-*"))
    res = run_mpi(2, code, timeout=60, env={"ERDMA_CONNECT_TIMEOUT": "5"})
    assert res.returncode == 3, res.stdout + res.stderr
    assert "segments exist" in res.stdout
    assert set(glob.glob("/dev/shm/erdma-*")) <= before


def test_engine_config_reports_the_settings_in_effect():
    """Engine.config(): the settings given, the defaults otherwise, and the
    CMA threshold for a collective's blocks as None where it means never."""
    from erdmampi._engine import Engine
    for tuning, want in (({}, None), ({"shm_bulk_cma_min": 65536}, 65536),
                         ({"shm_bulk_cma_min": 0}, None)):
        e = Engine.create(0, 1, eager_limit=32768, chunk_size=1 << 20, **tuning)
        try:
            cfg = e.config()
            assert cfg["shm_bulk_cma_min"] == want, (tuning, cfg)
            assert cfg["eager_limit"] == 32768 and cfg["chunk_size"] == 1 << 20
            assert cfg["shm_eager_limit"] >= 32768
        finally:
            e.shutdown(1.0)
