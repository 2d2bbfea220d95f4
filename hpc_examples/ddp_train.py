"""Train a small regression model with DistributedDataParallel over erdmampi.

    erdmarun -n 2 python hpc_examples/ddp_train.py
    erdmarun -n 2 python hpc_examples/ddp_train.py --hooks none,int8,bf16
    erdmarun -n 2 python hpc_examples/ddp_train.py --backend gloo   # the same with torch's gloo
    erdmarun -n 2 python hpc_examples/ddp_train.py --device cuda    # on GPUs (LOCAL_RANK picks one)
    erdmarun --rendezvous HOST:PORT --job-id J --secret-file job.key -n 2 --local-n 1 \
        python hpc_examples/ddp_train.py --init-method erdma://      # one rank per site, across NATs

A plain torch.distributed script: erdmarun sets RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT as torchrun does, and ``import erdmampi.torch`` registers the
backend "erdma".  Each rank trains on its own shard of a fixed synthetic data
set; DDP averages the gradients.  ``--hooks`` trains once per listed gradient
compression (none, lossless, bf16, int8, int4; the lossy ones with error
feedback) from the same initial weights and prints the final loss of each;
rank 0 prints one line per run.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import erdmampi.torch  # noqa: F401  (registers the "erdma" backend)
from erdmampi.torch import hooks


def make_data(rank, world, n=512, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(dim, 1, generator=g)
    x = torch.randn(n * world, dim, generator=g)
    y = torch.tanh(x @ w_true) + 0.05 * torch.randn(n * world, 1, generator=g)
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def make_model(dim=32, hidden=64, seed=1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, 1))


def train(hook, steps, lr, batch, device, group=None):
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = (v.to(device) for v in make_data(rank, world))
    model = DDP(make_model().to(device), process_group=group,
                device_ids=[device.index] if device.type == "cuda" else None)
    if hook != "none":
        model.register_comm_hook(hooks.CompressionState(hook, process_group=group),
                                 hooks.compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    for step in range(steps):
        i = (step * batch) % x.shape[0]
        opt.zero_grad()
        loss = loss_fn(model(x[i:i + batch]), y[i:i + batch])
        loss.backward()
        opt.step()
    with torch.no_grad():                   # loss over every rank's shard
        full = loss_fn(model(x), y).detach().reshape(1)
    dist.all_reduce(full)
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).cpu()
    return full.item() / world, params


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="erdma")
    ap.add_argument("--hooks", default="none", help="comma-separated: none,lossless,bf16,int8,int4")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--init-method", default="env://",
                    help="erdma:// across sites that cannot reach rank 0's TCP port (NATs)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: rank r trains on GPU LOCAL_RANK %% device_count")
    args = ap.parse_args()
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))
                              % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend, init_method=args.init_method)
    for hook in args.hooks.split(","):
        t0 = time.perf_counter()
        loss, params = train(hook, args.steps, args.lr, args.batch, device)
        if dist.get_rank() == 0:
            print(f"backend={args.backend} hook={hook} steps={args.steps} final_loss={loss:.6f} "
                  f"param_sum={params.double().sum().item():.9f} "
                  f"seconds={time.perf_counter() - t0:.2f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
