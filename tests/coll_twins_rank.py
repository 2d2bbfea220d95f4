"""Rank program of tests/test_coll_twins.py: each collective that has a C
implementation (ext/src/erdma_coll.c, erdma_bulk.c, the C fast path of
erdma_pyfast.c) and a Python one (erdmampi/collectives) runs both ways on
the same inputs; the results must be bit-identical and every rank must post
the same point-to-point messages in the same order (the engine's message
trace: send/receive, peer, tag within the call's tag block, bytes, context).

The C path is the ordinary call on a plain contiguous array; the Python
path is the same call with ``ERDMA_COLL_<NAME>=<algorithm>`` naming the
algorithm the default rule picks (every rank sets it at the same point),
which keeps the call off the one-call C route.  Which way a call went is
checked too: the C call must run no Python algorithm, the forced one exactly
the one named.

Prints ``TWIN <case> c=<path> py=<path>`` per case compared, ``SKIP <case>``
where the default rule leaves the C route at this size (nothing to compare),
``MISMATCH ...`` with the first difference, ``SENSITIVE <case>`` for the
checks that a different algorithm yields a different message sequence, and
``DONE <count>`` at the end.

Arguments: ``--quick`` (fewer sizes), ``--break`` (compare each C call with a
different Python algorithm: every comparison must then fail; the harness
checks the comparison can fail).
"""
import os
import sys
import zlib

import numpy as np

from erdmampi import MPI
from erdmampi._commrt import _COLL_TAGS, _rt
from erdmampi._engine import PAIR_BCAST_MAX, PAIR_CMA_MAX, PAIR_DATA_MAX
import erdmampi.collectives as coll

QUICK = "--quick" in sys.argv
BREAK = "--break" in sys.argv

world = MPI.COMM_WORLD
comm = world.Dup()
n, me = comm.Get_size(), comm.Get_rank()
eng = _rt.engine
# Two ranks of one host agree at their first Barriers to hold the later ones
# by flags in shared memory (no messages, on every path): agreed here, before
# the twins, so that each twin meets one state
for _ in range(3):
    comm.Barrier()

# Which Python algorithms ran: wrap every entry of the algorithm table.
ran = []


def _wrap(cname, aname, fn):
    def run(*a, **kw):
        ran.append(f"{cname}:{aname}")
        return fn(*a, **kw)
    return run


for _cname, _algos in coll.ALGORITHMS.items():
    for _aname, _fn in list(_algos.items()):
        _algos[_aname] = _wrap(_cname, _aname, _fn)


def norm(trace):
    """(op, peer, tag within the call's block, bytes, context) per message."""
    return [(op, peer, tag % _COLL_TAGS if tag >= 0 else tag, nb, ctx)
            for op, peer, tag, nb, ctx in trace]


def traced(call):
    """Run ``call`` (returns the arrays to compare): (results, trace, Python algorithms)."""
    comm.Barrier()
    k = len(ran)
    eng.trace_start(1 << 14)
    try:
        out = call()
    finally:
        trace = eng.trace_take()
        eng.trace_start(0)
    return [np.array(o, copy=True) for o in out], norm(trace), ran[k:]


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"message {i}: {x} != {y}"
    return f"lengths {len(a)} != {len(b)}"


failures = 0
compared = 0


def report(line):
    print(f"[{me}] {line}", flush=True)


# The one-host bulk collectives (erdma_bulk.c) are one C function on both
# paths; the order of their second round of messages follows the order the
# peers' first ones arrive in, so their messages are compared as a set.
UNORDERED = {("alltoall", "sched"), ("allgatherv", "sched_ring")}


def forced(var, value, call, ranks=None):
    """``call`` traced with ``var=value`` set on ``ranks`` (None: all)."""
    on = ranks is None or me in ranks
    if on:
        os.environ[var] = value
    try:
        return traced(call)
    finally:
        if on:
            del os.environ[var]


def twin(label, env, algo, call, other=None, strided=None, flags=False):
    """Compare the C call with the Python ``algo`` (``ERDMA_COLL_<env>``).
    ``call`` builds fresh inputs each time.  Also: the C call again (the
    cached / fast route), and a mixed run (even ranks Python, odd ones C:
    the two must interoperate).  ``strided``: the same call with a strided
    buffer, which takes the Python path with the default rule.  ``other``: a
    different algorithm of that collective for --break.  ``flags``: two ranks
    that agreed on flags take them on every path (erdma_pair_*): no
    algorithm runs and no message is sent, the forced call included."""
    global failures, compared
    if BREAK and (not other or flags):
        return
    var = coll.ENV_PREFIX + env
    c_out, c_trace, c_py = traced(call)
    runs = [("c2", traced(call))]
    p_out, p_trace, p_py = forced(var, other if BREAK else algo, call)
    if c_py or runs[0][1][2]:
        # the default rule sends this call to Python at this size: not a twin
        report(f"SKIP {label} ({','.join(c_py or runs[0][1][2])})")
        return
    if not BREAK:
        runs.append(("mixed", forced(var, algo, call, range(0, n, 2))))
        if strided is not None:
            runs.append(("strided", traced(strided)))
    compared += 1
    bad = []
    want = [] if flags else [f"{env.lower()}:{algo}"]
    if not BREAK and p_py[:1] != want:
        bad.append(f"forced path ran {p_py}")
    if flags and p_trace:
        bad.append(f"sent by messages: {p_trace[:2]}")
    if (env.lower(), algo) in UNORDERED:
        c_trace, p_trace = sorted(c_trace), sorted(p_trace)
        runs = [(t, (o, sorted(tr), py)) for t, (o, tr, py) in runs]
    for tag, (out, tr, _) in [("c", (c_out, c_trace, c_py))] + runs:
        if len(out) != len(p_out) or any(x.tobytes() != y.tobytes() for x, y in zip(out, p_out)):
            bad.append(f"{tag} results differ")
        if tr != p_trace:
            bad.append(f"{tag} messages differ: {first_diff(tr, p_trace)}")
    if strided is not None and not BREAK and runs[-1][1][2][:1] != want:
        bad.append(f"strided path ran {runs[-1][1][2]}")
    if bad:
        failures += 1
        report(f"MISMATCH {label}: " + "; ".join(bad))
    else:
        report(f"TWIN {label} msgs={len(c_trace)}")


def rng(case):
    return np.random.default_rng([me, zlib.crc32(case.encode())])


def data(case, count, dtype, rank_part=True):
    r = rng(case)
    if np.dtype(dtype).kind == "f":
        return r.standard_normal(count).astype(dtype)
    return r.integers(-1000, 1000, count).astype(dtype)


_vectors = {}


def strided_type(base, count):
    """``count`` elements of ``base``, every other one (committed, kept)."""
    key = (base.Get_size(), id(base), count)
    if key not in _vectors:
        _vectors[key] = base.Create_vector(count, 1, 2).Commit()
    return _vectors[key]


DT = {"f8": (np.float64, MPI.DOUBLE), "i4": (np.int32, MPI.INT), "f4": (np.float32, MPI.FLOAT)}
# sizes in elements: around the one-call limits (64 KiB eager, 256 KiB schedules)
small = [1, 3, 1000] if QUICK else [1, 3, 1000, 8192]

# -- barrier
twin("barrier", "BARRIER", "dissemination", lambda: (comm.Barrier(), [])[1],
     other=None)

# -- bcast (binomial; two ranks below PAIR_BCAST_MAX bytes: by flags on every
# path, above PAIR_DATA_MAX the bytes copied with CMA)
for count in small + ([131072] if n == 2 else []):
    for root in sorted({0, n - 1}):
        def bcast(count=count, root=root):
            buf = data("bcast", count, np.float64) if me == root else np.zeros(count)
            comm.Bcast([buf, MPI.DOUBLE], root=root)
            return [buf]
        def bcast_strided(count=count, root=root):
            b2 = np.zeros((count, 2))
            if me == root:
                b2[:, 0] = data("bcast", count, np.float64)
            comm.Bcast([b2, 1, strided_type(MPI.DOUBLE, count)], root=root)
            return [b2[:, 0]]
        twin(f"bcast n={count} root={root}", "BCAST", "binomial", bcast,
             other="scatter_allgather", strided=bcast_strided,
             flags=n == 2 and 8 * count < PAIR_BCAST_MAX)

# -- allreduce (recursive doubling; two ranks of one host: the pair)
for dt in ("f8", "i4"):
    for count in small + ([32768] if n == 2 else []):
        for op in (MPI.SUM, MPI.MAX) if dt == "i4" else (MPI.SUM,):
            for inplace in (False, True):
                npt, mt = DT[dt]

                def allreduce(count=count, op=op, inplace=inplace, npt=npt, mt=mt,
                              bufs=(np.zeros(count, npt), np.zeros(count, npt))):
                    # the same arrays every time: the second C call takes the C
                    # fast path (erdma_pyfast.c) where it applies
                    s, r = bufs
                    s[:] = data(f"ar{count}", count, npt)
                    r[:] = 0
                    if inplace:
                        r[:] = s
                        comm.Allreduce(MPI.IN_PLACE, r, op=op)
                    else:
                        comm.Allreduce(s, r, op=op)
                    return [r]

                def allreduce_strided(count=count, op=op, inplace=inplace, npt=npt, mt=mt):
                    s = data(f"ar{count}", count, npt)
                    r2 = np.zeros((count, 2), npt)
                    vec = strided_type(mt, count)   # every other element: the Python path
                    if inplace:
                        r2[:, 0] = s
                        comm.Allreduce(MPI.IN_PLACE, [r2, 1, vec], op=op)
                    else:
                        s2 = np.zeros((count, 2), npt)
                        s2[:, 0] = s
                        comm.Allreduce([s2, 1, vec], [r2, 1, vec], op=op)
                    return [r2[:, 0]]
                algo = ("sched_pair" if count * np.dtype(npt).itemsize > 65536
                        else "recursive_doubling")
                twin(f"allreduce {dt} n={count} {op} inplace={inplace}", "ALLREDUCE", algo,
                     allreduce, other="ring",
                     strided=allreduce_strided if algo == "recursive_doubling" else None)

# -- reduce (binomial)
for count in small:
    for root in sorted({0, n - 1}):
        for inplace in (False, True):
            def reduce(count=count, root=root, inplace=inplace):
                s = data(f"red{count}", count, np.float64)
                r = np.zeros(count) if me == root else None
                if inplace and me == root:
                    r[:] = s
                    comm.Reduce(MPI.IN_PLACE, [r, MPI.DOUBLE], op=MPI.SUM, root=root)
                else:
                    comm.Reduce([s, MPI.DOUBLE], None if r is None else [r, MPI.DOUBLE],
                                op=MPI.SUM, root=root)
                return [] if r is None else [r]
            twin(f"reduce n={count} root={root} inplace={inplace}", "REDUCE", "binomial",
                 reduce)

# -- reduce_scatter_block (ring; two ranks at >= 256 KiB: the pair)
for count in [1, 1000] + ([] if QUICK else [4096]) + ([16384] if n == 2 else []):
    for inplace in (False, True):
        def rsb(count=count, inplace=inplace):
            s = data(f"rs{count}", count * n, np.float64)
            if inplace:
                comm.Reduce_scatter_block(MPI.IN_PLACE, [s, MPI.DOUBLE], op=MPI.SUM)
                return [s[:count]]
            r = np.zeros(count)
            comm.Reduce_scatter_block([s, MPI.DOUBLE], [r, MPI.DOUBLE], op=MPI.SUM)
            return [r]
        algo = "sched_pair" if count * n * 8 >= coll.SCHED_MIN else "ring"
        twin(f"reduce_scatter_block n={count} inplace={inplace}", "REDUCE_SCATTER", algo, rsb,
             other="reduce_scatterv")

# -- gather / scatter (linear)
for blk in [1, 512] + ([] if QUICK else [16384]):
    for root in sorted({0, n - 1}):
        for inplace in (False, True):
            def gather(blk=blk, root=root, inplace=inplace):
                s = data(f"g{blk}", blk, np.float64)
                r = np.zeros(blk * n) if me == root else None
                if inplace and me == root:
                    r[me * blk:(me + 1) * blk] = s
                    comm.Gather(MPI.IN_PLACE, [r, MPI.DOUBLE], root=root)
                else:
                    comm.Gather([s, MPI.DOUBLE], None if r is None else [r, MPI.DOUBLE],
                                root=root)
                return [] if r is None else [r]

            def scatter(blk=blk, root=root, inplace=inplace):
                s = data(f"s{blk}", blk * n, np.float64) if me == root else None
                r = np.zeros(blk)
                if inplace and me == root:
                    comm.Scatter([s, MPI.DOUBLE], MPI.IN_PLACE, root=root)
                    return [s]
                comm.Scatter(None if s is None else [s, MPI.DOUBLE], [r, MPI.DOUBLE], root=root)
                return [r]
            twin(f"gather blk={blk} root={root} inplace={inplace}", "GATHER", "linear", gather,
                 other="binomial")
            twin(f"scatter blk={blk} root={root} inplace={inplace}", "SCATTER", "linear",
                 scatter, other="binomial")

# -- allgather (direct; >= 256 KiB: the bulk ring; two ranks, blocks up to
# PAIR_DATA_MAX bytes: by flags on every path)
for blk in [1, 512] + ([] if QUICK else [4096, 16384]):
    for inplace in (False, True):
        def allgather(blk=blk, inplace=inplace):
            s = data(f"ag{blk}", blk, np.float64)
            r = np.zeros(blk * n)
            if inplace:
                r[me * blk:(me + 1) * blk] = s
                comm.Allgather(MPI.IN_PLACE, [r, MPI.DOUBLE])
            else:
                comm.Allgather([s, MPI.DOUBLE], [r, MPI.DOUBLE])
            return [r]
        algo = "sched_ring" if blk * n * 8 >= coll.SCHED_MIN else "direct"
        twin(f"allgather blk={blk} inplace={inplace}", "ALLGATHERV", algo, allgather,
             other="ring", flags=n == 2 and 8 * blk <= PAIR_DATA_MAX)

# -- alltoall (direct; the bulk one from ERDMA_SCHED_MIN both ways, or with two
# ranks from BULK_ALLTOALL_PAIR_MIN; two ranks, blocks below PAIR_CMA_MAX
# bytes: by flags on every path, above PAIR_DATA_MAX their bytes read by CMA)
for blk in [1, 512] + ([] if QUICK else [4096, 16384]):
    for inplace in (False, True):
        def alltoall(blk=blk, inplace=inplace):
            s = data(f"a2a{blk}", blk * n, np.float64)
            if inplace:
                comm.Alltoall(MPI.IN_PLACE, [s, MPI.DOUBLE])
                return [s]
            r = np.zeros(blk * n)
            comm.Alltoall([s, MPI.DOUBLE], [r, MPI.DOUBLE])
            return [r]
        algo = coll._default("alltoall", 2 * blk * n * 8, n, blk * n * 8, True)
        twin(f"alltoall blk={blk} inplace={inplace}", "ALLTOALL", algo, alltoall,
             other="pairwise", flags=n == 2 and 8 * blk < PAIR_CMA_MAX)


# -- sensitivity: a different Python algorithm must post other messages
def sensitive(label, env, algo, call):
    global failures
    _, c_trace, c_py = traced(call)
    _, p_trace, p_py = forced(coll.ENV_PREFIX + env, algo, call)
    if c_py or p_py[:1] != [f"{env.lower()}:{algo}"] or c_trace == p_trace:
        failures += 1
        report(f"MISMATCH sensitivity {label}: C ran {c_py}, forced ran {p_py}, "
               f"same messages: {c_trace == p_trace}")
    else:
        report(f"SENSITIVE {label}")


def ar1000():
    s = data("sens", 1000, np.float64)
    r = np.zeros(1000)
    comm.Allreduce([s, MPI.DOUBLE], [r, MPI.DOUBLE], op=MPI.SUM)
    return [r]


def bc1000():
    k = PAIR_DATA_MAX // 8 + 1000       # (three ranks and more: two take flags, posting nothing)
    buf = data("sens", k, np.float64) if me == 0 else np.zeros(k)
    comm.Bcast([buf, MPI.DOUBLE], root=0)
    return [buf]


def a2a64():
    s = data("sens", 64 * n, np.float64)
    r = np.zeros(64 * n)
    comm.Alltoall([s, MPI.DOUBLE], [r, MPI.DOUBLE])
    return [r]


if not BREAK:
    sensitive("allreduce ring", "ALLREDUCE", "ring", ar1000)
    if n > 2:
        sensitive("bcast scatter_allgather", "BCAST", "scatter_allgather", bc1000)
    if 2 < n < 5:   # two ranks: pairwise and direct post the same messages; five: bruck
        sensitive("alltoall pairwise", "ALLTOALL", "pairwise", a2a64)

report(f"DONE compared={compared} failed={failures}")
comm.Free()
