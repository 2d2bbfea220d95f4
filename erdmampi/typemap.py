"""Type maps of datatypes, flattened to contiguous byte runs, and the
pack/unpack engine over them.

A :class:`Layout` describes one item of a datatype as runs ``(offset,
nbytes, kind)`` in type-map order (the order MPI packs in), where ``kind``
indexes :data:`KINDS`, the predefined datatype a run is made of.  Adjacent
runs of the same kind that touch in memory are merged, so a vector of
doubles is ``count`` runs and a contiguous type a single one.  The layout
of a derived datatype is built only when data is first moved with it.

Packing copies runs in C (ext/src/erdma_pack.c) along a :class:`_Plan`
cached per (count, extent) on the layout: a vector when the message's runs
are evenly spaced blocks of one length, else the item's runs repeated
``count`` times.  The NumPy gathers below remain for buffers C cannot take
(not contiguous, read-only destinations, out of bounds: NumPy raises).
"""

import numpy as np

try:
    from . import _engine as _eng
except ImportError:     # no engine built: NumPy only
    _eng = None

__all__ = ["KINDS", "register_kind", "Layout", "pack", "unpack", "pack_new", "unpack_array",
           "kind_runs"]

# predefined datatypes that runs are made of (index = kind)
KINDS = []


def register_kind(obj):
    KINDS.append(obj)
    return len(KINDS) - 1


_I8 = np.int64


def _merge(off, ln, kind):
    """Drop empty runs, then merge neighbours that touch (same kind unless
    ``kind`` is None)."""
    keep = ln > 0
    if not keep.all():
        off, ln = off[keep], ln[keep]
        kind = None if kind is None else kind[keep]
    if off.size <= 1:
        return off, ln, kind
    brk = off[:-1] + ln[:-1] != off[1:]
    if kind is not None:
        brk |= kind[:-1] != kind[1:]
    if not brk.any():
        return off[:1], np.array([ln.sum()], _I8), None if kind is None else kind[:1]
    starts = np.flatnonzero(np.concatenate(([True], brk)))
    if starts.size == off.size:
        return off, ln, kind
    return (off[starts], np.add.reduceat(ln, starts),
            None if kind is None else kind[starts])


class Layout:
    """Runs of one item; ``off``/``ln``/``kind`` are int64 arrays."""

    __slots__ = ("off", "ln", "kind", "_runs", "_plans")

    def __init__(self, off, ln, kind):
        self.off, self.ln, self.kind = _merge(np.asarray(off, _I8), np.asarray(ln, _I8),
                                              np.asarray(kind, _I8))
        self._runs = None
        self._plans = None

    def plan(self, count, extent):
        """The :class:`_Plan` moving ``count`` items (cached)."""
        plans = self._plans
        if plans is None:
            plans = self._plans = {}
        key = (count, extent)
        p = plans.get(key)
        if p is None:
            if len(plans) >= _PLANS_MAX:
                plans.clear()
            p = plans[key] = _Plan(self, count, extent)
        return p

    @classmethod
    def leaf(cls, kind, fields):
        """A predefined type: ``fields`` is [(offset, nbytes)]."""
        return cls([f[0] for f in fields], [f[1] for f in fields], [kind] * len(fields))

    def dense(self, extent):
        """One run covering exactly one extent: items tile without gaps."""
        return self.off.size == 1 and int(self.ln[0]) == extent

    def bounds(self):
        """(true lb, true ub) of the data, (0, 0) when empty."""
        if not self.off.size:
            return 0, 0
        return int(self.off.min()), int((self.off + self.ln).max())

    def runs(self):
        """(off, ln) merged regardless of kind: what pack/unpack copy."""
        if self._runs is None:
            off, ln, _ = _merge(self.off, self.ln, None)
            self._runs = (off, ln)
        return self._runs

    def repeat(self, disps, blocklens, extent):
        """Runs of items placed at ``disps[j] + k * extent`` for
        ``k < blocklens[j]``, in that order."""
        disps = np.asarray(disps, _I8)
        bl = np.asarray(blocklens, _I8)
        keep = bl > 0
        disps, bl = disps[keep], bl[keep]
        if self.dense(extent):
            # whole blocks are single runs (contiguous of a huge count stays O(1))
            o = disps + self.off[0]
            return Layout(o, bl * extent, np.full(o.size, self.kind[0], _I8))
        total = int(bl.sum())
        if total == 0 or not self.off.size:
            return Layout([], [], [])
        first = np.repeat(disps, bl)
        within = np.arange(total, dtype=_I8) - np.repeat(np.cumsum(bl) - bl, bl)
        items = first + within * extent
        off = (items[:, None] + self.off[None, :]).ravel()
        n = items.size
        return Layout(off, np.tile(self.ln, n), np.tile(self.kind, n))

    @staticmethod
    def concat(parts):
        parts = [p for p in parts if p.off.size]
        if not parts:
            return Layout([], [], [])
        return Layout(np.concatenate([p.off for p in parts]),
                      np.concatenate([p.ln for p in parts]),
                      np.concatenate([p.kind for p in parts]))

    def message_runs(self, count, extent, base=0):
        """(starts, lens) of ``count`` items starting at byte ``base``."""
        off, ln = self.runs()
        if count == 1:
            starts, lens = off + base, ln
        else:
            items = base + np.arange(count, dtype=_I8) * extent
            starts = (items[:, None] + off[None, :]).ravel()
            lens = np.tile(ln, count)
        starts, lens, _ = _merge(starts, lens, None)
        return starts, lens


_PLANS_MAX = 16      # plans cached per layout


class _Plan:
    """How C copies ``count`` items of a layout: ``n`` items of ``nruns``
    runs (``off``/``ln``, int64 pointers for C) ``step`` bytes apart;
    ``lo``/``hi``: the bytes touched, relative to the first item;
    ``total``: packed bytes."""

    __slots__ = ("n", "step", "off", "ln", "nruns", "lo", "hi", "total", "_keep")

    def __init__(self, layout, count, extent):
        off, ln = layout.runs()
        k = off.size
        self.total = int(ln.sum()) * count
        if k == 0 or count == 0:
            n, step, o, l = 0, 0, off[:0], ln[:0]
            self.lo = self.hi = 0
        else:
            lo, hi = int(off.min()), int((off + ln).max())
            span = (count - 1) * extent
            self.lo, self.hi = lo + min(0, span), hi + max(0, span)
            n, step, o, l = count, extent, off, ln
            if k == 1:
                if count == 1 or int(ln[0]) == extent:
                    n, step, l = 1, 0, np.array([self.total], _I8)
            elif (ln == ln[0]).all():
                d = np.diff(off)
                if (d == d[0]).all() and (count == 1 or extent == k * int(d[0])):
                    # the item is a vector and items continue it evenly
                    n, step, o, l = k * count, int(d[0]), off[:1], ln[:1]
        self.n, self.step, self.nruns = n, step, o.size
        o = np.ascontiguousarray(o, _I8)
        l = np.ascontiguousarray(l, _I8)
        self._keep = (o, l)
        self.off = _eng.int64_array(o) if _eng is not None else None
        self.ln = _eng.int64_array(l) if _eng is not None else None

    def fits(self, size, base, outsize, outpos):
        """Every byte moved lies inside both buffers."""
        return (base + self.lo >= 0 and base + self.hi <= size and outpos >= 0
                and outpos + self.total <= outsize)


def _c_pack(layout, count, extent, src, base, out, outpos):
    p = layout.plan(count, extent)
    if not p.fits(src.size, base, out.size, outpos):
        return None
    if p.total:
        try:
            dst = _eng.writable_pointer(out)
            s = _eng.buffer_pointer(src)
        except (BufferError, TypeError, ValueError):
            return None
        _eng.pack_runs(dst + outpos, s + base, p.n, p.step, p.off, p.ln, p.nruns)
    return outpos + p.total


def _c_unpack(layout, count, extent, packed, inpos, dst, base):
    p = layout.plan(count, extent)
    if not p.fits(dst.size, base, packed.size, inpos):
        return None
    if p.total:
        try:
            d = _eng.writable_pointer(dst)
            s = _eng.buffer_pointer(packed)
        except (BufferError, TypeError, ValueError):
            return None
        _eng.unpack_runs(d + base, s + inpos, p.n, p.step, p.off, p.ln, p.nruns)
    return inpos + p.total


def pack_new(layout, count, extent, src, base, nbytes):
    """Pack ``count`` items at ``src[base:]`` into a new uint8 array of
    ``nbytes`` (their packed size); returns (array, its address or 0).
    ``src`` is a uint8 array, or any C-contiguous ndarray when ``base`` is 0
    (its bytes)."""
    tmp = np.empty(nbytes, np.uint8)
    if not nbytes:
        return tmp, 0
    if _eng is not None:
        plans = layout._plans
        p = plans.get((count, extent)) if plans is not None else None
        if p is None:
            p = layout.plan(count, extent)
        if p.total == nbytes and base + p.lo >= 0 and base + p.hi <= src.nbytes:
            try:
                s = _eng.buffer_pointer(src)
            except (BufferError, TypeError, ValueError):
                s = None
            if s is not None:
                d = _eng.buffer_pointer(tmp)
                _eng.pack_runs(d, s + base, p.n, p.step, p.off, p.ln, p.nruns)
                return tmp, _eng.address(d)
    if src.dtype != np.uint8 or src.ndim != 1:
        src = src.reshape(-1).view(np.uint8)
    pack(layout, count, extent, src, base, tmp, 0)
    return tmp, tmp.ctypes.data


def unpack_array(layout, count, extent, packed, dst):
    """Unpack all of ``packed`` (``count`` items) into the bytes of the
    C-contiguous ndarray ``dst``, the items starting at its first byte."""
    if _eng is not None:
        plans = layout._plans
        p = plans.get((count, extent)) if plans is not None else None
        if p is None:
            p = layout.plan(count, extent)
        if p.total == packed.size and p.lo >= 0 and p.hi <= dst.nbytes:
            try:
                d = _eng.writable_pointer(dst)
            except (BufferError, TypeError, ValueError):
                d = None
            if d is not None:
                if p.total:
                    _eng.unpack_runs(d, _eng.buffer_pointer(packed), p.n, p.step, p.off, p.ln,
                                     p.nruns)
                return p.total
    return unpack(layout, count, extent, packed, 0, dst.reshape(-1).view(np.uint8), 0)


_SLICE_LOOP = 64     # at most this many runs: copy slice by slice


def _index(starts, lens):
    """Byte index of every packed byte into the unpacked buffer."""
    total = int(lens.sum())
    pos = np.cumsum(lens) - lens
    return np.arange(total, dtype=_I8) + np.repeat(starts - pos, lens)


def _strided(buf, starts, n):
    """Runs of ``n`` bytes at evenly spaced ``starts`` (a vector) as one 2-D
    strided view of ``buf``, else None."""
    if starts.size < 2:
        return None
    step = int(starts[1] - starts[0])
    if step < n or not (np.diff(starts) == step).all():
        return None
    first = int(starts[0])
    return np.lib.stride_tricks.as_strided(buf[first:], shape=(starts.size, n),
                                           strides=(step, 1))


def pack(layout, count, extent, src, base, out, outpos):
    """Copy ``count`` items at ``src[base:]`` (uint8) into ``out[outpos:]``;
    returns the new position."""
    if _eng is not None:
        pos = _c_pack(layout, count, extent, src, base, out, outpos)
        if pos is not None:
            return pos
    starts, lens = layout.message_runs(count, extent, base)
    total = int(lens.sum())
    if starts.size <= _SLICE_LOOP or total // max(starts.size, 1) >= 256:
        p = outpos
        for s, n in zip(starts.tolist(), lens.tolist()):
            out[p:p + n] = src[s:s + n]
            p += n
    elif (lens == lens[0]).all():
        n = int(lens[0])
        grid = _strided(src, starts, n)
        if grid is not None:
            out[outpos:outpos + total].reshape(-1, n)[...] = grid
        else:
            idx = starts[:, None] + np.arange(n, dtype=_I8)[None, :]
            out[outpos:outpos + total] = src[idx].ravel()
    else:
        out[outpos:outpos + total] = src[_index(starts, lens)]
    return outpos + total


def unpack(layout, count, extent, packed, inpos, dst, base):
    """Inverse of :func:`pack`; returns the new position in ``packed``."""
    if _eng is not None:
        pos = _c_unpack(layout, count, extent, packed, inpos, dst, base)
        if pos is not None:
            return pos
    starts, lens = layout.message_runs(count, extent, base)
    total = int(lens.sum())
    if starts.size <= _SLICE_LOOP or total // max(starts.size, 1) >= 256:
        p = inpos
        for s, n in zip(starts.tolist(), lens.tolist()):
            dst[s:s + n] = packed[p:p + n]
            p += n
    elif (lens == lens[0]).all():
        n = int(lens[0])
        grid = _strided(dst, starts, n)
        if grid is not None:
            grid[...] = packed[inpos:inpos + total].reshape(-1, n)
        else:
            idx = starts[:, None] + np.arange(n, dtype=_I8)[None, :]
            dst[idx] = packed[inpos:inpos + total].reshape(-1, n)
    else:
        dst[_index(starts, lens)] = packed[inpos:inpos + total]
    return inpos + total


def kind_runs(layout, count, extent, base=0):
    """(starts, lens, kinds) of ``count`` items, kinds kept apart (external32)."""
    items = base + np.arange(count, dtype=_I8) * extent
    starts = (items[:, None] + layout.off[None, :]).ravel()
    return starts, np.tile(layout.ln, count), np.tile(layout.kind, count)
