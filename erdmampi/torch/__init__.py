"""torch.distributed on erdmampi: ``import erdmampi.torch`` registers the
backend ``"erdma"``.

>>> import torch.distributed as dist
>>> import erdmampi.torch
>>> dist.init_process_group("erdma")        # under erdmarun: no other argument

erdmarun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` as torchrun does, so torch's default
``env://`` rendezvous finds them.  Where rank 0's host cannot be reached on
``MASTER_PORT`` (sites joined over the Internet), ``init_method="erdma://"``
takes rank and size from erdmampi and needs no torch store server at all:
the erdma backend itself never uses the store.

Compression hooks for ``DistributedDataParallel``: :mod:`erdmampi.torch.hooks`.
This package is the only part of erdmampi that imports torch.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from torch.distributed.rendezvous import register_rendezvous_handler

from erdmampi import config as _config

# DDP's traffic comes in bursts with idle gaps: paced, a step with the int8
# hook took 0.26-0.34 s against 0.34-0.49 s at 1 % loss.  So a process that
# imports the backend before erdmampi.MPI (which starts the engine) paces,
# unless ERDMA_PACE says otherwise.
_config.prefer("ERDMA_PACE", True)

from erdmampi.torch.process_group import ErdmaWork, ProcessGroupErdma, create_backend  # noqa: E402

__all__ = ["BACKEND", "ProcessGroupErdma", "ErdmaWork", "create_backend"]

#: the name to give ``init_process_group`` / ``new_group``
BACKEND = "erdma"


def _erdma_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs):
    """``erdma://``: rank and size of the erdmarun job, a process-local store
    (the erdma backend needs none)."""
    from erdmampi import MPI
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    # a rank or world_size given to init_process_group is checked by the creator
    store = dist.HashStore()
    store.set_timeout(timeout)
    yield store, rank, size
    raise RuntimeError("erdma:// rendezvous: no second rendezvous")


def _register():
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, create_backend, extended_api=True,
                                      devices=["cpu", "cuda"])
    try:
        register_rendezvous_handler("erdma", _erdma_rendezvous)
    except ValueError:      # registered already (a reload)
        pass


_register()
