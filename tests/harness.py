"""Run scripts under erdmarun from tests: ``run_mpi(2, "print(1)")``.

The launcher is started as ``sys.executable -m erdmampi.launcher``; when
erdmampi is not installed (for instance while the engine does not build yet)
it is loaded straight from the source tree, and the ranks get the tree on
PYTHONPATH.
"""
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["REPO", "erdmarun_cmd", "run_mpi", "rank_env"]

REPO = Path(__file__).resolve().parent.parent

_BOOTSTRAP = (
    "import importlib.util, sys\n"
    "sys.path.insert(0, {repo!r})\n"
    "spec = importlib.util.spec_from_file_location('erdmampi.launcher', {init!r},\n"
    "    submodule_search_locations=[{pkg!r}])\n"
    "mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod\n"
    "spec.loader.exec_module(mod)\n"
    "from erdmampi.launcher.cli import main\n"
    "sys.argv[0] = 'erdmarun'; sys.exit(main())\n"
)


def _installed():
    try:
        return importlib.util.find_spec("erdmampi.launcher") is not None
    except ImportError:
        return False


def erdmarun_cmd():
    """argv prefix that runs erdmarun with this interpreter."""
    if _installed():
        return [sys.executable, "-m", "erdmampi.launcher"]
    code = _BOOTSTRAP.format(repo=str(REPO), init=str(REPO / "launcher" / "__init__.py"),
                             pkg=str(REPO / "launcher"))
    return [sys.executable, "-c", code]


def rank_env(env=None):
    """Environment for erdmarun (and so the ranks): ours, ``env`` on top, the tree importable."""
    full = dict(os.environ)
    if not _installed():
        full["PYTHONPATH"] = os.pathsep.join(
            [str(REPO)] + [p for p in full.get("PYTHONPATH", "").split(os.pathsep) if p])
    full.update(env or {})
    return full


def _is_path(script):
    if isinstance(script, Path):
        return True
    return "\n" not in script and script.endswith(".py") and os.path.isfile(script)


def run_mpi(nprocs, script, args=(), timeout=60, env=None, extra=(), python_args=()):
    """Run ``erdmarun -n NPROCS [EXTRA...] python SCRIPT ARGS...`` and capture its output.

    :param script: Python source text, or the path of a ``.py`` file.
    :param timeout: passed to erdmarun as ``--timeout`` (exit status 124 when it
        expires); the call itself gives up 30 s later.
    :param env: variables added to the environment of erdmarun and the ranks.
    :param extra: more erdmarun options, e.g. ``["--tag-output"]``.
    :returns: :class:`subprocess.CompletedProcess` with text ``stdout``/``stderr``.
    """
    with tempfile.TemporaryDirectory(prefix="erdma-run-") as tmp:
        if _is_path(script):
            path = str(script)
        else:
            path = os.path.join(tmp, "script.py")
            with open(path, "w") as f:
                f.write(script)
        cmd = (erdmarun_cmd() + ["-n", str(nprocs), "--timeout", str(timeout)] + list(extra)
               + ["--", sys.executable] + list(python_args) + [path] + [str(a) for a in args])
        return subprocess.run(cmd, env=rank_env(env), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout + 30,
                              stdin=subprocess.DEVNULL)
