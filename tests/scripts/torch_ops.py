"""Every torch.distributed operation on a few dtypes; prints one line per
result, ``<rank> <key> <values>``, so that a run with the erdma backend can
be compared line by line with a run with gloo (argv[1]).  A line
``<rank> <key> ERROR <type>`` marks an operation the backend refused.
argv[2] ``cuda`` makes every tensor a CUDA tensor (rank r on GPU
``r % device_count``); the printed values do not change.

Inputs are small integers, so every sum, product and mean is exact in every
dtype and any reduction order gives the same bits."""
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "erdma":
    import erdmampi.torch  # noqa: F401  (registers the backend)

if sys.argv[2:3] == ["cuda"]:
    import os
    gpu = torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    torch.cuda.set_device(gpu)
    torch.set_default_device(gpu)
dist.init_process_group(backend)
r, n = dist.get_rank(), dist.get_world_size()
print(f"{r} device {torch.zeros(1).device.type}", flush=True)
R = dist.ReduceOp


def out(key, val):
    if isinstance(val, torch.Tensor):
        val = val.to(torch.float64).flatten().tolist() if val.dtype == torch.bfloat16 \
            else val.flatten().tolist()
    elif isinstance(val, (list, tuple)) and val and isinstance(val[0], torch.Tensor):
        val = [v.to(torch.float64).flatten().tolist() for v in val]
    print(f"{r} {key} {val}", flush=True)


def attempt(key, fn):
    try:
        fn()
    except Exception as e:          # the line says which; the test decides
        print(f"{r} {key} ERROR {type(e).__name__}: {str(e).splitlines()[0][:80]}", flush=True)


def base(dt, k=6, shift=0):
    return ((torch.arange(k) + r + shift) % 4 + 1).to(dt)


FLOATS = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
INTS = [torch.int32, torch.int64, torch.uint8, torch.int8]

for dt in FLOATS + INTS:
    name = str(dt).split(".")[1]
    ops = [R.SUM, R.PRODUCT, R.MIN, R.MAX] + ([R.AVG] if dt in FLOATS else [R.BAND, R.BOR, R.BXOR])
    for op in ops:
        opn = str(op).split(".")[-1]

        def f(op=op, opn=opn):
            t = base(dt)
            dist.all_reduce(t, op=op)
            out(f"allreduce.{opn}.{name}", t)
        attempt(f"allreduce.{opn}.{name}", f)

    def noncontig():
        m = torch.stack([base(dt, 4), base(dt, 4, 1), base(dt, 4, 2)]).t()   # 4x3, strided
        assert not m.is_contiguous()
        dist.all_reduce(m)
        out(f"allreduce.noncontig.{name}", m)
        b = torch.zeros(3, 4, dtype=dt).t() + r * 3 + 1
        dist.broadcast(b, src=n - 1)
        out(f"broadcast.noncontig.{name}", b)
    attempt(f"noncontig.{name}", noncontig)

    def async_ar():
        t = base(dt)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        fut = dist.all_reduce(t, op=R.MAX, async_op=True).get_future()
        res = fut.wait()
        out(f"allreduce.async.{name}", res[0] if isinstance(res, list) else t)
    attempt(f"allreduce.async.{name}", async_ar)

    def bcast():
        t = base(dt) * (r + 1)
        dist.broadcast(t, src=n - 1)
        out(f"broadcast.{name}", t)
    attempt(f"broadcast.{name}", bcast)

    def reduce():
        t = base(dt)
        dist.reduce(t, dst=0)
        if r == 0:
            out(f"reduce.{name}", t)
    attempt(f"reduce.{name}", reduce)

    def allgather():
        outs = [torch.zeros(2, 3, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, base(dt).view(2, 3))
        out(f"allgather.{name}", outs)
        big = torch.zeros(n * 6, dtype=dt)
        dist.all_gather_into_tensor(big, base(dt))
        out(f"allgather_into_tensor.{name}", big)
        # in place, as FSDP calls it: the input is this rank's block of the output
        own = torch.zeros(n * 6, dtype=dt)
        own[r * 6:(r + 1) * 6] = base(dt)
        dist.all_gather_into_tensor(own, own[r * 6:(r + 1) * 6])
        out(f"allgather_into_tensor_own_block.{name}", own)
    attempt(f"allgather.{name}", allgather)

    def reduce_scatter():
        o = torch.zeros(3, dtype=dt)
        dist.reduce_scatter(o, [base(dt, 3, i) for i in range(n)])
        out(f"reduce_scatter.{name}", o)
        o2 = torch.zeros(2, dtype=dt)
        dist.reduce_scatter_tensor(o2, base(dt, 2 * n))
        out(f"reduce_scatter_tensor.{name}", o2)
        # the output in the input, at this rank's block (NCCL's in place)
        full = base(dt, 2 * n).clone()
        dist.reduce_scatter_tensor(full[2 * r:2 * r + 2], full)
        out(f"reduce_scatter_tensor_in_input.{name}", full[2 * r:2 * r + 2])
    attempt(f"reduce_scatter.{name}", reduce_scatter)

    def alltoall():
        o = torch.zeros(2 * n, dtype=dt)
        dist.all_to_all_single(o, base(dt, 2 * n))
        out(f"alltoall_single.{name}", o)
        # uneven: rank i sends i+j+1 rows to rank j
        ins = [i + r + 1 for i in range(n)]
        outs_ = [r + j + 1 for j in range(n)]
        src = base(dt, sum(ins) * 2).view(-1, 2)
        dst = torch.zeros(sum(outs_), 2, dtype=dt)
        dist.all_to_all_single(dst, src, outs_, ins)
        out(f"alltoall_single.uneven.{name}", dst)
        ol = [torch.zeros(3, dtype=dt) for j in range(n)]
        dist.all_to_all(ol, [base(dt, 3, i) for i in range(n)])
        out(f"alltoall.{name}", ol)
    attempt(f"alltoall.{name}", alltoall)

    def gather_scatter():
        gl = [torch.zeros(4, dtype=dt) for _ in range(n)] if r == 1 else None
        dist.gather(base(dt, 4), gl, dst=1)
        if r == 1:
            out(f"gather.{name}", gl)
        o = torch.zeros(4, dtype=dt)
        dist.scatter(o, [base(dt, 4, 3 * i) for i in range(n)] if r == 0 else None, src=0)
        out(f"scatter.{name}", o)
    attempt(f"gather_scatter.{name}", gather_scatter)


def p2p():
    nxt, prv = (r + 1) % n, (r - 1) % n
    x = torch.zeros(5)
    if r % 2 == 0:
        dist.send(base(torch.float32, 5) * 10, nxt)
        dist.recv(x, prv)
    else:
        dist.recv(x, prv)
        dist.send(base(torch.float32, 5) * 10, nxt)
    out("sendrecv", x)
    y = torch.zeros(7, dtype=torch.bfloat16)
    reqs = [dist.isend(base(torch.bfloat16, 7), nxt, tag=5), dist.irecv(y, prv, tag=5)]
    for q in reqs:
        q.wait()
    out("isend_irecv", y)
    z = torch.zeros(12, dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, base(torch.int64, 12) * 3, prv),
           dist.P2POp(dist.irecv, z, nxt)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    out("batch_isend_irecv", z)
    if r == 0:
        got = []
        for _ in range(n - 1):
            t = torch.zeros(2)
            src = dist.recv(t, tag=7)            # any source
            got.append((src, t.tolist()))
        out("recv_anysource", sorted(got))
    else:
        dist.send(torch.full((2,), float(r)), 0, tag=7)


attempt("p2p", p2p)


def p2p_noncontig():
    # gloo refuses non-contiguous tensors here: the line says "ok" or what differs
    nxt, prv = (r + 1) % n, (r - 1) % n
    z = torch.zeros(3, 4).t()
    ops = [dist.P2POp(dist.isend, (base(torch.float32, 12) * (r + 1)).view(3, 4).t(), prv),
           dist.P2POp(dist.irecv, z, nxt)]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    r_ = r
    want = (((torch.arange(12) + nxt) % 4 + 1).float() * (nxt + 1)).view(3, 4).t()
    print(f"{r_} p2p.noncontig", "ok" if torch.equal(z, want) else f"got {z} want {want}",
          flush=True)


attempt("p2p.noncontig", p2p_noncontig)


def objects():
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": r, "sq": [r] * r})
    out("all_gather_object", objs)
    lst = [f"from {r}", {"k": r}] if r == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    out("broadcast_object_list", lst)
    g = [None] * n if r == 0 else None
    dist.gather_object(("g", r), g, dst=0)
    if r == 0:
        out("gather_object", g)
    so = [None]
    dist.scatter_object_list(so, [f"s{i}" for i in range(n)] if r == 0 else None, src=0)
    out("scatter_object_list", so)


attempt("objects", objects)


def subgroups():
    members = [0, n - 1]
    g = dist.new_group(members)
    if r in members:
        t = base(torch.float32) * (r + 1)
        dist.all_reduce(t, group=g)
        out("subgroup.allreduce", t)
        b = torch.zeros(3) + r
        dist.broadcast(b, src=n - 1, group=g)
        out("subgroup.broadcast", b)
        objs = [None] * 2
        dist.all_gather_object(objs, r, group=g)
        out("subgroup.objects", objs)
    t = base(torch.float64)
    dist.all_reduce(t)                           # the world still works alongside
    out("world.after_subgroup", t)


attempt("subgroups", subgroups)
dist.barrier()
print(f"{r} barrier done", flush=True)
dist.destroy_process_group()
