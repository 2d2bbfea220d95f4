"""The three kinds of data the codec benchmark (and codec tests) generate.

Deterministic for a seed, numpy only, generated here rather than downloaded:

* :func:`gradients` - float32 gradients of a small MLP trained with SGD in
  numpy on a synthetic classification task (all layers' grads concatenated,
  taken after a few steps so they look like mid-training gradients);
* :func:`smooth_field` - a smooth float32 3-D field (superposed low-frequency
  waves and Gaussian bumps with a little noise, like a simulation snapshot);
* :func:`sparse_int64` - int64 data with 95% zeros and small positive
  counts elsewhere (like histograms or embedding-index counts).
"""

from __future__ import annotations

import numpy as np

__all__ = ["gradients", "smooth_field", "sparse_int64", "KINDS", "make"]


def gradients(nbytes: int = 16 << 20, seed: int = 0) -> np.ndarray:
    """float32 gradients of a 2-layer MLP, about ``nbytes`` in total."""
    rng = np.random.default_rng(seed)
    n_in, n_out, batch = 256, 10, 128
    # hidden size chosen so that one gradient set has ~nbytes/8 bytes; we
    # concatenate grads from 8 successive steps.
    per_step = max(1, nbytes // 4 // 8)
    hidden = max(8, per_step // (n_in + n_out + 2))
    w1 = rng.standard_normal((n_in, hidden)).astype(np.float32) * np.float32(1 / np.sqrt(n_in))
    b1 = np.zeros(hidden, np.float32)
    w2 = rng.standard_normal((hidden, n_out)).astype(np.float32) * np.float32(1 / np.sqrt(hidden))
    b2 = np.zeros(n_out, np.float32)
    centers = rng.standard_normal((n_out, n_in)).astype(np.float32)
    out = []
    total = nbytes // 4
    got = 0
    step = 0
    while got < total:
        y = rng.integers(0, n_out, batch)
        x = centers[y] + rng.standard_normal((batch, n_in)).astype(np.float32)
        h = np.maximum(x @ w1 + b1, 0)
        logits = h @ w2 + b2
        logits -= logits.max(1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(1, keepdims=True)
        p[np.arange(batch), y] -= 1
        p /= batch
        gw2 = h.T @ p
        gb2 = p.sum(0)
        gh = (p @ w2.T) * (h > 0)
        gw1 = x.T @ gh
        gb1 = gh.sum(0)
        lr = np.float32(0.1)
        w1 -= lr * gw1; b1 -= lr * gb1; w2 -= lr * gw2; b2 -= lr * gb2
        step += 1
        if step > 2:
            g = np.concatenate([gw1.ravel(), gb1, gw2.ravel(), gb2]).astype(np.float32)
            out.append(g)
            got += g.size
    return np.concatenate(out)[:total]


def smooth_field(nbytes: int = 16 << 20, seed: int = 0) -> np.ndarray:
    """A smooth float32 3-D field flattened to 1-D, about ``nbytes``."""
    rng = np.random.default_rng(seed)
    n = max(4, round((nbytes // 4) ** (1 / 3)))
    ax = np.linspace(0, 1, n, dtype=np.float32)
    x, y, z = np.meshgrid(ax, ax, ax, indexing="ij", sparse=True)
    f = np.zeros((n, n, n), np.float32)
    for _ in range(4):
        kx, ky, kz = rng.uniform(0.5, 3, 3).astype(np.float32)
        ph = np.float32(rng.uniform(0, 6.28))
        f += np.sin(np.float32(6.28) * (kx * x + ky * y + kz * z) + ph)
    for _ in range(3):
        c = rng.uniform(0.2, 0.8, 3).astype(np.float32)
        w = np.float32(rng.uniform(0.05, 0.2))
        f += np.float32(2) * np.exp(-((x - c[0]) ** 2 + (y - c[1]) ** 2 + (z - c[2]) ** 2) / (2 * w * w))
    f += np.float32(1e-4) * rng.standard_normal(f.shape).astype(np.float32)
    f = (f * np.float32(300) + np.float32(1000)).astype(np.float32)  # e.g. a temperature in K
    flat = f.ravel()
    total = nbytes // 4
    if flat.size < total:
        flat = np.resize(flat, total)
    return flat[:total]


def sparse_int64(nbytes: int = 16 << 20, seed: int = 0, density: float = 0.05) -> np.ndarray:
    """int64 counts: ``density`` of the entries nonzero (geometric 1..~1000)."""
    rng = np.random.default_rng(seed)
    total = nbytes // 8
    a = np.zeros(total, np.int64)
    idx = rng.random(total) < density
    a[idx] = rng.geometric(0.01, int(idx.sum())).astype(np.int64)
    return a


KINDS = {"gradients": gradients, "smooth": smooth_field, "sparse": sparse_int64}


def make(kind: str, nbytes: int = 16 << 20, seed: int = 0) -> np.ndarray:
    """Data of ``kind`` (one of :data:`KINDS`)."""
    try:
        return KINDS[kind](nbytes, seed)
    except KeyError:
        raise ValueError(f"unknown data kind {kind!r}; one of {sorted(KINDS)}") from None
