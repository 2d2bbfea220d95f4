"""Every predefined op x dtype through Reduce/Allreduce/Scan/Exscan/Reduce_scatter(_block),
in place and not, blocking and nonblocking; MAXLOC/MINLOC on the pair types."""
import numpy as np
from _mpi import MPI
from diff_util import RANK, SIZE, call, digest, finish, out

comm = MPI.COMM_WORLD
r, n = RANK, SIZE
OPS = ["SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR",
       "REPLACE", "NO_OP"]
DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float32", "float64", "complex64", "complex128", "bool"]
K = 5
SENTINEL = 77


def values(dt, rank):
    dt = np.dtype(dt)
    i = np.arange(K)
    if dt.kind == "b":
        return ((i + rank) % 3 == 0)
    if dt.kind == "u":
        v = (i * 7 + rank * 3) % 4
    else:
        v = (i * 7 + rank * 3) % 5 - 2
    if dt.kind == "c":
        return (v + 1j * ((i + rank) % 3 - 1)).astype(dt)
    return v.astype(dt)


def sentinel(dt, count):
    a = np.zeros(count, dt)
    a[...] = SENTINEL if np.dtype(dt).kind != "b" else True
    return a


def show(a):
    return digest(a)


def recv_counts():
    return [(i % 3) for i in range(n)]   # uneven, with zeros


def run(opname, dt, nb):
    op = getattr(MPI, opname)
    tag = f"{opname}.{dt}{'.nb' if nb else ''}"
    s = values(dt, r)

    def blk(name, *args):
        f = getattr(comm, ("I" + name[0].lower() + name[1:]) if nb else name)
        req = f(*args)
        if nb:
            req.Wait()

    # Reduce to two roots (not, then in place)
    for root in (0, n - 1):
        d = sentinel(dt, K)
        call(f"Reduce.{tag}.r{root}", blk, "Reduce", s.copy(), d, op, root, show=None)
        if r == root:
            out(f"Reduce.{tag}.r{root}.val", show(d))
        if r == root:
            d = s.copy()
            call(f"ReduceIP.{tag}.r{root}", blk, "Reduce", MPI.IN_PLACE, d, op, root, show=None)
            out(f"ReduceIP.{tag}.r{root}.val", show(d))
        else:
            call(f"ReduceIP.{tag}.r{root}", blk, "Reduce", s.copy(), None, op, root, show=None)
    d = sentinel(dt, K)
    call(f"Allreduce.{tag}", blk, "Allreduce", s.copy(), d, op, show=None)
    out(f"Allreduce.{tag}.val", show(d))
    d = s.copy()
    call(f"AllreduceIP.{tag}", blk, "Allreduce", MPI.IN_PLACE, d, op, show=None)
    out(f"AllreduceIP.{tag}.val", show(d))
    d = sentinel(dt, K)
    call(f"Scan.{tag}", blk, "Scan", s.copy(), d, op, show=None)
    out(f"Scan.{tag}.val", show(d))
    d = s.copy()
    call(f"ScanIP.{tag}", blk, "Scan", MPI.IN_PLACE, d, op, show=None)
    out(f"ScanIP.{tag}.val", show(d))
    d = sentinel(dt, K)
    call(f"Exscan.{tag}", blk, "Exscan", s.copy(), d, op, show=None)
    if r > 0:   # rank 0's receive buffer is undefined by the standard
        out(f"Exscan.{tag}.val", show(d))
    d = s.copy()
    call(f"ExscanIP.{tag}", blk, "Exscan", MPI.IN_PLACE, d, op, show=None)
    if r > 0:
        out(f"ExscanIP.{tag}.val", show(d))
    # Reduce_scatter_block: 2 per rank
    sb = np.concatenate([values(dt, r + j) for j in range(n)])[:2 * n].copy()
    d = sentinel(dt, 2)
    call(f"RSB.{tag}", blk, "Reduce_scatter_block", sb, d, op, show=None)
    out(f"RSB.{tag}.val", show(d))
    d = sb.copy()
    call(f"RSBIP.{tag}", blk, "Reduce_scatter_block", MPI.IN_PLACE, d, op, show=None)
    out(f"RSBIP.{tag}.val", show(d[:2]))
    # Reduce_scatter with uneven counts (some zero)
    cnt = recv_counts()
    tot = sum(cnt)
    sb = np.resize(values(dt, r), tot).astype(dt)
    d = sentinel(dt, cnt[r])
    call(f"RS.{tag}", blk, "Reduce_scatter", sb, d, cnt, op, show=None)
    out(f"RS.{tag}.val", show(d))
    d = sb.copy()
    call(f"RSIP.{tag}", blk, "Reduce_scatter", MPI.IN_PLACE, d, cnt, op, show=None)
    out(f"RSIP.{tag}.val", show(d[:cnt[r]]))


# Applicable combinations (MPI 4.0 section 6.9.2); MPICH asserts on some others
# (LAND on float aborts the process), so invalid pairs are only tried below, on
# Allreduce, where every rank sees the error.
APPLICABLE = {"SUM": "iufc", "PROD": "iufc", "MAX": "iuf", "MIN": "iuf",
              "LAND": "iub", "LOR": "iub", "LXOR": "iub", "BAND": "iu", "BOR": "iu",
              "BXOR": "iu", "REPLACE": "iufcb", "NO_OP": "iufcb"}
for opname in OPS:
    for dt in DTYPES:
        if np.dtype(dt).kind in APPLICABLE[opname]:
            run(opname, dt, False)
for opname, dt in (("BAND", "float64"), ("MAX", "complex128"), ("BXOR", "bool"),
                   ("SUM", "bool")):
    d = np.zeros(K, dt)
    call(f"invalid.Allreduce.{opname}.{dt}", comm.Allreduce, values(dt, r), d,
         getattr(MPI, opname), show=None)
for opname in ("SUM", "MAX", "LXOR", "BAND"):
    for dt in ("int32", "float64", "uint8", "bool"):
        run(opname, dt, True)

# MAXLOC / MINLOC on pair types
PAIRS = {
    "FLOAT_INT": [("v", "f4"), ("i", "i4")],
    "DOUBLE_INT": [("v", "f8"), ("i", "i4")],
    "LONG_INT": [("v", "i8"), ("i", "i4")],
    "TWOINT": [("v", "i4"), ("i", "i4")],
    "SHORT_INT": [("v", "i2"), ("i", "i4")],
}
for opname in ("MAXLOC", "MINLOC", "SUM", "MAX"):
    op = getattr(MPI, opname)
    for tname, fields in PAIRS.items():
        mt = getattr(MPI, tname)
        dt = np.dtype(fields, align=True)
        if dt.itemsize != mt.Get_extent()[1]:
            dt = np.dtype({"names": ["v", "i"], "formats": [fields[0][1], fields[1][1]],
                           "offsets": [0, mt.Get_extent()[1] - 4],
                           "itemsize": mt.Get_extent()[1]})
        s = np.zeros(4, dt)
        s["v"] = [(r * 3 + j) % 4 for j in range(4)]   # ties -> lowest index wins
        s["i"] = [r * 10 + j for j in range(4)]
        tag = f"{opname}.{tname}"

        def pairs(a):
            return repr([(a["v"][j].item(), a["i"][j].item()) for j in range(len(a))])

        d = np.zeros(4, dt)
        call(f"Allreduce.{tag}", comm.Allreduce, [s, mt], [d, mt], op, show=None)
        out(f"Allreduce.{tag}.val", pairs(d))
        d = np.zeros(4, dt)
        call(f"Reduce.{tag}", comm.Reduce, [s, mt], [d, mt], op, 0, show=None)
        if r == 0:
            out(f"Reduce.{tag}.val", pairs(d))
        d = np.zeros(4, dt)
        call(f"Scan.{tag}", comm.Scan, [s, mt], [d, mt], op, show=None)
        out(f"Scan.{tag}.val", pairs(d))
        d = s.copy()
        call(f"AllreduceIP.{tag}", comm.Allreduce, MPI.IN_PLACE, [d, mt], op, show=None)
        out(f"AllreduceIP.{tag}.val", pairs(d))

# Op object properties
for opname in OPS + ["MAXLOC", "MINLOC"]:
    op = getattr(MPI, opname)
    out(f"op.{opname}.commute", call(f"op.{opname}.is_commutative", op.Is_commutative))
# Reduce_local
for opname in ("SUM", "PROD", "MAX", "BXOR", "LAND"):
    a = values("int32", 1)
    b = values("int32", 2)
    call(f"Reduce_local.{opname}", getattr(MPI, opname).Reduce_local, a, b, show=None)
    out(f"Reduce_local.{opname}.val", digest(b))
# user-defined ops on buffers: a commutative one, and a non-commutative but
# associative one (composition of affine maps x -> m*x + c, stored as pairs)
def _uop_comm(a, b, dt):
    na = np.frombuffer(a, dtype="i8")
    nb = np.frombuffer(b, dtype="i8")
    nb[:] = na + nb + 1


def _uop_affine(a, b, dt):
    na = np.frombuffer(a, dtype="i8").reshape(-1, 2)
    nb = np.frombuffer(b, dtype="i8").reshape(-1, 2)
    m = na[:, 0] * nb[:, 0]
    c = na[:, 0] * nb[:, 1] + na[:, 1]
    nb[:, 0] = m
    nb[:, 1] = c


for commute, fn in ((True, _uop_comm), (False, _uop_affine)):
    uop = MPI.Op.Create(fn, commute=commute)
    s = np.array([[r % 3 - 1 or 2, r * 5 + j] for j in range(3)], "i8").reshape(-1)
    for name in ("Allreduce", "Scan", "Exscan", "Reduce"):
        d = np.zeros(6, "i8")
        args = (s, d, uop) + ((n - 1,) if name == "Reduce" else ())
        call(f"{name}.user.{commute}", getattr(comm, name), *args, show=None)
        if (name != "Reduce" or r == n - 1) and (name != "Exscan" or r > 0):
            out(f"{name}.user.{commute}.val", digest(d))
    d = np.zeros(2 * n, "i8")
    call(f"RSB.user.{commute}", comm.Reduce_scatter_block,
         np.tile(s[:2], n), d[:2], uop, show=None)
    out(f"RSB.user.{commute}.val", digest(d[:2]))
    out(f"user.{commute}.is_commutative", uop.Is_commutative())
    uop.Free()

finish()
