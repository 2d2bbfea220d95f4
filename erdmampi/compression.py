"""Compression of collective traffic: configuration, adaptive policy, coders.

How a call decides (see ``docs/compression.md``):

1. the mode: the ``compress=`` keyword of the call, else the communicator's
   Info hint ``erdma_compress``, else the process default
   (``ERDMA_COMPRESS``, else ``erdmampi.rc.compress``, else ``"auto"``);
2. whether the compressed algorithm runs at all (:func:`plan`).  That choice
   uses only values every rank knows (the mode, the collective, dtype, count,
   op, and the host of every rank), so all ranks pick the same algorithm;
3. under ``auto``, each *sender* decides per call whether its messages are
   worth compressing (:class:`Policy`: measured codec throughput, observed
   ratio, link bandwidth).  Every message is a self-describing container
   (:mod:`erdmampi.kernels.format`), either the lossless codec's or the raw
   codec's, so a receiver decodes whatever arrives and ranks need not agree.

Lossy codecs (bf16, int8, int4) run only when asked for explicitly, on
float32/float64 data, for Allreduce with ``SUM`` or the data-moving
collectives.  Allreduce keeps one error-feedback residual per communicator
and key (:func:`reset_feedback`).

This module is imported by :mod:`erdmampi.comm`; it imports the codec
registry (Numba loads only when a codec is first used) and never the engine.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

import numpy as np

__all__ = ["MODES", "LOSSY", "COLLECTIVES", "INFO_KEY", "Spec", "parse_mode",
           "configure", "set_default", "default_mode", "stats", "reset_stats",
           "reset_feedback", "link_bandwidth", "codec_throughput", "plan", "Coder"]

#: accepted values of ERDMA_COMPRESS / rc.compress / the Info key / compress=
MODES = ("off", "auto", "lossless", "bf16", "int8", "int4")
#: lossy modes (opt-in only)
LOSSY = ("bf16", "int8", "int4")
#: collectives with a compressed algorithm
COLLECTIVES = ("allreduce", "bcast", "scatter", "gather", "allgather", "alltoall")
#: Info key for a per-communicator mode
INFO_KEY = "erdma_compress"

_LOSSY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_ALIASES = {"none": "off", "0": "off", "false": "off", "no": "off",
            "1": "lossless", "on": "lossless", "true": "lossless", "yes": "lossless"}

KiB = 1024


def _env_int(name: str, default: int) -> int:
    from . import config
    return config.get(name, default=default)


#: input bytes per chunk: compressing chunk k+1 overlaps sending chunk k
CHUNK_BYTES = max(64, _env_int("ERDMA_COMPRESS_CHUNK", 1024 * KiB))
#: under ``auto``, vectors smaller than this are never compressed
AUTO_MIN_BYTES = _env_int("ERDMA_COMPRESS_MIN", 64 * KiB)


class Spec:
    """A ``compress=`` value with an error-feedback key:
    ``comm.Allreduce(g, out, compress=Spec("int8", key="layer3"))``."""

    __slots__ = ("mode", "key")

    def __init__(self, mode: str, key: Any = None):
        self.mode = parse_mode(mode)
        self.key = key

    def __repr__(self):
        return f"Spec({self.mode!r}, key={self.key!r})"


def parse_mode(value, what: str = "compression mode") -> Optional[str]:
    """Normalise a mode; ``None``/``""`` -> None; unknown -> ``ValueError``."""
    if value is None:
        return None
    if isinstance(value, Spec):
        return value.mode
    if isinstance(value, bool):
        return "lossless" if value else "off"
    s = str(value).strip().lower()
    if not s:
        return None
    s = _ALIASES.get(s, s)
    if s not in MODES:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(MODES)}")
    return s


# -- process default ------------------------------------------------------

class _Config:
    mode = "auto"
    source = "default"


_config = _Config()


def configure(rc=None) -> str:
    """Set the process default from ``ERDMA_COMPRESS`` (wins) or
    ``rc.compress``; called when MPI is initialised.  Returns the mode."""
    from . import config
    env = config.get("ERDMA_COMPRESS", default="")
    if env:
        _config.mode, _config.source = parse_mode(env, "ERDMA_COMPRESS value"), "env"
    elif rc is not None and getattr(rc, "compress", None) is not None:
        _config.mode, _config.source = parse_mode(rc.compress, "rc.compress value"), "rc"
    else:
        _config.mode, _config.source = "auto", "default"
    return _config.mode


def set_default(mode) -> None:
    """Change the process default at run time (every rank must agree)."""
    _config.mode, _config.source = parse_mode(mode) or "auto", "set_default"


def default_mode() -> str:
    return _config.mode


# -- statistics -----------------------------------------------------------

_stats_lock = threading.Lock()


def _zero_stats():
    return {"calls": 0,            # calls that ran a compressed algorithm
            "plain_calls": 0,      # calls where plan() chose the normal algorithm
            "messages": 0,         # messages sent by compressed algorithms
            "compressed_messages": 0,  # of which carried a (non-raw) codec
            "bytes_in": 0,         # uncompressed bytes those messages carry
            "bytes_out": 0,        # bytes actually sent
            "device_calls": 0,     # calls that encoded/decoded on the GPU
            "by_collective": {}}


_stats = _zero_stats()


def _count(key, n=1, coll=None):
    with _stats_lock:
        _stats[key] += n
        if coll is not None:
            d = _stats["by_collective"].setdefault(coll, {"calls": 0, "plain_calls": 0,
                                                          "bytes_in": 0, "bytes_out": 0})
            if key in d:
                d[key] += n


def stats() -> dict:
    """Counters of this process (a copy): see :func:`_zero_stats` keys."""
    with _stats_lock:
        s = dict(_stats)
        s["by_collective"] = {k: dict(v) for k, v in _stats["by_collective"].items()}
    return s


def reset_stats() -> None:
    global _stats
    with _stats_lock:
        _stats = _zero_stats()


# -- per-communicator state (ratios, error feedback) ----------------------

class _CommState:
    """Per communicator: error-feedback residuals by key and the observed
    compression ratio per (collective, dtype)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.feedback: dict = {}
        self.ratio: dict = {}
        self.skipped: dict = {}


def _state(comm) -> _CommState:
    st = getattr(comm, "_cstate", None)
    if st is None:
        st = comm._cstate = _CommState()
    return st


def reset_feedback(comm, key=None) -> None:
    """Forget the error-feedback residuals of ``comm`` (all, or one key)."""
    st = _state(comm)
    with st.lock:
        if key is None:
            st.feedback.clear()
        else:
            for k in [k for k in st.feedback if k[0] == key]:
                del st.feedback[k]


def _feedback(st: _CommState, key):
    with st.lock:
        fb = st.feedback.get(key)
        if fb is None:
            from erdmampi.kernels import ErrorFeedback
            fb = st.feedback[key] = ErrorFeedback()
    return fb


# -- measurements for the policy -------------------------------------------

_DEFAULT_LINK_BW = 125e6        # 1 Gbit/s until measured
_link = {"bw": None, "n": 0}
_tput: dict = {}
_tput_lock = threading.Lock()


def _parse_bw(text: str) -> float:
    """Bits per second with an optional K/M/G/T suffix -> bytes per second."""
    t = text.strip().lower().removesuffix("bit/s").removesuffix("bps").removesuffix("b")
    mult = 1.0
    if t and t[-1] in "kmgt":
        mult = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[t[-1]]
        t = t[:-1]
    try:
        return float(t) * mult / 8
    except ValueError:
        raise ValueError(f"ERDMA_LINK_BW={text!r}: expected bits/s like 1e9 or 10G") from None


def link_bandwidth() -> float:
    """Bytes/s of a link to another host: ``ERDMA_LINK_BW`` (bits/s, e.g.
    ``10G``), else the estimate from recent compressed calls, else 1 Gbit/s."""
    from . import config
    env = config.get("ERDMA_LINK_BW")
    if env:
        return _parse_bw(env)
    return _link["bw"] or _DEFAULT_LINK_BW


def _observe_link(nbytes: int, seconds: float) -> None:
    """A lower bound of the bandwidth from one call's sent bytes and time."""
    if nbytes < 1 << 20 or seconds <= 0:
        return
    bw = nbytes / seconds
    old = _link["bw"]
    _link["bw"] = bw if old is None else 0.7 * old + 0.3 * max(bw, old * 0.5)
    _link["n"] += 1


def codec_throughput(name: str) -> tuple[float, float]:
    """(encode, decode) bytes/s of codec ``name`` on this CPU, measured once
    per process on 1 MiB of gradient-like float32 data (after a warm-up)."""
    with _tput_lock:
        got = _tput.get(name)
    if got is not None:
        return got
    from erdmampi import kernels
    c = kernels.get(name)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(1 << 18) * 1e-3).astype(np.float32)
    out = np.empty(c.max_encoded_size(x.size, x.dtype), np.uint8)
    back = np.empty_like(x)
    enc = c.encode(x, out)
    c.decode(enc, back)
    te = td = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        enc = c.encode(x, out)
        t1 = time.perf_counter()
        c.decode(enc, back)
        t2 = time.perf_counter()
        te, td = min(te, t1 - t0), min(td, t2 - t1)
    got = (x.nbytes / max(te, 1e-9), x.nbytes / max(td, 1e-9))
    with _tput_lock:
        _tput[name] = got
    return got


class Policy:
    """``auto``: does compressing pay for this sender's remote traffic?

    Pipelined, a compressed transfer takes about ``max(N/enc, N/(r*bw),
    N/dec)`` against ``N/bw`` raw; compress when that is at least 10%
    shorter.  ``r`` is the ratio observed on this communicator for this
    collective and dtype (optimistic until measured; after 8 calls decided
    "raw" the next one compresses again to refresh it)."""

    MARGIN = 1.1
    REPROBE = 8

    @staticmethod
    def decide(st: _CommState, coll: str, dtype: np.dtype) -> bool:
        key = (coll, dtype.str)
        with st.lock:
            ratio = st.ratio.get(key)
            if ratio is None:
                return True
            if st.skipped.get(key, 0) >= Policy.REPROBE:
                st.skipped[key] = 0
                return True
        enc, dec = codec_throughput("lossless")
        bw = link_bandwidth()
        t_comp = max(1 / enc, 1 / (ratio * bw), 1 / dec) * Policy.MARGIN
        pays = t_comp < 1 / bw
        if not pays:
            with st.lock:
                st.skipped[key] = st.skipped.get(key, 0) + 1
        return pays

    @staticmethod
    def record(st: _CommState, coll: str, dtype: np.dtype, nin: int, nout: int) -> None:
        if nin <= 0 or nout <= 0:
            return
        key = (coll, dtype.str)
        r = nin / nout
        with st.lock:
            old = st.ratio.get(key)
            st.ratio[key] = r if old is None else 0.5 * old + 0.5 * r


# -- device arrays -----------------------------------------------------------

def is_device(obj) -> bool:
    """A CUDA array (CAI) or a Numba simulator device array."""
    if obj is None or isinstance(obj, np.ndarray):
        return False
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    return type(obj).__module__.startswith("numba.cuda.simulator")


def device_view(obj):
    """A 1-D Numba device array over ``obj`` (CAI/torch/CuPy/Numba)."""
    if type(obj).__module__.startswith("numba.cuda.simulator"):
        arr = obj
    else:
        from numba import cuda
        arr = obj if cuda.is_cuda_array(obj) and hasattr(obj, "copy_to_host") \
            else cuda.as_cuda_array(obj)
    if not getattr(arr, "is_c_contiguous", lambda: True)():
        raise BufferError("compressed collectives need a C-contiguous device array")
    return arr.reshape(arr.size) if arr.ndim != 1 else arr


def device_dtype(obj) -> np.dtype:
    if hasattr(obj, "__cuda_array_interface__"):
        return np.dtype(obj.__cuda_array_interface__["typestr"])
    return np.dtype(obj.dtype)


# -- the coder an algorithm uses ------------------------------------------------

class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_SIM_LOCK = threading.Lock()


def _kernel_lock():
    """Numba's CUDA simulator runs one kernel at a time per process (ranks
    as threads in tests); a real GPU takes launches from any thread."""
    from numba import config
    return _SIM_LOCK if getattr(config, "ENABLE_CUDASIM", 0) else _NoLock()


class Coder:
    """Encodes and decodes the chunks of one compressed collective call
    (the object :mod:`erdmampi.collectives.compressed` algorithms use).

    ``encode`` returns host bytes (GPU data is encoded on the GPU and only
    the encoding is copied to the host); ``decode`` writes into a host or
    device view; ``decode_host``/``accumulate`` always work on the host.
    """

    def __init__(self, codec_name: str, dtype: np.dtype, coll: str, *, lossy: bool,
                 auto: bool, state: _CommState, hosts=None, rank: int = 0,
                 key=None, device: bool = False):
        from erdmampi import kernels
        self.kernels = kernels
        self.name = codec_name
        self.codec = kernels.get(codec_name)
        self.raw = kernels.get("raw") if auto else None
        self.dtype = np.dtype(dtype)
        self.coll = coll
        self.lossy = lossy
        self.auto = auto
        self.state = state
        self.hosts = hosts
        self.rank = rank
        self.key = key
        self.device = device
        self.chunk_elems = max(1, CHUNK_BYTES // max(self.dtype.itemsize, 1))
        self._compress_remote = Policy.decide(state, coll, self.dtype) if auto else True
        self._stream = None
        self.bytes_in = self.bytes_out = 0
        self.messages = self.compressed_messages = 0
        self.codec_in = self.codec_out = 0       # encodings with the codec (ratio)
        self.t0 = time.perf_counter()

    # -- sizes
    def max_size(self, count: int) -> int:
        n = self.codec.max_encoded_size(count, self.dtype)
        if self.raw is not None:
            n = max(n, self.raw.max_encoded_size(count, self.dtype))
        return n

    @staticmethod
    def enc_len(buf) -> int:
        from erdmampi.kernels.format import parse
        return parse(buf, verify_payload=False)[0].total_size

    def _use_codec(self, peers) -> bool:
        if not self.auto:
            return True
        if not self._compress_remote or self.hosts is None:
            return False
        me = self.hosts[self.rank]
        return any(self.hosts[p] != me for p in peers)

    def _cuda_stream(self):
        if self._stream is None:
            from numba import cuda
            self._stream = cuda.stream()
        return self._stream

    # -- encode
    def encode(self, src, peers=(), fb_key=None, lossless=False):
        """Encode ``src`` (a 1-D host or device view) into a new host uint8
        array; ``fb_key`` selects the error-feedback residual (lossy)."""
        n = src.size
        use = (not lossless) and self._use_codec(peers)
        codec = self.codec if use else (self.raw or self.kernels.get("lossless"))
        if lossless and self.lossy:
            codec = self.kernels.get("lossless")
        fb = None
        if use and self.lossy and fb_key is not None:
            fb = _feedback(self.state, fb_key)
        if self.device and not isinstance(src, np.ndarray):
            enc = self._encode_device(codec, src, fb)
        else:
            x = src
            out = np.empty(codec.max_encoded_size(n, x.dtype), np.uint8)
            enc = codec.encode(x, out, feedback=fb) if fb is not None else codec.encode(x, out)
        if not lossless:
            k = len(peers) or 1
            self.messages += k
            self.bytes_in += n * src.dtype.itemsize * k
            self.bytes_out += enc.size * k
            if codec is not self.raw:
                self.compressed_messages += k
                self.codec_in += n * src.dtype.itemsize
                self.codec_out += enc.size
        return enc

    def _encode_device(self, codec, src, fb):
        with _kernel_lock():
            return self._encode_device_locked(codec, src, fb)

    def _encode_device_locked(self, codec, src, fb):
        from numba import cuda
        s = self._cuda_stream()
        dout = cuda.device_array(codec.max_encoded_size(src.size, src.dtype),
                                 dtype=np.uint8, stream=s)
        if fb is not None:
            denc = codec.encode_cuda(src, dout, stream=s, feedback=fb)
        else:
            denc = codec.encode_cuda(src, dout, stream=s)
        host = np.empty(denc.size, np.uint8)
        denc.copy_to_host(host, stream=s)
        s.synchronize()
        return host

    # -- decode
    def decode(self, enc, out) -> None:
        """Decode ``enc`` into ``out`` (host or device view of the user's
        dtype; lossy float32 encodings are cast)."""
        if self.device and not isinstance(out, np.ndarray):
            h = self.kernels.header(enc)
            codec = self.kernels.by_id(h.codec_id)
            if h.dtype != out.dtype:
                raise TypeError(f"cannot decode {h.dtype} into a {out.dtype} device array")
            with _kernel_lock():
                s = self._cuda_stream()
                codec.decode_cuda(enc, out, stream=s)
                s.synchronize()
            return
        h = self.kernels.header(enc)
        if h.dtype == out.dtype:
            self.kernels.decode(enc, out)
        else:
            out[...] = self.kernels.decode(enc)

    def decode_host(self, enc) -> np.ndarray:
        return self.kernels.decode(enc)

    def accumulate(self, enc, acc: np.ndarray) -> None:
        """``acc += decode(enc)`` in float32 (lossy allreduce owners)."""
        fn = getattr(self.codec, "decode_accumulate", None)
        if fn is None:
            try:
                from erdmampi.kernels import lossy as _lossy
                fn = getattr(_lossy, "decode_accumulate", None)
            except ImportError:
                fn = None
        h = self.kernels.header(enc)
        if fn is not None and h.codec_id == self.codec.codec_id:
            fn(enc, acc)
        else:
            acc += self.kernels.decode(enc).astype(np.float32, copy=False)

    def to_host(self, src) -> np.ndarray:
        """Host values of ``src``: the view itself, or for a device view the
        decoding of its lossless encoding (only compressed bytes move)."""
        if isinstance(src, np.ndarray):
            return src
        return self.kernels.decode(self.encode(src, lossless=True))

    def copy(self, dst, src) -> None:
        """``dst[:] = src`` for host or device views of one kind."""
        if isinstance(dst, np.ndarray):
            dst[...] = src
        else:
            with _kernel_lock():
                dst.copy_to_device(src)

    def scratch_like(self, src):
        """A copy of ``src`` (host or device)."""
        if isinstance(src, np.ndarray):
            return src.copy()
        from numba import cuda
        with _kernel_lock():
            d = cuda.device_array(src.size, dtype=src.dtype)
            d.copy_to_device(src)
        return d

    # -- end of call
    def finish(self) -> None:
        _count("calls", 1, self.coll)
        if self.device:
            _count("device_calls")
        _count("messages", self.messages)
        _count("compressed_messages", self.compressed_messages)
        _count("bytes_in", self.bytes_in, self.coll)
        _count("bytes_out", self.bytes_out, self.coll)
        if self.auto and self.codec_out:
            Policy.record(self.state, self.coll, self.dtype, self.codec_in, self.codec_out)
        _observe_link(self.bytes_out, time.perf_counter() - self.t0)


# -- planning --------------------------------------------------------------------

def _raise(cls_name: str, msg: str):
    from erdmampi import exceptions as E
    E.raise_error(getattr(E, cls_name), msg)


def mode_of(comm, compress) -> tuple[Optional[str], bool, Any]:
    """(mode, explicit, key): per call > communicator Info > process default."""
    key = compress.key if isinstance(compress, Spec) else None
    m = parse_mode(compress, "compress= value")
    if m is not None:
        return m, True, key
    hint = getattr(comm, "_chints", None) or {}
    m = hint.get(INFO_KEY)
    if m is not None:
        return m, True, key
    return _config.mode, False, key


def plan(comm, coll: str, compress, dtype, nbytes: int, *, op=None,
         hosts=None, rank: int = 0, device: bool = False, addr: int = 0,
         multi_host: Optional[bool] = None) -> Optional[Coder]:
    """The :class:`Coder` of a compressed call, or None for the normal
    algorithm.  Uses only values all ranks share (see module docstring).

    Raises MPI errors for an *explicit* lossy mode on a dtype other than
    float32/float64 (``ERR_TYPE``) or an op other than SUM (``ERR_OP``); a
    lossy process default applies to Allreduce only and falls back to
    ``auto`` wherever it does not apply."""
    mode, explicit, key = mode_of(comm, compress)
    if mode == "off" or mode is None:
        _count("plain_calls", 1, coll)
        return None
    size = len(hosts) if hosts is not None else 0
    dt = np.dtype(dtype) if dtype is not None else np.dtype(np.uint8)
    if mode in LOSSY and not explicit and coll != "allreduce":
        mode = "auto"           # a lossy process default is for gradient Allreduce only
    if mode in LOSSY:
        bad = None
        if dt not in _LOSSY_DTYPES:
            bad = ("ERR_TYPE", f"lossy compression {mode!r} needs float32 or float64 "
                               f"data, not {dt}")
        elif coll == "allreduce" and (op is None or not op._predefined or op._name != "SUM"):
            name = getattr(op, "_name", None) or "a user-defined op"
            bad = ("ERR_OP", f"lossy compression {mode!r} supports Allreduce with "
                             f"MPI.SUM only, not {name}")
        if bad is not None:
            if explicit:
                _raise(*bad)
            mode = "auto"
    if size <= 1 or nbytes == 0:
        _count("plain_calls", 1, coll)
        return None
    auto = mode == "auto"
    if auto:
        many = multi_host if multi_host is not None else (
            hosts is not None and len(set(hosts)) > 1)
        if not many or nbytes < AUTO_MIN_BYTES:
            _count("plain_calls", 1, coll)
            return None
    lossy = mode in LOSSY
    codec = mode if lossy else "lossless"
    if key is None and lossy:
        key = ("addr", addr, nbytes, dt.str)
    return Coder(codec, dt, coll, lossy=lossy, auto=auto, state=_state(comm),
                 hosts=hosts, rank=rank, key=key, device=device)
