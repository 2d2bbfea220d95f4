"""Generate ``mpi4py_reference.json`` from an installed mpi4py (the reference).

Run it in a plain Python process (MPI starts as a singleton)::

    .venv/bin/python tests/data/gen_mpi4py_reference.py

The JSON records, for ``mpi4py.MPI``:

* ``names``: every public name with its kind (``int`` with value, ``Datatype``,
  ``Op``, ``class``, ``function``, or the type name of other instances);
* ``datatypes``: size, extents, print name, typechar/typestr/tocode of each
  predefined datatype, and which other names share its handle;
* ``typedict``, ``typedict_c``, ``typedict_f``: typecode -> datatype name;
* ``errors``: error class, error string of every ``ERR_*`` constant;
* ``ops``: commutativity of the predefined operations;
* ``formats``: the datatype and count mpi4py picks for a message given as a
  bare buffer of each NumPy/array typecode (probed with ``Op.Reduce_local`` and
  a user-defined operation that records the datatype it is called with);
* ``msgspec``: the exception type (or accepted count/datatype) for a list of
  buffer specifications.
"""

import array
import json
import os
import sys

import numpy as np
from mpi4py import MPI

import mpi4py

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mpi4py_reference.json")


def kind_of(value):
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, type):
        return "class"
    if isinstance(value, MPI.Datatype):
        return "Datatype"
    if isinstance(value, MPI.Op):
        return "Op"
    if callable(value) and type(value).__name__ in (
        "cython_function_or_method", "builtin_function_or_method", "function"
    ):
        return "function"
    return type(value).__name__


def attempt(fn):
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001 - recorded as data
        return {"error": type(exc).__name__}


def datatype_names():
    return sorted(n for n in dir(MPI) if isinstance(getattr(MPI, n), MPI.Datatype))


def handle_to_name():
    """Canonical name (first in sorted order) for each handle."""
    out = {MPI.DATATYPE_NULL.handle: "DATATYPE_NULL"}
    for n in datatype_names():
        out.setdefault(getattr(MPI, n).handle, n)
    return out


def describe_datatypes():
    canon = handle_to_name()
    res = {}
    for n in datatype_names():
        dt = getattr(MPI, n)
        res[n] = {
            "null": dt == MPI.DATATYPE_NULL,
            "canonical": canon[dt.handle],
            "size": attempt(dt.Get_size),
            "extent": attempt(lambda: list(dt.Get_extent())),
            "true_extent": attempt(lambda: list(dt.Get_true_extent())),
            "mpi_name": attempt(dt.Get_name),
            "typechar": attempt(lambda: dt.typechar),
            "typestr": attempt(lambda: dt.typestr),
            "tocode": attempt(dt.tocode),
            "is_predefined": attempt(lambda: dt.is_predefined),
        }
    return res


def describe_typedict(td):
    canon = handle_to_name()
    return {k: canon[v.handle] for k, v in sorted(td.items())}


def describe_errors():
    res = {}
    for n in sorted(dir(MPI)):
        if n.startswith("ERR_") or n == "SUCCESS":
            v = getattr(MPI, n)
            res[n] = {
                "value": v,
                "class": attempt(lambda: MPI.Get_error_class(v)),
                "string": attempt(lambda: MPI.Get_error_string(v)),
            }
    return res


def describe_ops():
    res = {}
    for n in sorted(dir(MPI)):
        op = getattr(MPI, n)
        if isinstance(op, MPI.Op):
            res[n] = {
                "null": op == MPI.OP_NULL,
                "commutative": attempt(op.Is_commutative),
                "is_predefined": op.is_predefined,
            }
    return res


_seen = []


def _record(a, b, dt):
    _seen.append((dt.Get_name(), len(a)))


PROBE = MPI.Op.Create(_record, commute=True)


def probe(spec, spec2):
    """Datatype name and byte length mpi4py uses for ``spec``."""
    canon = handle_to_name()
    _seen.clear()
    try:
        PROBE.Reduce_local(spec, spec2)
    except BaseException as exc:  # noqa: BLE001
        return {"error": type(exc).__name__, "message": str(exc)}
    if not _seen:
        return {"datatype": None, "nbytes": 0}
    name, nbytes = _seen[0]
    # map the MPICH print name back to an mpi4py name
    names = [n for n in datatype_names() if getattr(MPI, n).Get_name() == name]
    return {"datatype": canon[getattr(MPI, names[0]).handle] if names else name,
            "nbytes": nbytes}


NUMPY_CODES = "?bhilqBHILQefdgFDGSUMm"


def describe_formats():
    res = {}
    for code in NUMPY_CODES:
        dtype = np.dtype(code)
        if code in "Mm":
            dtype = np.dtype(code + "8[s]")
        if code in "SU":
            dtype = np.dtype(code + "1")
        a = np.zeros(6, dtype=dtype)
        res["numpy:" + code] = probe(a, np.zeros_like(a))
    for code in "bBhHiIlLqQfd":
        a = array.array(code, [0] * 6)
        res["array:" + code] = probe(a, array.array(code, [0] * 6))
    res["bytearray"] = probe(bytearray(6), bytearray(6))
    res["bytes->bytearray"] = probe(b"abcdef", bytearray(6))
    res["numpy:>i4"] = probe(np.zeros(4, ">i4"), np.zeros(4, ">i4"))
    res["numpy:structured"] = probe(
        np.zeros(3, "f8,i4"), np.zeros(3, "f8,i4"))
    return res


def specs():
    """(label, inbuf, inoutbuf) triples: Reduce_local parses in as read-only
    and inout as writable message_simple specs, like send/recv."""
    a = np.arange(12, dtype="i4")
    b = np.zeros(12, dtype="i4")
    ro = np.arange(12, dtype="i4")
    ro.flags.writeable = False
    return [
        ("buf", a, b),
        ("[buf, type]", [a, MPI.INT], [b, MPI.INT]),
        ("[buf, count]", [a, 5], [b, 5]),
        ("[buf, count, type]", [a, 5, MPI.INT], [b, 5, MPI.INT]),
        ("[buf, count, 'i']", [a, 5, "i"], [b, 5, "i"]),
        ("[buf, (count, displ), type]", [a, (5, 2), MPI.INT], [b, (5, 2), MPI.INT]),
        ("[buf, count, displ, type]", [a, 5, 2, MPI.INT], [b, 5, 2, MPI.INT]),
        ("(buf, count, displ, type)", (a, 5, 2, MPI.INT), (b, 5, 2, MPI.INT)),
        ("[buf, (count, displ)]", [a, (5, 2)], [b, (5, 2)]),
        ("[buf, [count, displ]]", [a, [5, 2]], [b, [5, 2]]),
        ("[buf, BYTE]", [a, MPI.BYTE], [b, MPI.BYTE]),
        ("[buf, DOUBLE] 48 bytes", [a, MPI.DOUBLE], [b, MPI.DOUBLE]),
        ("[buf, DOUBLE_INT] 48 bytes", [a, MPI.DOUBLE_INT], [b, MPI.DOUBLE_INT]),
        ("[None, 0, INT]", [None, 0, MPI.INT], [None, 0, MPI.INT]),
        ("[None, INT]", [None, MPI.INT], [None, MPI.INT]),
        ("[BOTTOM, 0, INT]", [MPI.BOTTOM, 0, MPI.INT], [MPI.BOTTOM, 0, MPI.INT]),
        ("[None, 3, INT]", [None, 3, MPI.INT], [None, 3, MPI.INT]),
        ("int", 5, 5),
        ("None", None, None),
        ("str", "abc", "abc"),
        ("[]", [], []),
        ("[buf]", [a], [b]),
        ("5 items", [a, 1, 2, MPI.INT, 0], [b, 1, 2, MPI.INT, 0]),
        ("negative count", [a, -1, MPI.INT], [b, -1, MPI.INT]),
        ("negative displ", [a, 1, -1, MPI.INT], [b, 1, -1, MPI.INT]),
        ("displ out of bounds", [a, 1, 13, MPI.INT], [b, 1, 13, MPI.INT]),
        ("displ at end", [a, 0, 12, MPI.INT], [b, 0, 12, MPI.INT]),
        ("float count", [a, 1.5, MPI.INT], [b, 1.5, MPI.INT]),
        ("unknown typecode", [a, 2, "x"], [b, 2, "x"]),
        ("DATATYPE_NULL", [a, MPI.DATATYPE_NULL], [b, MPI.DATATYPE_NULL]),
        ("odd length for DOUBLE", [a[:3], MPI.DOUBLE], [b[:3], MPI.DOUBLE]),
        ("read-only recv", a, ro),
        ("bytes recv", a[:1].view("B")[:4].copy(), b"abcd"),
        ("non-contiguous", a[::2], b[::2]),
        ("2-D C", a.reshape(3, 4), b.reshape(3, 4)),
        ("2-D F", np.asfortranarray(a.reshape(3, 4)), np.asfortranarray(b.reshape(3, 4))),
        ("big-endian", a.astype(">i4"), b.astype(">i4")),
        ("count > buffer", [a, 20, MPI.INT], [b, 20, MPI.INT]),
        ("mismatch count", [a, 5, MPI.INT], [b, 6, MPI.INT]),
        ("mismatch type", [a, MPI.INT], [b, MPI.FLOAT]),
    ]


def describe_specs():
    res = {}
    canon = handle_to_name()
    for label, x, y in specs():
        _seen.clear()
        try:
            PROBE.Reduce_local(x, y)
        except BaseException as exc:  # noqa: BLE001
            res[label] = {"error": type(exc).__name__, "message": str(exc)}
            continue
        if _seen:
            name, nbytes = _seen[0]
            names = [n for n in datatype_names() if getattr(MPI, n).Get_name() == name]
            res[label] = {"datatype": canon[getattr(MPI, names[0]).handle],
                          "nbytes": nbytes}
        else:
            res[label] = {"datatype": None, "nbytes": 0}
    return res


OP_NAMES = ["MAX", "MIN", "SUM", "PROD", "LAND", "BAND", "LOR", "BOR",
            "LXOR", "BXOR", "MAXLOC", "MINLOC", "REPLACE", "NO_OP"]


def _forked(op, a, b, count, dt):
    """Run one Reduce_local in a child: MPICH aborts on some combinations."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            op.Reduce_local([a, count, dt], [b, count, dt])
        except MPI.Exception as exc:
            out = {"error_class": exc.Get_error_class()}
        except BaseException as exc:  # noqa: BLE001
            out = {"error": type(exc).__name__}
        else:
            out = {"ok": True}
        os.write(wfd, json.dumps(out).encode())
        os._exit(0)
    os.close(wfd)
    data = b""
    while chunk := os.read(rfd, 4096):
        data += chunk
    os.close(rfd)
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"abort": True}


def describe_op_matrix():
    """For each (op, named datatype): error class, or the bytes of the result
    of ``Reduce_local`` on two fixed inputs (hex, so exact)."""
    canon = handle_to_name()
    res = {}
    seen = set()
    rng = np.random.default_rng(7)
    src = rng.integers(0, 256, size=64, dtype=np.uint8)
    dst = rng.integers(0, 256, size=64, dtype=np.uint8)
    for n in datatype_names():
        dt = getattr(MPI, n)
        if dt == MPI.DATATYPE_NULL or canon[dt.handle] != n or n in seen:
            continue
        seen.add(n)
        ext = dt.Get_extent()[1]
        count = max(1, 32 // ext)
        for opn in OP_NAMES:
            op = getattr(MPI, opn)
            a = src[: count * ext].copy()
            b = dst[: count * ext].copy()
            res[f"{opn}:{n}"] = _forked(op, a, b, count, dt)
    return res


def describe_names():
    res = {}
    for n in sorted(dir(MPI)):
        if n.startswith("__"):
            continue
        v = getattr(MPI, n)
        k = kind_of(v)
        entry = {"kind": k}
        if k in ("int", "bool"):
            entry["value"] = v
        res[n] = entry
    return res


def main():
    ref = {
        "mpi4py_version": mpi4py.__version__,
        "mpi_version": list(MPI.Get_version()),
        "library_version": MPI.Get_library_version().splitlines()[0],
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "names": describe_names(),
        "datatypes": describe_datatypes(),
        "typedict": describe_typedict(MPI._typedict),
        "typedict_c": describe_typedict(MPI._typedict_c),
        "typedict_f": describe_typedict(MPI._typedict_f),
        "errors": describe_errors(),
        "ops": describe_ops(),
        "formats": describe_formats(),
        "msgspec": describe_specs(),
        "op_matrix": describe_op_matrix(),
    }
    with open(OUT, "w") as f:
        json.dump(ref, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
