"""Compression codecs for collectives: Numba CPU and CUDA kernels.

Codecs register by name and id; implementation modules (which import Numba)
load on first use.  ``decode(enc)`` dispatches on the id in the encoding's
header, so a receiver needs no out-of-band description.

>>> from erdmampi import kernels
>>> c = kernels.get("lossless")
>>> enc = c.encode(x); y = kernels.decode(enc)
"""

from __future__ import annotations

if __name__ != "erdmampi.kernels":  # pragma: no cover - guard
    # Numba's on-disk caches live next to the sources and record the module
    # name; compiling under another name poisons them for every process.
    raise ImportError(f"import this package as erdmampi.kernels, not {__name__}")

import importlib
from typing import Dict, Tuple

from erdmampi.kernels.codec import Codec, CodecError, ErrorFeedback
from erdmampi.kernels.format import parse as _parse

__all__ = ["Codec", "CodecError", "ErrorFeedback", "get", "names", "register",
           "decode", "header", "by_id"]

# name -> (codec id, "module:Class"); ids are part of the wire format: never
# reuse one.
_BUILTIN: Dict[str, Tuple[int, str]] = {
    "raw": (0, "erdmampi.kernels.raw:Raw"),
    "lossless": (1, "erdmampi.kernels.lossless:Lossless"),
    "bf16": (8, "erdmampi.kernels.lossy:BF16"),
    "int8": (9, "erdmampi.kernels.lossy:Int8"),
    "int4": (10, "erdmampi.kernels.lossy:Int4"),
}
_loaded: Dict[str, Codec] = {}


def register(name: str, codec_id: int, target) -> None:
    """Register a codec: ``target`` is a Codec instance or "module:Class"."""
    if name in _BUILTIN or name in _loaded:
        raise ValueError(f"codec {name!r} already registered")
    if any(cid == codec_id for cid, _ in _BUILTIN.values()):
        raise ValueError(f"codec id {codec_id} already in use")
    if isinstance(target, Codec):
        _loaded[name] = target
        _BUILTIN[name] = (codec_id, "")
    else:
        _BUILTIN[name] = (codec_id, target)


def names() -> list:
    """Registered codec names."""
    return sorted(_BUILTIN)


def get(name: str) -> Codec:
    """The codec registered as ``name`` (imports its module on first use)."""
    c = _loaded.get(name)
    if c is not None:
        return c
    try:
        cid, target = _BUILTIN[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; known: {', '.join(names())}") from None
    mod, cls = target.split(":")
    c = getattr(importlib.import_module(mod), cls)()
    if c.codec_id != cid:
        raise RuntimeError(f"codec {name}: id {c.codec_id} != registered {cid}")
    _loaded[name] = c
    return c


def by_id(codec_id: int) -> Codec:
    """The codec whose header id is ``codec_id``."""
    for name, (cid, _) in _BUILTIN.items():
        if cid == codec_id:
            return get(name)
    raise CodecError(f"unknown codec id {codec_id} in encoded data")


def header(enc):
    """The validated :class:`~erdmampi.kernels.format.Header` of an encoding."""
    return _parse(enc, verify_payload=False)[0]


def decode(enc, out=None):
    """Decode any encoding, choosing the codec from its header."""
    return by_id(header(enc).codec_id).decode(enc, out)
