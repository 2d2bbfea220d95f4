"""DistributedDataParallel communication hooks that compress gradients for
the wide area, with the codecs of :mod:`erdmampi.kernels`.

>>> from erdmampi.torch import hooks
>>> model.register_comm_hook(hooks.CompressionState("int8"), hooks.compress_hook)

Modes:

* ``"lossless"``, ``"bf16"``: the bucket is summed by erdmampi's compressed
  allreduce (``Allreduce(..., compress=mode)``; bf16 halves float32 traffic
  and rounds each partial sum, lossless changes nothing);
* ``"int8"``, ``"int4"``: each rank quantizes its bucket once (blocks with a
  scale each) with error feedback: what quantization lost this step is added
  to the bucket of the next step, so no gradient signal is dropped for good.
  The encodings are all-gathered, one collective per bucket (each rank
  receives the others' compressed buckets, about 4x or 8x smaller than
  float32; between ranks on hosts of their own the all-gather is one phase
  of pieces posted at once, ``allgatherv`` ``sched_direct``), and every rank
  decodes and sums them in the same order, so all replicas stay identical.
  The buckets' all-gathers run on the group's lanes, so they overlap.

On a group of another backend (e.g. gloo) the lossless and bf16 hooks fall
back to torch's allreduce (bf16: cast, allreduce, cast back).
"""

from typing import Dict, Optional

import numpy as np
import torch
import torch.distributed as dist

from erdmampi import kernels
from erdmampi.torch.process_group import ProcessGroupErdma

__all__ = ["CompressionState", "compress_hook", "lossless_hook", "bf16_hook",
           "int8_hook", "int4_hook"]

_MODES = ("lossless", "bf16", "int8", "int4")
# all_gather_into_tensor's newer name (the old one warns in torch 2.13)
_ALLGATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class CompressionState:
    """State of :func:`compress_hook`: the mode, the process group (None: the
    default group) and, for int8/int4, one error-feedback residual per
    bucket."""

    def __init__(self, mode: str = "int8", process_group=None, error_feedback: bool = True):
        if mode not in _MODES:
            raise ValueError(f"compression mode {mode!r}: one of {', '.join(_MODES)}")
        self.mode = mode
        self.process_group = process_group
        self.error_feedback = error_feedback
        self.feedback: Dict[int, kernels.ErrorFeedback] = {}
        self.raw_bytes = 0          # float32 bytes of the buckets
        self.sent_bytes = 0         # bytes each rank contributed on the wire

    def group(self):
        return self.process_group if self.process_group is not None \
            else dist.distributed_c10d._get_default_group()


def _erdma_pg(group) -> Optional[ProcessGroupErdma]:
    return group if isinstance(group, ProcessGroupErdma) else None


def compress_hook(state: CompressionState,
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket's gradients over the group, compressed by
    ``state.mode``; returns the future DDP waits for."""
    group = state.group()
    size = group.size()
    buf = bucket.buffer()
    state.raw_bytes += buf.numel() * 4
    if state.mode in ("lossless", "bf16"):
        return _allreduce_mode(state, group, buf, size)
    return _quantized(state, group, bucket.index(), buf, size)


def _allreduce_mode(state, group, buf, size):
    pg = _erdma_pg(group)
    if pg is not None:
        state.sent_bytes += buf.numel() * (2 if state.mode == "bf16" else 4)
        work = pg._allreduce_compressed(buf, state.mode)

        def done(fut):
            return fut.value()[0].div_(size)
        return work.get_future().then(done)
    # another backend: torch's own path
    if state.mode == "bf16":
        low = buf.to(torch.bfloat16)
        fut = dist.all_reduce(low, group=group, async_op=True).get_future()

        def back(fut):
            buf.copy_(fut.value()[0].to(buf.dtype)).div_(size)
            return buf
        return fut.then(back)
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(size))


def _quantized(state, group, index, buf, size):
    codec = kernels.get(state.mode)
    src = buf.detach().to("cpu", torch.float32).contiguous()   # the codecs run on the host
    fb = None
    if state.error_feedback:
        fb = state.feedback.get(index)
        if fb is None:
            fb = state.feedback[index] = kernels.ErrorFeedback()
    enc = codec.encode(src.numpy(), feedback=fb)
    local = torch.from_numpy(np.array(enc, copy=True))
    state.sent_bytes += local.numel()
    gathered = torch.empty(size * local.numel(), dtype=torch.uint8, device="cpu")
    pg = _erdma_pg(group)
    if pg is not None:
        fut = pg.all_gather_single(gathered, local).get_future()
    else:
        fut = _ALLGATHER(gathered, local, group=group, async_op=True).get_future()
    n = local.numel()

    def done(_):
        total = np.zeros(src.numel(), dtype=np.float32)
        g = gathered.numpy()
        for i in range(size):           # same order on every rank: same sum
            total += kernels.decode(g[i * n:(i + 1) * n])
        total /= size
        with torch.no_grad():
            buf.copy_(torch.from_numpy(total).view(buf.shape))
        return buf
    return fut.then(done)


def _fixed(mode):
    def hook(state, bucket):
        if not isinstance(state, CompressionState) or state.mode != mode:
            raise TypeError(f"{mode}_hook needs a CompressionState({mode!r}) as its state")
        return compress_hook(state, bucket)
    hook.__name__ = f"{mode}_hook"
    hook.__doc__ = f"As :func:`compress_hook` with a ``CompressionState({mode!r})``."
    return hook


lossless_hook = _fixed("lossless")
bf16_hook = _fixed("bf16")
int8_hook = _fixed("int8")
int4_hook = _fixed("int4")
