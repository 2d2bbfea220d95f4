"""FSDP2 (``fully_shard`` on a 1-D CPU device mesh) trains a small MLP for a
few steps; every rank prints ``<rank> final_loss=... param_sum=...`` so that
a run with ``--backend erdma`` can be compared with one with ``--backend
gloo``.

    erdmarun -n 2 python tests/scripts/torch_fsdp.py --backend erdma

``--divide-factor F`` divides the gradients by F instead of the world size
(FSDP2 reduce-scatters them with ``ReduceOp.PREMUL_SUM(1/F)``, or with SUM
and a division afterwards under ``--force-sum``, the way gloo needs);
``--hsdp R`` shards over a 2-D mesh (HSDP: all-reduce across R replicas);
``--mixed`` keeps bfloat16 parameters for compute and float32 gradients for
the reduction (``MixedPrecisionPolicy``).
"""
import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

ap = argparse.ArgumentParser()
ap.add_argument("--backend", default="erdma")
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--no-reshard", action="store_true", help="reshard_after_forward=False")
ap.add_argument("--divide-factor", type=float, default=None)
ap.add_argument("--force-sum", action="store_true")
ap.add_argument("--mixed", action="store_true")
ap.add_argument("--hsdp", type=int, default=0, metavar="R",
                help="a 2-D mesh (R, world/R): replicate over R groups, shard within each")
args = ap.parse_args()
if args.backend == "erdma":
    import erdmampi.torch  # noqa: F401  (registers the backend)

dist.init_process_group(args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
if args.hsdp:
    mesh = init_device_mesh("cpu", (args.hsdp, world // args.hsdp),
                            mesh_dim_names=("replicate", "shard"))
else:
    mesh = init_device_mesh("cpu", (world,))

torch.manual_seed(1)
dim, hidden = 16, 32
model = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                            torch.nn.Linear(hidden, 1))
kw = {"mesh": mesh, "reshard_after_forward": not args.no_reshard}
if args.mixed:
    kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                           reduce_dtype=torch.float32)
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, **kw)
fully_shard(model, **kw)
for m in model.modules():             # each fully_shard'ed module's own setting
    if isinstance(m, FSDPModule):
        if args.divide_factor is not None:
            m.set_gradient_divide_factor(args.divide_factor)
        if args.force_sum:
            m.set_force_sum_reduction_for_comms(True)

g = torch.Generator().manual_seed(0)
x = torch.randn(64 * world, dim, generator=g)
y = torch.randn(64 * world, 1, generator=g)
x, y = x[rank * 64:(rank + 1) * 64], y[rank * 64:(rank + 1) * 64]
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = torch.nn.MSELoss()
for step in range(args.steps):
    opt.zero_grad()
    loss = loss_fn(model(x).float(), y)
    loss.backward()
    opt.step()
with torch.no_grad():
    full = loss_fn(model(x).float(), y).detach().reshape(1)
dist.all_reduce(full)
for m in model.modules():             # sharded parameters again (--no-reshard)
    if isinstance(m, FSDPModule):
        m.reshard()
total = torch.zeros(1, dtype=torch.float64)
for p in model.parameters():            # DTensors: each rank sums its own shard
    total += p.to_local().detach().double().sum()
dist.all_reduce(total)
print(f"{rank} backend={args.backend} final_loss={full.item() / world:.9f} "
      f"param_sum={total.item():.12f}", flush=True)
dist.destroy_process_group()
