"""Canonical output for the differential scripts (tests/test_vs_mpi4py.py).

Each rank records lines ``rank key value``; ``finish()`` writes them to
``$DIFF_OUT/rank<r>.txt`` (or stdout when DIFF_OUT is unset), so the harness
compares erdmampi with mpi4py+MPICH key by key.  Values are canonical: arrays
become dtype/shape/sha256 (plus the values when small), exceptions become their
class (``MPI.Exception ERR_xxx`` or the Python type name).
"""
import hashlib
import os
import sys

import numpy as np
from _mpi import MPI

RANK = MPI.COMM_WORLD.Get_rank()
SIZE = MPI.COMM_WORLD.Get_size()
_LINES = []
_ERRNAMES = {}
for _name in dir(MPI):
    if _name.startswith("ERR_") and isinstance(getattr(MPI, _name), int):
        _ERRNAMES.setdefault(getattr(MPI, _name), []).append(_name)


def errname(code):
    names = sorted(_ERRNAMES.get(code, []))
    return "|".join(names) if names else f"code{code}"


def digest(a):
    a = np.ascontiguousarray(a)
    if a.dtype.kind in "fc":
        # -0.0 -> 0.0: the sign of a zero product depends on the (unspecified)
        # order in which ranks' contributions are combined
        a = a + a.dtype.type(0)
    h = hashlib.sha256(a.tobytes()).hexdigest()[:16]
    if a.size <= 24:
        return f"{a.dtype.str}{list(a.shape)}={a.tolist()!r}"
    return f"{a.dtype.str}{list(a.shape)}#{h}"


def canon(obj):
    """A deterministic text for nested Python objects holding numpy arrays."""
    if isinstance(obj, np.ndarray):
        return "nd(" + digest(obj) + ")"
    if isinstance(obj, (list, tuple)):
        inner = ",".join(canon(x) for x in obj)
        return ("[" + inner + "]") if isinstance(obj, list) else ("(" + inner + ")")
    if isinstance(obj, dict):
        return "{" + ",".join(f"{canon(k)}:{canon(v)}" for k, v in
                              sorted(obj.items(), key=lambda kv: repr(kv[0]))) + "}"
    if isinstance(obj, (set, frozenset)):
        return "set(" + ",".join(sorted(canon(x) for x in obj)) + ")"
    if isinstance(obj, (bytes, bytearray, memoryview)):
        b = bytes(obj)
        return f"b{len(b)}:" + hashlib.sha256(b).hexdigest()[:16]
    text = repr(obj)
    if type(obj).__module__.split(".")[0] in ("mpi4py", "erdmampi") or " at 0x" in text:    # <mpi4py.MPI.Intracomm object at 0x...>: the type is what counts
        return type(obj).__name__
    return type(obj).__name__ + ":" + text


def out(key, value):
    _LINES.append(f"{RANK} {key} {value}")
    if os.environ.get("DIFF_DEBUG"):
        print(_LINES[-1], flush=True)


def exc_text(e):
    if isinstance(e, MPI.Exception):
        return "MPI.Exception " + errname(e.Get_error_class())
    return "PyErr " + type(e).__name__


def call(key, fn, *args, show=canon, **kw):
    """Run ``fn``; record ``ok <show(result)>`` or the exception class. Returns the result."""
    try:
        res = fn(*args, **kw)
    except Exception as e:  # noqa: BLE001
        out(key, exc_text(e))
        return None
    out(key, "ok " + (show(res) if show else ""))
    return res


def status_text(st):
    return (f"src={st.Get_source()} tag={st.Get_tag()} err={st.Get_error()} "
            f"count={st.Get_count()} cancelled={st.Is_cancelled()}")


def finish():
    MPI.COMM_WORLD.Barrier()
    text = "\n".join(_LINES) + "\n"
    d = os.environ.get("DIFF_OUT")
    if d:
        with open(os.path.join(d, f"rank{RANK}.txt"), "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    sys.stdout.flush()
