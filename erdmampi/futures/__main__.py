"""``python -m erdmampi.futures <pyfile | -m mod | -c cmd | -> [arg] ...``.

Rank 0 of ``COMM_WORLD`` runs the program; its ``MPIPoolExecutor`` instances
share the other ranks as workers, which serve until rank 0 finishes.
"""

import os
import sys


class _UsageExit(SystemExit):
    pass


def _usage(error=None):
    python = os.path.basename(sys.executable)
    text = (f"usage: {python} -m erdmampi.futures <pyfile> [arg] ...\n"
            f"   or: {python} -m erdmampi.futures -m <module> [arg] ...\n"
            f"   or: {python} -m erdmampi.futures -c <string> [arg] ...")
    if error:
        print(error, file=sys.stderr)
        print(text, file=sys.stderr)
    else:
        print(text)
    raise _UsageExit(1 if error else 0)


def _check_command_line():
    args = sys.argv[1:]
    if not args:
        _usage("No path specified for execution")
    elif args[0] == "-":
        pass
    elif args[0] in ("-h", "--help"):
        _usage()
    elif args[0] in ("-m", "-c"):
        if len(args) < 2:
            _usage(f"Argument expected for option: {args[0]}")
    elif args[0].startswith("-"):
        _usage(f"Unknown option: {args[0]}")
    elif not os.path.exists(args[0]):
        _usage(f"Path does not exist: {args[0]}")


def main():
    """Entry point for ``python -m erdmampi.futures ...``."""
    from ..run import run_command_line, set_abort_status
    from ._core import SharedPoolCtx

    try:
        with SharedPoolCtx() as context:
            if context is not None:
                _check_command_line()
                run_command_line()
    except _UsageExit:
        raise
    except (SystemExit, KeyboardInterrupt) as exc:
        set_abort_status(exc)
        raise
    except BaseException:
        set_abort_status(1)
        raise


if __name__ == "__main__":
    main()
