"""Execute computations asynchronously using MPI processes (as ``mpi4py.futures``).

Worker processes come from a static world: run the program with
``erdmarun -n N python -m erdmampi.futures script.py`` (rank 0 runs the
script, the other ranks serve its executors) or use ``MPICommExecutor``.
Spawning workers is not available and raises ``MPI.Exception`` with
``ERR_UNSUPPORTED_OPERATION``.
"""
# pylint: disable=redefined-builtin

from ._base import (  # noqa: F401
    ALL_COMPLETED,
    FIRST_COMPLETED,
    FIRST_EXCEPTION,
    BrokenExecutor,
    CancelledError,
    Executor,
    Future,
    InvalidStateError,
    TimeoutError,  # noqa: A004
    as_completed,
    wait,
)
from .pool import (
    MPICommExecutor,
    MPIPoolExecutor,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    get_comm_workers,
)
from .util import collect, compose

__all__ = [
    "Future",
    "Executor",
    "wait",
    "FIRST_COMPLETED",
    "FIRST_EXCEPTION",
    "ALL_COMPLETED",
    "as_completed",
    "CancelledError",
    "TimeoutError",
    "InvalidStateError",
    "BrokenExecutor",
    "MPIPoolExecutor",
    "MPICommExecutor",
    "ThreadPoolExecutor",
    "ProcessPoolExecutor",
    "get_comm_workers",
    "collect",
    "compose",
]
