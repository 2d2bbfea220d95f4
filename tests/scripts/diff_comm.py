"""Communicators, groups, names, attributes and module-level queries."""
import numpy as np
from _mpi import MPI
from diff_util import RANK, SIZE, call, canon, finish, out

world = MPI.COMM_WORLD
r, n = RANK, SIZE
CMP = {MPI.IDENT: "IDENT", MPI.CONGRUENT: "CONGRUENT", MPI.SIMILAR: "SIMILAR",
       MPI.UNEQUAL: "UNEQUAL"}


def desc(c):
    if c == MPI.COMM_NULL:
        return "COMM_NULL"
    return (f"{type(c).__name__} size={c.Get_size()} rank={c.Get_rank()} "
            f"inter={c.Is_inter()} topo={c.Get_topology()}")


def cmp(a, b):
    return CMP.get(MPI.Comm.Compare(a, b), "?")


# module
out("module.version", MPI.Get_version())
out("module.VERSION", (MPI.VERSION, MPI.SUBVERSION))
out("module.library_version", MPI.Get_library_version()[:20])
out("module.processor_name", MPI.Get_processor_name())
out("module.is_initialized", MPI.Is_initialized())
out("module.is_finalized", MPI.Is_finalized())
out("module.query_thread", MPI.Query_thread())
out("module.is_thread_main", MPI.Is_thread_main())
out("module.wtime_type", type(MPI.Wtime()).__name__)
out("module.wtick_positive", MPI.Wtick() > 0)
for name in ("ANY_SOURCE", "ANY_TAG", "PROC_NULL", "ROOT", "UNDEFINED", "IDENT",
             "CONGRUENT", "SIMILAR", "UNEQUAL", "THREAD_SINGLE", "THREAD_FUNNELED",
             "THREAD_SERIALIZED", "THREAD_MULTIPLE", "TAG_UB", "IO", "HOST",
             "WTIME_IS_GLOBAL", "UNIVERSE_SIZE", "APPNUM", "LASTUSEDCODE", "KEYVAL_INVALID",
             "COMM_TYPE_SHARED", "MAX_PROCESSOR_NAME", "MAX_ERROR_STRING",
             "MAX_OBJECT_NAME", "BSEND_OVERHEAD", "ERR_LASTCODE", "SUCCESS",
             "ERR_TRUNCATE", "ERR_IN_STATUS", "ERR_PENDING", "ORDER_C", "ORDER_FORTRAN",
             "DIST_GRAPH", "CART", "GRAPH", "TYPECLASS_REAL", "TYPECLASS_INTEGER"):
    out(f"const.{name}", canon(getattr(MPI, name, "<missing>")))
for key in ("TAG_UB", "IO", "WTIME_IS_GLOBAL", "UNIVERSE_SIZE", "APPNUM",
            "LASTUSEDCODE"):
    call(f"attr.world.{key}", world.Get_attr, getattr(MPI, key))
call("attr.self.TAG_UB", MPI.COMM_SELF.Get_attr, MPI.TAG_UB)

# predefined communicators
for cname, c in (("world", world), ("self", MPI.COMM_SELF)):
    out(f"{cname}.desc", desc(c))
    out(f"{cname}.name", c.Get_name())
    out(f"{cname}.group.size", c.Get_group().Get_size())
    out(f"{cname}.props", (c.size, c.rank, c.is_inter, c.is_intra, c.topology))
out("null.bool", bool(MPI.COMM_NULL))
out("world.bool", bool(world))

# Dup / Compare / names
d = world.Dup()
out("dup.desc", desc(d))
out("dup.name", d.Get_name())
out("cmp.world.world", cmp(world, world))
out("cmp.world.dup", cmp(world, d))
out("cmp.world.self", cmp(world, MPI.COMM_SELF))
d.Set_name("my dup")
out("dup.name.set", d.Get_name())
out("dup.name.prop", d.name)
call("dup.Clone", lambda: desc(d.Clone()))
d2 = d.Dup()
out("dup.dup.name", d2.Get_name())
d2.Free()
out("dup.free", d2 == MPI.COMM_NULL)
req = world.Idup()
out("idup.is_tuple", isinstance(req, tuple))

# Split with colors, keys, UNDEFINED
for label, color, key in (("parity", r % 2, r), ("parity.rev", r % 2, -r),
                          ("one", 0, 0), ("undef0", MPI.UNDEFINED if r == 0 else 1, r),
                          ("allundef", MPI.UNDEFINED, 0), ("keyties", r // 2, 0)):
    s = world.Split(color, key)
    out(f"split.{label}", desc(s))
    if s != MPI.COMM_NULL:
        out(f"split.{label}.ranks", MPI.Group.Translate_ranks(
            s.Get_group(), list(range(s.Get_size())), world.Get_group()))
        out(f"split.{label}.cmp", cmp(s, world))
        out(f"split.{label}.sum", s.allreduce(r))
        s.Free()
s = world.Split_type(MPI.COMM_TYPE_SHARED, key=-r)
out("split_type.shared", desc(s))
out("split_type.cmp", cmp(s, world))
s.Free()
s = world.Split_type(MPI.UNDEFINED)
out("split_type.undef", desc(s))

# Groups
g = world.Get_group()
out("group.size.rank", (g.Get_size(), g.Get_rank(), g.size, g.rank))
ev = g.Incl(list(range(0, n, 2)))
od = g.Excl(list(range(0, n, 2)))
out("group.incl", (ev.Get_size(), ev.Get_rank()))
out("group.excl", (od.Get_size(), od.Get_rank()))
out("group.rincl", g.Range_incl([(n - 1, 0, -1)]).Get_rank())
out("group.rexcl", g.Range_excl([(0, n - 1, 2)]).Get_size())
out("group.translate", MPI.Group.Translate_ranks(g, list(range(n)), ev))
out("group.translate.procnull", MPI.Group.Translate_ranks(g, [MPI.PROC_NULL], od))
out("group.union", MPI.Group.Union(od, ev).Get_rank())
out("group.inter", MPI.Group.Intersection(g, ev).Get_size())
out("group.diff", MPI.Group.Difference(g, ev).Get_size())
gcmp = {MPI.IDENT: "IDENT", MPI.SIMILAR: "SIMILAR", MPI.UNEQUAL: "UNEQUAL"}
out("group.cmp.same", gcmp[MPI.Group.Compare(g, world.Get_group())])
out("group.cmp.rev", gcmp[MPI.Group.Compare(g, g.Range_incl([(n - 1, 0, -1)]))])
out("group.cmp.sub", gcmp[MPI.Group.Compare(g, ev)])
out("group.empty", (MPI.GROUP_EMPTY.Get_size(), MPI.GROUP_EMPTY.Get_rank()))
out("group.empty.incl", g.Incl([]).Get_size())
out("group.self", (MPI.COMM_SELF.Get_group().Get_size(),
                   MPI.Group.Translate_ranks(MPI.COMM_SELF.Get_group(), [0], g)))
out("group.dup", gcmp[MPI.Group.Compare(g.Dup(), g)])

# Create / Create_group
c = world.Create(ev)
out("create.even", desc(c))
if c != MPI.COMM_NULL:
    out("create.even.sum", c.allreduce(r))
    out("create.even.cmp", cmp(c, world))
rev = world.Create(g.Range_incl([(n - 1, 0, -1)]))
out("create.rev", desc(rev))
out("create.rev.cmp", cmp(rev, world))
if r % 2 == 0:
    cg = world.Create_group(ev, tag=5)
    out("create_group.even", desc(cg))
    out("create_group.even.bcast", cg.bcast(r * 10, root=cg.Get_size() - 1))
c = world.Create(MPI.GROUP_EMPTY)
out("create.empty", desc(c))

# Attributes on communicators
kv = MPI.Comm.Create_keyval()
d = world.Dup()
out("attr.unset", canon(d.Get_attr(kv)))
d.Set_attr(kv, {"x": 1})
out("attr.set", canon(d.Get_attr(kv)))
d.Delete_attr(kv)
out("attr.deleted", canon(d.Get_attr(kv)))
out("attr.keyval.freed", MPI.Comm.Free_keyval(kv) == MPI.KEYVAL_INVALID)

# misc communicator queries
out("errhandler", world.Get_errhandler() == MPI.ERRORS_RETURN)
out("topo", (world.Get_topology(), world.is_topo))
out("dims", MPI.Compute_dims(n * 6, 2))
out("dims3", MPI.Compute_dims(12, [0, 3, 0]))
out("info", world.Get_info().Get_nkeys() >= 0)

# datatypes: sizes, extents, names, derived types in communication
for name in ("CHAR", "SIGNED_CHAR", "UNSIGNED_CHAR", "BYTE", "SHORT", "INT", "LONG",
             "LONG_LONG", "UNSIGNED", "UNSIGNED_LONG", "FLOAT", "DOUBLE", "LONG_DOUBLE",
             "C_BOOL", "INT8_T", "INT64_T", "UINT16_T", "C_FLOAT_COMPLEX",
             "C_DOUBLE_COMPLEX", "WCHAR", "AINT", "OFFSET", "COUNT", "FLOAT_INT",
             "DOUBLE_INT", "TWOINT", "SHORT_INT", "LONG_INT", "LONG_DOUBLE_INT", "PACKED",
             "BOOL", "COMPLEX", "DOUBLE_COMPLEX"):
    t = getattr(MPI, name, None)
    if t is None:
        out(f"dtype.{name}", "<missing>")
        continue
    call(f"dtype.{name}", lambda: (t.Get_size(), t.Get_extent(), t.Get_true_extent(),
                                   t.Get_name(), t.is_predefined, t.Get_envelope()[-1]))
# (not compared: Create_vector/indexed/struct/resized and Get_contents, which
# erdmampi does not implement: only contiguous derived datatypes exist)
c = MPI.DOUBLE.Create_contiguous(3).Commit()
out("dtype.contig", (c.Get_size(), c.Get_extent(), c.Get_true_extent(), c.Get_envelope(),
                     c.is_predefined, c.Get_name()))
out("dtype.combiners", (MPI.COMBINER_NAMED, MPI.COMBINER_DUP, MPI.COMBINER_CONTIGUOUS))
dd = MPI.FLOAT.Dup()
out("dtype.dup", (dd.Get_name(), dd.Get_envelope(), dd == MPI.FLOAT, dd.Get_size()))
if n >= 2 and r < 2:
    peer = 1 - r
    a = np.arange(12, dtype="f8") * (r + 1)
    b = np.full(12, -1.0)
    st = MPI.Status()
    world.Sendrecv([a, 2, c], peer, 5, [b, 3, c], peer, 5, st)
    out("dtype.contig.sendrecv", b.tolist())
    out("dtype.contig.count", (st.Get_count(c), st.Get_elements(c), st.Get_count(MPI.DOUBLE)))
    world.Sendrecv([a, 4, MPI.DOUBLE], peer, 6, [b, 3, c], peer, 6, st)
    out("dtype.contig.partial", (st.Get_count(c), st.Get_elements(c)))

world.Barrier()
finish()
