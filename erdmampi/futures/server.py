"""Entry point of spawned worker processes (``mpi4py.futures.server``).

erdmampi cannot spawn workers, so there is no parent to serve: this raises
``MPI.Exception(ERR_UNSUPPORTED_OPERATION)``.
"""


def main():
    """Entry point for worker processes."""
    from ._core import _unsupported
    _unsupported("erdmampi.futures.server")


if __name__ == "__main__":
    main()
