"""Data-parallel SGD on 4 ranks: a small numpy MLP trained twice from the
same start, gradients averaged once with the exact Allreduce and once with
int8 Allreduce + error feedback; the lossy run must converge like the exact
one.  Prints both final losses."""
import numpy as np
from _mpi import MPI, check, done

from erdmampi import compression as cz

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
D, H, K, B, STEPS, LR = 32, 64, 10, 128, 60, 0.3
rng = np.random.default_rng(1234)            # same model, centres on every rank
centres = rng.standard_normal((K, D)).astype(np.float32) * 0.35
w0 = [rng.standard_normal((D, H)).astype(np.float32) / np.sqrt(D), np.zeros(H, np.float32),
      rng.standard_normal((H, K)).astype(np.float32) / np.sqrt(H), np.zeros(K, np.float32)]
shapes = [w.shape for w in w0]
sizes = [w.size for w in w0]


def batch(step):
    g = np.random.default_rng(10_000 * step + r)  # each rank its own shard
    y = g.integers(0, K, B)
    x = centres[y] + g.standard_normal((B, D)).astype(np.float32)
    return x, y


def loss_grad(ws, x, y):
    w1, b1, w2, b2 = ws
    h = np.maximum(x @ w1 + b1, 0)
    z = h @ w2 + b2
    z -= z.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y] + 1e-12).mean()
    p[np.arange(len(y)), y] -= 1
    p /= len(y)
    gw2, gb2 = h.T @ p, p.sum(0)
    gh = (p @ w2.T) * (h > 0)
    return loss, [x.T @ gh, gh.sum(0), gw2, gb2]


def train(compress):
    ws = [w.copy() for w in w0]
    gbuf = np.zeros(sum(sizes), np.float32)     # one flat buffer: a stable EF key
    avg = np.zeros_like(gbuf)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        loss, grads = loss_grad(ws, x, y)
        gbuf[:] = np.concatenate([g.ravel() for g in grads])
        world.Allreduce(gbuf, avg, compress=compress)
        avg /= n
        off = 0
        for w, s, sh in zip(ws, sizes, shapes):
            w -= LR * avg[off:off + s].reshape(sh)
            off += s
        losses.append(world.allreduce(loss) / n)
    return losses


exact = train("off")
cz.reset_stats()
lossy = train("int8")
st = cz.stats()
check(st["calls"] == STEPS, f"int8 calls {st['calls']}")
check(st["bytes_in"] >= 3.5 * st["bytes_out"], f"int8 bytes {st}")
e_end, l_end = np.mean(exact[-10:]), np.mean(lossy[-10:])
check(e_end < 0.8 * exact[0], f"exact run did not learn: {exact[0]:.3f} -> {e_end:.3f}")
check(l_end <= e_end * 1.10 + 0.02, f"int8 run: {l_end:.4f} vs exact {e_end:.4f}")
if r == 0:
    print(f"loss start {exact[0]:.4f}; final exact {e_end:.4f}, int8+EF {l_end:.4f}",
          flush=True)
done("compress_train")
