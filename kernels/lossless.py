"""Codec ``lossless`` (id 1): per-block choice among compression modes.

The input's bytes are cut into blocks of ``block_bytes`` (default 8192, a
multiple of the itemsize and of 8; the last block may be shorter).  For each
block the driver asks every available mode for a cheap size estimate, runs
the most promising mode's encoder (then the next, if the first cannot beat
raw) and stores the block raw (mode 0) when no mode beats it.  The block
table records each block's encoded size and mode (see
:mod:`erdmampi.kernels.format`); decoding dispatches per block on the mode.

Modes (ids are part of the wire format, never reused):

==== ======= ================================================= =========================
id   name    what                                              module
==== ======= ================================================= =========================
0    RAW     the block's bytes verbatim                        this module
1    EXP     float exponent entropy coding                     ``kernels/_mode_exp.py``
2    DELTA   integer delta/XOR + bit-plane transpose + zeros   ``kernels/_mode_delta.py``
3    ZERO    zero-byte/word elimination, run-length positions  ``kernels/_mode_zero.py``
==== ======= ================================================= =========================

Mode modules are imported lazily; a missing one is simply not used when
encoding (decoding an encoding that uses it raises :class:`CodecError`).

How the bytes are presented to the modes (the same on both sides, so part
of the format): ``itemsize`` is the dtype's itemsize when it is 1, 2, 4 or
8; a complex dtype is handed over as its float components (``c8`` as 4-byte
floats, ``c16`` as 8-byte floats); other sizes (``V3``, ``V12``...) as the
largest of 8, 4, 2, 1 dividing the itemsize.  ``isfloat`` is True for float
kinds (``f2 f4 f8`` and complex components).

**CPU.**  One ``@njit(nogil=True)`` driver encodes all blocks, writes the
table and the payload and folds the payload checksum in as it goes.
Numba cannot call functions from a list, so the driver's source is
generated for the set of available modes (a chain of ``if k == ...`` calls)
and written to a cache directory under a name that hashes the mode modules'
sources: Numba's on-disk cache then stays valid exactly as long as the code
it was compiled from.

**CUDA.**  :meth:`Lossless.encode_cuda` runs every mode's
``encode_blocks_cuda`` over all blocks into its own scratch region, a kernel
picks each block's smallest encoding (raw when none beats it), an exclusive
prefix sum of the sizes gives the offsets, a compaction kernel writes table
and payload, the checksum is reduced on the device, and only the encoding
is copied to the host.  :meth:`Lossless.decode_cuda` parses header and table
on the host, uploads the payload, groups blocks by mode and calls each
mode's ``decode_blocks_cuda`` (raw blocks are copied by a kernel here).
Both produce and accept the same bytes as the CPU path.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
import threading
import warnings
from math import gcd
from pathlib import Path
from typing import Optional

import numpy as np

from erdmampi.kernels import format as fmt
from erdmampi.kernels.codec import Codec, as_out, as_src
from erdmampi.kernels.format import HEADER_SIZE, CodecError
from erdmampi.kernels.raw import (_device_out, _host_out, _parse_any, _rw,
                                  byte_dtype, device_bytes, host_bytes,
                                  is_device)

__all__ = ["Lossless", "MODE_MODULES", "available_modes", "mode_params"]

#: mode id -> module implementing it (see the module docstring)
MODE_MODULES = {
    1: "erdmampi.kernels._mode_exp",
    2: "erdmampi.kernels._mode_delta",
    3: "erdmampi.kernels._mode_zero",
}
MODE_NAMES = {0: "raw", 1: "exp", 2: "delta", 3: "zero"}

DEFAULT_BLOCK_BYTES = 8192
#: largest block the decoder accepts (the encoder's block_bytes limit too)
MAX_BLOCK_BYTES = 1 << 20

_REQUIRED = ("MODE_ID", "max_block_bytes", "encode_block", "decode_block",
             "estimate_block")
_CUDA_REQUIRED = ("encode_blocks_cuda", "decode_blocks_cuda")


def mode_params(dtype) -> tuple[int, bool]:
    """(itemsize, isfloat) as the modes see a dtype's bytes."""
    dt = np.dtype(dtype)
    it = dt.itemsize
    if dt.kind == "c" and it // 2 in (4, 8):
        return it // 2, True
    if it in (1, 2, 4, 8):
        return it, dt.kind == "f"
    for k in (8, 4, 2, 1):
        if it % k == 0:
            return k, False
    return 1, False  # unreachable


def _block_bytes_for(block_bytes: int, itemsize: int) -> int:
    """``block_bytes`` rounded down to a multiple of lcm(itemsize, 8) (at
    least one such unit)."""
    unit = itemsize * 8 // gcd(itemsize, 8)
    return max(unit, block_bytes // unit * unit)


# -- mode discovery ---------------------------------------------------------

_modes_lock = threading.Lock()
_modes_cache: dict = {}


def available_modes(modules: Optional[dict] = None) -> dict:
    """{mode id: module} of the mode modules that import.  A module that is
    absent (ImportError) or lacks a CPU function of the contract is skipped
    with a RuntimeWarning (none when the file is simply not there); other
    errors while importing it propagate, as does a wrong ``MODE_ID``."""
    modules = MODE_MODULES if modules is None else modules
    key = tuple(sorted(modules.items()))
    with _modes_lock:
        got = _modes_cache.get(key)
        if got is not None:
            return got
        got = {}
        for mid, name in sorted(modules.items()):
            try:
                mod = importlib.import_module(name)
            except ImportError as e:
                if not (isinstance(e, ModuleNotFoundError) and e.name == name):
                    warnings.warn(f"lossless: mode {mid} ({name}) unavailable: {e}",
                                  RuntimeWarning, stacklevel=2)
                continue
            missing = [a for a in _REQUIRED if not hasattr(mod, a)]
            if missing:
                # an unfinished mode module: visible, but not fatal
                warnings.warn(f"lossless: mode module {name} lacks "
                              f"{', '.join(missing)}; not used",
                              RuntimeWarning, stacklevel=2)
                continue
            if mod.MODE_ID != mid:
                raise RuntimeError(f"mode module {name} has MODE_ID {mod.MODE_ID}, "
                                   f"expected {mid}")
            got[mid] = mod
        _modes_cache[key] = got
        return got


# -- the generated CPU driver ---------------------------------------------

_DRIVER = '''\
# Generated by erdmampi.kernels.lossless for modes {ids}; do not edit.
import numpy as np
from numba import njit
from erdmampi.kernels._checksum import sums, fold
{imports}

NMODES = {nmodes}
CK_CHUNK = 1 << 16


@njit(cache=True, nogil=True, inline="always")
def _copy(d, s):
    # an element loop over two views vectorises (slice assignment checks
    # for overlap and runs ~10x slower)
    for j in range(s.size):
        d[j] = s[j]


@njit(cache=True, nogil=True)
def _estimate(blk, itemsize, isfloat, est):
{estimates}
    return 0


@njit(cache=True, nogil=True)
def _encode(k, blk, itemsize, isfloat, dst):
    """Encode with the k-th available mode: (bytes or -1, mode id)."""
    r = -1
    mode = 0
{tries}
    return r, mode


@njit(cache=True, nogil=True)
def encode_blocks(src, itemsize, isfloat, block_bytes, out, tab_off, pay_off,
                  reeval):
    """Encode all blocks of src (uint8) into out: table at tab_off, payload
    at pay_off.  Returns (payload bytes, payload checksum).

    Every mode is estimated on a block, and the best estimates tried in
    turn, except that after a block won by mode m the next ``reeval - 1``
    blocks go straight to m's encoder as long as its size stays within
    1/8 of the previous block's (data in a buffer is mostly homogeneous;
    any change of character triggers a full estimate again)."""
    n = src.size
    nb = (n + block_bytes - 1) // block_bytes
    pos = pay_off
    ck = pay_off
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    est = np.empty(max(NMODES, 1), np.int64)
    cur = -1
    since = 0
    last = 0
    for b in range(nb):
        lo = b * block_bytes
        hi = min(lo + block_bytes, n)
        blen = hi - lo
        blk = src[lo:hi]
        dst = out[pos:pos + blen]
        size = -1
        mode = 0
        if cur >= 0 and since + 1 < reeval:
            r, m = _encode(cur, blk, itemsize, isfloat, dst)
            if r >= 0 and r < blen and r <= last + (last >> 3) + 8:
                size = r
                mode = m
                since += 1
                last = r
        if size < 0:
            _estimate(blk, itemsize, isfloat, est)
            cur = -1
            for _t in range(NMODES):
                k = -1
                kb = blen
                for j in range(NMODES):
                    if est[j] >= 0 and est[j] < kb:
                        k = j
                        kb = est[j]
                if k < 0:
                    break
                est[k] = -1
                r, m = _encode(k, blk, itemsize, isfloat, dst)
                if r >= 0 and r < blen:
                    size = r
                    mode = m
                    cur = k
                    break
            since = 0
            last = size
        if size < 0:
            _copy(dst, blk)
            size = blen
            mode = 0
        w = np.uint32(size) | (np.uint32(mode) << np.uint32(28))
        t = tab_off + 4 * b
        out[t] = np.uint8(w & np.uint32(0xFF))
        out[t + 1] = np.uint8((w >> np.uint32(8)) & np.uint32(0xFF))
        out[t + 2] = np.uint8((w >> np.uint32(16)) & np.uint32(0xFF))
        out[t + 3] = np.uint8(w >> np.uint32(24))
        pos += size
        if pos - ck >= CK_CHUNK:
            e = ck + ((pos - ck) & ~3)
            a, c = sums(out[ck:e], (ck - pay_off) >> 2)
            s1 += a
            s2 += c
            ck = e
    a, c = sums(out[ck:pos], (ck - pay_off) >> 2)
    s1 += a
    s2 += c
    return pos - pay_off, fold(s1, s2)


@njit(cache=True, nogil=True)
def decode_blocks(payload, table, itemsize, isfloat, block_bytes, dst):
    """Decode every block into dst (uint8).  Returns 0, or -(b + 1) for the
    first block b that is corrupt or uses a mode not available here."""
    n = dst.size
    nb = table.size
    pos = 0
    for b in range(nb):
        lo = b * block_bytes
        hi = min(lo + block_bytes, n)
        blen = hi - lo
        w = table[b]
        size = np.int64(w & np.uint32(0x0FFFFFFF))
        mode = np.int64(w >> np.uint32(28))
        if blen <= 0 or pos + size > payload.size:
            return -(b + 1)
        enc = payload[pos:pos + size]
        out = dst[lo:hi]
        if mode == 0:
            if size != blen:
                return -(b + 1)
            _copy(out, enc)
        else:
            if size >= blen:
                return -(b + 1)
            r = -1
{decodes}
            if r < 0:
                return -(b + 1)
        pos += size
    if pos != payload.size:
        return -(nb + 1)
    return 0
'''


def _driver_source(modes: dict) -> str:
    ids = sorted(modes)
    imports = []
    est, tries, decs = [], [], []
    for k, mid in enumerate(ids):
        name = modes[mid].__name__
        imports.append(f"from {name} import (estimate_block as est_{mid}, "
                       f"encode_block as enc_{mid}, decode_block as dec_{mid})")
        est.append(f"    est[{k}] = est_{mid}(blk, itemsize, isfloat)")
        kw = "if" if k == 0 else "elif"
        tries.append(f"    {kw} k == {k}:\n"
                     f"        r = enc_{mid}(blk, itemsize, isfloat, dst)\n"
                     f"        mode = {mid}")
        decs.append(f"            {kw} mode == {mid}:\n"
                    f"                r = dec_{mid}(enc, itemsize, isfloat, out)")
    return _DRIVER.format(
        ids=ids, nmodes=len(ids), imports="\n".join(imports),
        estimates="\n".join(est) or "    pass",
        tries="\n".join(tries) or "    pass",
        decodes="\n".join(decs) or "            pass")


def _cache_dir() -> Path:
    for cand in (os.environ.get("ERDMAMPI_CACHE_DIR"),
                 os.path.join(os.path.expanduser("~"), ".cache", "erdmampi"),
                 os.path.join(tempfile.gettempdir(), f"erdmampi-{os.getuid()}")):
        if not cand:
            continue
        p = Path(cand)
        try:
            p.mkdir(parents=True, exist_ok=True)
            if os.access(p, os.W_OK):
                return p
        except OSError:
            continue
    raise RuntimeError("no writable cache directory for the lossless driver "
                       "(set ERDMAMPI_CACHE_DIR)")


_drivers: dict = {}
_drivers_lock = threading.Lock()


def _driver(modes: dict):
    """The compiled driver module for this set of mode modules."""
    key = tuple(sorted((mid, m.__name__) for mid, m in modes.items()))
    with _drivers_lock:
        d = _drivers.get(key)
        if d is not None:
            return d
        src = _driver_source(modes)
        h = hashlib.sha256(src.encode())
        import numba
        h.update(numba.__version__.encode())
        deps = [importlib.import_module("erdmampi.kernels._checksum")] + \
            [modes[m] for m in sorted(modes)]
        for m in deps:
            f = getattr(m, "__file__", None)
            if f and os.path.exists(f):
                h.update(Path(f).read_bytes())
        tag = h.hexdigest()[:20]
        path = _cache_dir() / f"_lossless_driver_{tag}.py"
        if not path.exists() or path.read_text() != src:
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(src)
            os.replace(tmp, path)
        modname = f"erdmampi_lossless_driver_{tag}"
        spec = importlib.util.spec_from_file_location(modname, path)
        d = importlib.util.module_from_spec(spec)
        sys.modules[modname] = d
        spec.loader.exec_module(d)
        _drivers[key] = d
        return d


# -- the codec --------------------------------------------------------------

class Lossless(Codec):
    """Per-block best-of-modes lossless compression (codec id 1).

    :param block_bytes: block size in bytes (rounded down to a multiple of
        lcm(itemsize, 8)); at most :data:`MAX_BLOCK_BYTES`.
    :param modes: restrict encoding to these mode ids (default: every
        available mode).  Decoding always accepts every available mode.
    :param reeval: on the CPU, estimate every mode at least every
        ``reeval`` blocks; in between, a block goes straight to the
        previous block's mode while its size stays within 1/8 of the
        previous one (1: estimate every block).  The GPU path always
        tries every mode.
    """

    name = "lossless"
    codec_id = 1
    lossless = True
    dtypes = None

    def __init__(self, block_bytes: int = DEFAULT_BLOCK_BYTES, modes=None,
                 reeval: int = 16, _modules: Optional[dict] = None):
        if not 8 <= block_bytes <= MAX_BLOCK_BYTES:
            raise ValueError(f"block_bytes must be in [8, {MAX_BLOCK_BYTES}], "
                             f"got {block_bytes}")
        self.block_bytes = int(block_bytes)
        if reeval < 1:
            raise ValueError(f"reeval must be >= 1, got {reeval}")
        self.reeval = int(reeval)
        self._want = None if modes is None else frozenset(int(m) for m in modes)
        self._modules = MODE_MODULES if _modules is None else dict(_modules)
        self._tls = threading.local()

    # -- modes -------------------------------------------------------------
    def modes(self, encoding: bool = True) -> dict:
        """{mode id: module} used for encoding (or, with encoding=False,
        accepted when decoding)."""
        got = available_modes(self._modules)
        if encoding and self._want is not None:
            got = {m: v for m, v in got.items() if m in self._want}
        return got

    def _geometry(self, count: int, dt: np.dtype):
        bb = _block_bytes_for(self.block_bytes, dt.itemsize)
        if bb > MAX_BLOCK_BYTES:
            raise TypeError(f"lossless: itemsize {dt.itemsize} too large for "
                            f"{MAX_BLOCK_BYTES}-byte blocks (use codec 'raw')")
        be = bb // dt.itemsize
        nb = 0 if count == 0 else -(-count // be)
        return bb, be, nb

    def max_encoded_size(self, count: int, dtype) -> int:
        dt = np.dtype(dtype)
        _, _, nb = self._geometry(count, dt)
        return HEADER_SIZE + 4 * nb + count * dt.itemsize

    # -- host --------------------------------------------------------------
    def encode(self, src, out: Optional[np.ndarray] = None, *, feedback=None):
        a, b = host_bytes(src)
        dt = a.dtype
        hdt = byte_dtype(dt)
        bb, be, nb = self._geometry(a.size, dt)
        it, isf = mode_params(dt)
        hs = HEADER_SIZE + 4 * nb
        o = as_out(out, hs + b.size)
        b = _rw(b)  # read-only input: same compiled driver (it only reads src)
        drv = _driver(self.modes())
        plen, psum = drv.encode_blocks(b, it, isf, bb, o, HEADER_SIZE, hs,
                                       self.reeval)
        plen = int(plen)
        table = o[HEADER_SIZE:hs].view("<u4")
        head = fmt.pack_header(self.codec_id, hdt, a.size, be, table, int(psum))
        o[:HEADER_SIZE] = np.frombuffer(head, np.uint8)
        return o[:hs + plen]

    def _check_header(self, hdr):
        bb = hdr.block_elems * hdr.dtype.itemsize
        if hdr.nblocks and (bb > MAX_BLOCK_BYTES or bb % 8):
            raise CodecError(f"lossless block of {bb} bytes is not a multiple "
                             f"of 8 up to {MAX_BLOCK_BYTES}")
        return bb

    def decode(self, enc, out: Optional[np.ndarray] = None):
        hdr, table, payload = fmt.parse(enc, codec_id=self.codec_id,
                                        verify_payload=False)
        bb = self._check_header(hdr)
        from erdmampi.kernels._checksum import checksum32
        payload = _rw(payload)
        if int(checksum32(payload)) != hdr.payload_sum:
            raise CodecError("payload checksum mismatch (corrupt data)")
        o = _host_out(hdr, out)
        if hdr.count == 0:
            return o
        it, isf = mode_params(hdr.dtype)
        modes = self.modes(encoding=False)
        drv = _driver(modes)
        r = int(drv.decode_blocks(payload, np.array(table), it, isf,
                                  bb, o.view(np.uint8)))
        if r < 0:
            b = -r - 1
            if b >= hdr.nblocks:
                raise CodecError("block sizes do not cover the payload")
            m = int(table[b]) >> fmt.MODE_SHIFT
            if m and m not in modes:
                raise CodecError(f"block {b} uses mode {m} "
                                 f"({MODE_NAMES.get(m, 'reserved')}), not "
                                 f"available here")
            raise CodecError(f"block {b} (mode {m}, "
                             f"{int(table[b]) & fmt.SIZE_MASK} bytes) is corrupt")
        return o

    # -- device ------------------------------------------------------------
    def _dbuf(self, name, nbytes, dtype=np.uint8):
        """A per-thread device scratch buffer of at least nbytes (grown
        on demand, reused between calls)."""
        from numba import cuda
        pool = getattr(self._tls, "pool", None)
        if pool is None:
            pool = self._tls.pool = {}
        n = max(1, -(-nbytes // np.dtype(dtype).itemsize))
        buf = pool.get(name)
        if buf is None or buf.size < n:
            buf = cuda.device_array(max(n, 64), dtype=dtype)
            pool[name] = buf
        return buf[:n]

    def encode_cuda(self, src, out=None, *, stream=0, feedback=None):
        """Encode a device array on the GPU (``stream`` for every launch and
        copy).  The result lives where ``out`` lives: with ``out=None`` or a
        host array, a host uint8 view holding the encoding (only these bytes
        cross from the device); with a device ``out``, a device uint8 view.
        Byte-identical to :meth:`encode` when every mode's CPU and CUDA
        encoders agree (they must at least decode each other's output)."""
        from erdmampi.kernels import _lossless_cuda as K
        from erdmampi.kernels._checksum import checksum32_cuda
        d, db = device_bytes(src)
        dt = np.dtype(d.dtype)
        hdt = byte_dtype(dt)
        n = db.size
        bb, be, nb = self._geometry(d.size, dt)
        it, isf = mode_params(dt)
        hs = HEADER_SIZE + 4 * nb
        total_max = hs + n
        dev_out = out is not None and is_device(out)
        if dev_out:
            o = device_bytes(out)[1]
            if o.size < total_max:
                raise ValueError(f"output buffer too small: {o.size} < {total_max} bytes")
        else:
            ho = as_out(out, total_max)
            o = self._dbuf("enc", total_max)
        if nb == 0:
            plen, psum, table = 0, 0, np.zeros(0, "<u4")
        else:
            last = n - (nb - 1) * bb
            cmodes = {m: v for m, v in self.modes().items()
                      if all(hasattr(v, a) for a in _CUDA_REQUIRED)}
            ids = sorted(cmodes)
            slot = bb
            for m in ids:
                slot = max(slot, int(cmodes[m].max_block_bytes(bb, it)))
            slot = -(-slot // 8) * 8
            nm = len(ids)
            sizes = self._dbuf("sizes", 4 * max(nm, 1) * nb, np.int32)
            scratch = self._dbuf("scratch", max(nm, 1) * nb * slot) if nm else \
                self._dbuf("scratch", 8)
            for k, m in enumerate(ids):
                try:
                    cmodes[m].encode_blocks_cuda(
                        db, nb, bb, last, it, isf,
                        scratch[k * nb * slot:(k + 1) * nb * slot], slot,
                        sizes[k * nb:(k + 1) * nb], stream)
                except NotImplementedError:
                    # a mode without a CUDA encoder yet: never chosen
                    K.fill_i32(sizes[k * nb:(k + 1) * nb], -1, stream)
            mode_ids = np.array(ids + [0], np.int32)[:max(nm, 1)]
            sel = self._dbuf("sel", 4 * nb, np.int32)
            ssz = self._dbuf("ssz", 8 * (nb + 1), np.int64)
            K.select(sizes, nm, nb, bb, last, sel, ssz, stream)
            K.exclusive_scan(ssz, nb, stream)
            K.compact(db, scratch, slot, sel, ssz, mode_ids, nb, bb, last,
                      o, HEADER_SIZE, hs, stream)
            # the table and total come to the host (4 bytes a block)
            front = o[HEADER_SIZE:hs].copy_to_host(stream=stream)
            tot = ssz[nb:nb + 1].copy_to_host(stream=stream)
            if stream:
                stream.synchronize()
            plen = int(tot[0])
            table = front.view("<u4")
            psum = checksum32_cuda(o[hs:hs + plen], stream) if plen else 0
        head = np.frombuffer(fmt.pack_header(self.codec_id, hdt, d.size, be,
                                             table, psum), np.uint8).copy()
        total = hs + plen
        if dev_out:
            o[:HEADER_SIZE].copy_to_device(head, stream=stream)
            if stream:
                stream.synchronize()
            return o[:total]
        ho[:HEADER_SIZE] = head
        ho[HEADER_SIZE:hs] = table.view(np.uint8)
        if plen:
            o[hs:total].copy_to_host(ho[hs:total], stream=stream)
        if stream:
            stream.synchronize()
        return ho[:total]

    def decode_cuda(self, enc, out=None, *, stream=0):
        """Decode onto the device (``enc`` on the host, as it arrives from
        the network, or on the device); returns the device array (``out``,
        or a new one of the header's dtype; raw-byte dtypes as uint8)."""
        from numba import cuda
        from erdmampi.kernels import _lossless_cuda as K
        from erdmampi.kernels._checksum import (checksum32_cuda_finish,
                                                checksum32_cuda_start)
        hdr, table, payload, dpay = _parse_any(enc, self.codec_id, stream)
        bb = self._check_header(hdr)
        o, ob = _device_out(hdr, out, stream)
        if hdr.count == 0:
            return o
        nb = hdr.nblocks
        n = hdr.count * hdr.dtype.itemsize
        last = n - (nb - 1) * bb
        it, isf = mode_params(hdr.dtype)
        sizes = (table & np.uint32(fmt.SIZE_MASK)).astype(np.int64)
        mids = (table >> np.uint32(fmt.MODE_SHIFT)).astype(np.int64)
        blen = np.full(nb, bb, np.int64)
        blen[-1] = last
        if np.any((mids == 0) & (sizes != blen)) or np.any((mids != 0) & (sizes >= blen)):
            b = int(np.nonzero(((mids == 0) & (sizes != blen))
                               | ((mids != 0) & (sizes >= blen)))[0][0])
            raise CodecError(f"block {b} (mode {int(mids[b])}) has an impossible "
                             f"size {int(sizes[b])}")
        offs = np.zeros(nb, np.int64)
        np.cumsum(sizes[:-1], out=offs[1:])
        modes = self.modes(encoding=False)
        present = sorted(set(np.unique(mids).tolist()))
        for m in present:
            if m and m not in modes:
                b = int(np.nonzero(mids == m)[0][0])
                raise CodecError(f"block {b} uses mode {m} "
                                 f"({MODE_NAMES.get(m, 'reserved')}), not "
                                 f"available here")
        if any(m and not all(hasattr(modes[m], a) for a in _CUDA_REQUIRED)
               for m in present):
            return self._decode_via_host(enc, payload, dpay, o, ob, stream)
        if dpay is None:
            dpay = self._dbuf("dpay", payload.size)
            dpay.copy_to_device(payload, stream=stream)
        acc = checksum32_cuda_start(dpay, stream)
        err = cuda.to_device(np.zeros(1, np.int32), stream=stream)
        for m in present:
            sel = np.nonzero(mids == m)[0]
            ids_d = cuda.to_device(sel.astype(np.int32), stream=stream)
            off_d = cuda.to_device(offs[sel], stream=stream)
            len_d = cuda.to_device(sizes[sel], stream=stream)
            if m == 0:
                K.copy_raw(dpay, off_d, len_d, ids_d, sel.size, bb, ob, stream)
            else:
                try:
                    modes[m].decode_blocks_cuda(dpay, off_d, len_d, ids_d,
                                                sel.size, bb, last, nb, it, isf,
                                                ob, err, stream)
                except NotImplementedError:
                    return self._decode_via_host(enc, payload, dpay, o, ob, stream)
        e = err.copy_to_host(stream=stream)
        if checksum32_cuda_finish(acc, stream) != hdr.payload_sum:
            raise CodecError("payload checksum mismatch (corrupt data)")
        if stream:
            stream.synchronize()
        if e[0]:
            raise CodecError("a block failed to decode on the device (corrupt data)")
        return o

    def _decode_via_host(self, enc, payload, dpay, o, ob, stream):
        """Decode on the CPU and upload: for encodings using a mode that has
        no CUDA decoder (yet)."""
        if is_device(enc):
            _, eb = device_bytes(enc)
            enc = eb.copy_to_host(stream=stream)
            if stream:
                stream.synchronize()
        h = self.decode(enc)
        ob.copy_to_device(h.view(np.uint8), stream=stream)
        if stream:
            stream.synchronize()
        return o
