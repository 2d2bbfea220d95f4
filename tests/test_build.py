"""The package builds from source: `pip install .` into a fresh virtualenv, and a
clear message naming the Debian packages when the C libraries are missing."""
import os
import shutil
import subprocess
import sys
import venv

import pytest

from harness import REPO


def test_missing_c_libraries_are_named():
    env = dict(os.environ, PKG_CONFIG_LIBDIR="/nonexistent", PKG_CONFIG_PATH="")
    p = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    msg = p.stdout + p.stderr
    assert "apt-get install -y libngtcp2-dev libngtcp2-crypto-gnutls-dev libgnutls28-dev" in msg, msg


@pytest.mark.slow
def test_pip_install_into_fresh_venv(tmp_path):
    # a copy of the tracked tree, so the build cannot pick up in-place artefacts
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, src / f)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    code = ("from erdmampi import MPI; c = MPI.COMM_WORLD; "
            "print('sum', c.allreduce(c.rank), MPI.get_vendor()[0])")
    run = subprocess.run([str(env_dir / "bin" / "erdmarun"), "-n", "2", str(py), "-c", code],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("sum 1 erdmampi") == 2, run.stdout
