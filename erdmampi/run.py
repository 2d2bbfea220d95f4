"""Run a Python program so that an uncaught exception aborts the whole job.

``python -m erdmampi [options] <pyfile> [arg] ...`` (also ``-m mod``, ``-c cmd``
and ``-``), like ``python -m mpi4py``: without it, one rank dying with an
exception could leave the others blocked in a receive; with it, the
exception's traceback is printed and ``COMM_WORLD.Abort(1)`` ends every rank.
Uses the public ``MPI`` API only.
"""

import os
import sys

__all__ = ["main", "run_command_line", "set_abort_status"]

_ABORT_STATUS = [None]


def set_abort_status(status):
    """Exit status used by the abort at exit (None: do not abort)."""
    if isinstance(status, SystemExit):
        status = status.code
    elif isinstance(status, KeyboardInterrupt):
        from signal import SIGINT
        status = SIGINT + 128
    if not isinstance(status, int):
        status = 0 if status is None else 1
    _ABORT_STATUS[0] = status if status else None


def run_command_line(args=None):
    """Run ``[pyfile | -m mod | -c cmd | -] [arg] ...`` as ``__main__``."""
    from runpy import run_module, run_path

    def run_string(cmd, filename, argv0):
        import types
        code = compile(cmd, filename, "exec")
        module = types.ModuleType("__main__")
        module.__file__ = filename if argv0 != "-c" else None
        sys.modules["__main__"] = module
        sys.argv[0] = argv0
        exec(code, module.__dict__)

    sys.argv[:] = list(args) if args is not None else sys.argv[1:]
    if sys.argv[0] == "-":
        run_string(sys.stdin.read(), "<stdin>", "-")
    elif sys.argv[0] == "-c":
        cmd = sys.argv.pop(1)
        run_string(cmd, "<string>", "-c")
    elif sys.argv[0] == "-m":
        del sys.argv[0]
        run_module(sys.argv[0], run_name="__main__", alter_sys=True)
    else:
        path = os.path.dirname(sys.argv[0])
        sys.path.insert(0, os.path.abspath(path) if path else "")
        run_path(sys.argv[0], run_name="__main__")


def _abort_at_exit():
    status = _ABORT_STATUS[0]
    if status is None:
        return
    from erdmampi import MPI
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.COMM_WORLD.Abort(status)


def _usage(prog, err=None):
    text = (f"usage: python -m {prog} [options] <pyfile> [arg] ...\n"
            f"   or: python -m {prog} [options] -m <mod> [arg] ...\n"
            f"   or: python -m {prog} [options] -c <cmd> [arg] ...\n"
            f"   or: python -m {prog} [options] - [arg] ...\n"
            "options:\n"
            "  --version      print the erdmampi version and exit\n"
            "  --mpi-library  print the MPI library version and exit\n"
            "  -rc KEY=VALUE  set erdmampi.rc options\n"
            "  -h, --help     show this help and exit\n")
    if err:
        sys.stderr.write(f"{prog}: {err}\n{text}")
        sys.exit(2)
    sys.stdout.write(text)
    sys.exit(0)


def _parse_rc(text):
    import erdmampi
    opts = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        key, value = key.strip(), value.strip()
        try:
            value = eval(value, {}, {"true": True, "false": False,
                                     "True": True, "False": False, "None": None})
        except Exception:
            pass
        opts[key] = value
    erdmampi.rc(**opts)


def main(prog="erdmampi"):
    """Entry point of ``python -m erdmampi``."""
    args = sys.argv[1:]
    while args and args[0].startswith("-") and args[0] not in ("-", "-m", "-c"):
        opt = args.pop(0)
        if opt in ("-h", "--help"):
            _usage(prog)
        elif opt == "--version":
            import erdmampi
            print(f"erdmampi {erdmampi.__version__}")
            sys.exit(0)
        elif opt == "--mpi-library":
            from erdmampi import MPI
            print(MPI.Get_library_version())
            sys.exit(0)
        elif opt == "-rc" or opt == "--rc":
            if not args:
                _usage(prog, "-rc needs KEY=VALUE")
            _parse_rc(args.pop(0))
        else:
            _usage(prog, f"unknown option {opt!r}")
    if not args:
        _usage(prog, "no path specified for execution")
    if args[0] in ("-m", "-c") and len(args) < 2:
        _usage(prog, f"argument expected for option {args[0]}")

    try:
        run_command_line(args)
    except SystemExit as exc:
        set_abort_status(exc)
        if _ABORT_STATUS[0] is None:
            raise
        _abort_now()
    except KeyboardInterrupt as exc:
        set_abort_status(exc)
        _abort_now(traceback=True)
    except BaseException:
        set_abort_status(1)
        _abort_now(traceback=True)


def _abort_now(traceback=False):
    """Print the traceback, then abort every rank (before any atexit Finalize)."""
    if traceback:
        import traceback as tb
        tb.print_exc()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    status = _ABORT_STATUS[0] or 1
    if "erdmampi.MPI" in sys.modules:
        _abort_at_exit()
    os._exit(status)

if __name__ == "__main__":
    main("erdmampi.run")
