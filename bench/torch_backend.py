"""torch.distributed backends side by side: erdmampi's "erdma" against gloo.

    python -m bench.torch_backend --np 2,4 --rounds 3 --json out.json

For each rank count the driver launches the same worker under erdmarun once
per backend, alternating erdma and gloo ``--rounds`` times, and reports the
median of the rounds' medians and the ratio gloo time / erdma time (above 1:
erdma is faster).  Both backends run under erdmarun, which sets torchrun's
variables, so the only difference is the process group.

What is timed, per rank count:

* ``all_reduce`` (SUM) of float32 tensors of ``--sizes`` bytes: a barrier,
  then ``--iters`` calls; the time per call is rank 0's.  The data are
  ``torch.randn`` values (incompressible; on one host erdmampi does not
  compress anyway).
* one DistributedDataParallel training step (forward, backward with the
  gradient allreduce, SGD) of an MLP of ``--ddp-width`` hidden units and
  ``--ddp-layers`` layers on a batch of 64.

``--device cuda`` puts the tensors and the model on the GPU (rank r on GPU
``r % device_count``): erdma stages device memory through the host; gloo
uses its CUDA algorithms.

Worker mode (what the driver runs): ``erdmarun -n N python -m
bench.torch_backend --worker erdma|gloo [options]`` prints one JSON line.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

try:
    from bench.common import format_size, parse_size
except ImportError:                      # run as a file
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from bench.common import format_size, parse_size

BACKENDS = ("erdma", "gloo")


# -- worker (one rank of a job) ------------------------------------------------

def _sync(torch, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_calls(torch, dist, device, fn, iters):
    """Seconds per call of fn over iters calls, as rank 0 sees them."""
    fn()                                  # warm-up (first-call setup, caches)
    _sync(torch, device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(torch, device)
    return (time.perf_counter() - t0) / iters


def worker(args):
    import torch
    import torch.distributed as dist
    if args.worker == "erdma":
        import erdmampi.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.worker)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank))
                              % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    gen = torch.Generator().manual_seed(rank)
    out = {"backend": args.worker, "np": world, "device": args.device,
           "torch": torch.__version__, "allreduce": {}, "ddp": None}
    for size in args.sizes:
        t = torch.randn(size // 4, generator=gen).to(device)
        iters = max(3, min(args.iters, int(args.budget / max(size / 2e8, 1e-5))))
        sec = _time_calls(torch, dist, device, lambda: dist.all_reduce(t), iters)
        out["allreduce"][str(size)] = sec
    if args.ddp_layers > 0:
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        dims = [256] + [args.ddp_width] * args.ddp_layers + [1]
        layers = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers[:-1]).to(device)
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x = torch.randn(64, 256, generator=gen).to(device)
        y = torch.randn(64, 1, generator=gen).to(device)

        def step():
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        out["ddp"] = {"params": sum(p.numel() for p in model.parameters()),
                      "step": _time_calls(torch, dist, device, step, args.ddp_steps)}
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


# -- driver --------------------------------------------------------------------

def _launch(args, backend, n):
    cmd = ["erdmarun", "-n", str(n), "--timeout", str(args.timeout), sys.executable, "-m",
           "bench.torch_backend", "--worker", backend, "--device", args.device,
           "--sizes", ",".join(str(s) for s in args.sizes), "--iters", str(args.iters),
           "--budget", str(args.budget), "--ddp-width", str(args.ddp_width),
           "--ddp-layers", str(args.ddp_layers), "--ddp-steps", str(args.ddp_steps)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root,
                       timeout=args.timeout + 60)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError("%s -n %d failed (exit %d):\n%s" % (backend, n, p.returncode,
                                                           (p.stdout + p.stderr)[-3000:]))


def _median(runs, get):
    return statistics.median(get(r) for r in runs)


def summarize(results, sizes, nps):
    rows = []
    for n in nps:
        runs = {b: results[(b, n)] for b in BACKENDS}
        for s in sizes:
            e, g = (_median(runs[b], lambda r: r["allreduce"][str(s)]) for b in BACKENDS)
            rows.append({"np": n, "what": "all_reduce %s" % format_size(s),
                         "erdma_s": e, "gloo_s": g, "ratio": g / e})
        if runs["erdma"][0]["ddp"]:
            e, g = (_median(runs[b], lambda r: r["ddp"]["step"]) for b in BACKENDS)
            rows.append({"np": n, "what": "DDP step (%d params)" % runs["erdma"][0]["ddp"]["params"],
                         "erdma_s": e, "gloo_s": g, "ratio": g / e})
    return rows


def _fmt(sec):
    return "%.0f µs" % (sec * 1e6) if sec < 1e-2 else "%.2f ms" % (sec * 1e3)


def markdown(rows):
    lines = ["| ranks | what | erdma | gloo | gloo / erdma |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %s | %s | %s | %.2f× |" % (r["np"], r["what"], _fmt(r["erdma_s"]),
                                                      _fmt(r["gloo_s"]), r["ratio"]))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.torch_backend",
                                 description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--np", default="2,4", help="rank counts (default 2,4)")
    ap.add_argument("--rounds", type=int, default=3, help="alternated launches per backend")
    ap.add_argument("--sizes", default="1MiB,16MiB,64MiB", help="all_reduce sizes in bytes")
    ap.add_argument("--iters", type=int, default=50, help="calls per timing (fewer for big sizes)")
    ap.add_argument("--budget", type=float, default=2.0,
                    help="rough seconds per size, assuming 200 MB/s (caps --iters)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--ddp-width", type=int, default=1024, help="MLP hidden units")
    ap.add_argument("--ddp-layers", type=int, default=4, help="MLP hidden layers (0: no DDP)")
    ap.add_argument("--ddp-steps", type=int, default=30, help="timed DDP steps")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per launch")
    ap.add_argument("--json", help="write rows and raw runs here")
    ap.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.worker:
        return worker(args)
    nps = [int(x) for x in args.np.split(",")]
    results = {}
    for n in nps:
        for rnd in range(args.rounds):
            order = BACKENDS if rnd % 2 == 0 else BACKENDS[::-1]
            for b in order:
                results.setdefault((b, n), []).append(_launch(args, b, n))
                print("np=%d round %d/%d %s done" % (n, rnd + 1, args.rounds, b),
                      file=sys.stderr, flush=True)
    rows = summarize(results, args.sizes, nps)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "rows": rows,
                       "runs": {"%s/%d" % k: v for k, v in results.items()},
                       "command": " ".join(["python -m bench.torch_backend"] + (argv or sys.argv[1:]))},
                      f, indent=1)


if __name__ == "__main__":
    main()
