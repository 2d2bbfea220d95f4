"""Where is each rank? A stack dump on SIGUSR1.

On SIGUSR1 a rank prints, every line tagged ``[rank N]``, the Python stack of
each of its threads and the engine's pending operations (posted receives,
sends waiting for their receivers, unexpected messages, lost peers).
``erdmarun`` sends SIGUSR1 to every rank when ``--timeout`` expires, before it
terminates them, and forwards a SIGUSR1 it receives itself, so
``kill -USR1 <erdmarun pid>`` shows where a running job is.

The handler is installed when MPI is initialized, unless the program already
handles SIGUSR1 (then the program's handler stays) or ERDMA_STACK_DUMP=0.
"""
import os
import signal
import sys
import threading
import traceback

__all__ = ["install", "dump"]


def dump(file=None, engine=None, rank=None):
    """Write the dump now (also usable from a debugger or a program)."""
    out = file if file is not None else sys.stderr
    tag = f"[rank {rank}] " if rank is not None else ""
    names = {t.ident: t.name for t in threading.enumerate()}
    lines = [f"erdmampi: stack dump of pid {os.getpid()}"]
    for ident, frame in sys._current_frames().items():
        lines.append(f"thread {names.get(ident, ident)}:")
        stack = [f for f in traceback.extract_stack(frame) if f.filename != __file__]
        for entry in traceback.format_list(stack):
            lines.extend("  " + ln for ln in entry.rstrip("\n").split("\n"))
    lines.append("pending operations:")
    if engine is None:
        lines.append("  no engine")
    else:
        try:
            lines.extend(engine.describe().rstrip("\n").split("\n"))
        except Exception as exc:  # a dump must not raise into the program
            lines.append(f"  could not read them: {exc!r}")
    try:
        out.write("".join(f"{tag}{ln}\n" for ln in lines))
        out.flush()
    except Exception:
        pass


def _enabled():
    from . import config
    return config.get("ERDMA_STACK_DUMP")


def install(engine_of, rank):
    """Install the SIGUSR1 handler; ``engine_of()`` returns the engine or None."""
    if not _enabled() or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGUSR1) not in (signal.SIG_DFL, None):
        return False

    def handler(signum, frame):
        dump(engine=engine_of(), rank=rank)

    signal.signal(signal.SIGUSR1, handler)
    return True
