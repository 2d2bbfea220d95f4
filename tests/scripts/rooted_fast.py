"""Gather, Scatter and Reduce repeated with the same buffers (one C call from
the second call on): data, every root, IN_PLACE at the root, an unused
buffer of None at the other ranks, another op, fresh views, blocks too
large for a shared-memory ring, errors."""
import numpy as np
from _mpi import MPI, check, done, raises

for c in (MPI.COMM_SELF, MPI.COMM_WORLD):
    r, n = c.Get_rank(), c.Get_size()
    for root in range(n):
        s = np.zeros(3)
        g = np.zeros(3 * n)
        red = np.zeros(3)
        for i in range(4):
            s[:] = 10 * r + i
            g[:] = -1
            c.Gather(s, g if r == root else None, root)
            if r == root:
                check(g.tolist() == [10 * k + i for k in range(n) for _ in range(3)],
                      f"Gather {root} {i}")
            if r == root:
                g[:] = [100 * k + i for k in range(n) for _ in range(3)]
            c.Scatter(g if r == root else None, s, root)
            check(s.tolist() == [100 * r + i] * 3, f"Scatter {root} {i}")
            s[:] = r + i
            red[:] = -1
            c.Reduce(s, red if r == root else None, MPI.SUM, root)
            if r == root:
                check(red.tolist() == [n * i + n * (n - 1) / 2] * 3, f"Reduce {root} {i}")
        c.Reduce(s, red if r == root else None, MPI.MAX, root)     # another op
        if r == root:
            check(red.tolist() == [n - 1 + 3.0] * 3, f"Reduce MAX {root}")
        for i in range(3):                                       # IN_PLACE at the root
            g[:] = -1
            g[3 * r:3 * r + 3] = r + i
            if r == root:
                c.Gather(MPI.IN_PLACE, g, root)
                check(g.tolist() == [k + i for k in range(n) for _ in range(3)],
                      f"Gather in place {root} {i}")
            else:
                c.Gather(g[3 * r:3 * r + 3], None, root)
            red[:] = r + i
            if r == root:
                c.Reduce(MPI.IN_PLACE, red, MPI.SUM, root)
                check(red.tolist() == [n * i + n * (n - 1) / 2] * 3,
                      f"Reduce in place {root} {i}")
            else:
                c.Reduce(red, None, MPI.SUM, root)
        for i in range(3):                                       # a fresh view each call
            s[:] = r + i
            c.Gather(s[:3], g[:3 * n] if r == root else None, root)
            if r == root:
                check(g.tolist() == [k + i for k in range(n) for _ in range(3)],
                      f"Gather of fresh views {root} {i}")
        for i in range(3):                                       # Scatter into views
            g[:] = [100 * k + i for k in range(n) for _ in range(3)]
            c.Scatter(g if r == root else None, s[:3], root)
            check(s.tolist() == [100 * r + i] * 3, f"Scatter into fresh views {root} {i}")
        ro = s[:3]                                               # every rank: refused
        ro.flags.writeable = False
        s[:] = 5
        try:
            c.Scatter(g if r == root else None, ro, root)
            check(False, "Scatter into a read-only view")
        except (BufferError, MPI.Exception):
            pass
        check(s.tolist() == [5.0] * 3, "a read-only view is left alone")
        c.Barrier()
    # blocks larger than a shared-memory ring's eager message (posted, waited)
    bs = np.zeros(1 << 18)                                       # 2 MiB
    bg = np.zeros((1 << 18) * n)
    for root in range(n):
        for i in range(3):
            bs[:] = 10 * r + i
            c.Gather(bs, bg if r == root else None, root)
            if r == root:
                check(all(bg[k << 18] == bg[((k + 1) << 18) - 1] == 10 * k + i
                          for k in range(n)), f"Gather of 2 MiB blocks {root} {i}")
                bg[:] = np.repeat([100.0 * k + i for k in range(n)], 1 << 18)
            c.Scatter(bg if r == root else None, bs, root)
            check(bs[0] == bs[-1] == 100 * r + i and bs.min() == bs.max(),
                  f"Scatter of 2 MiB blocks {root} {i}")
    check(raises(MPI.ERR_ROOT, c.Gather, s, g, n), "Gather bad root")
    check(raises(MPI.ERR_ROOT, c.Reduce, s, red, MPI.SUM, -3), "Reduce bad root")
    c.Barrier()

done("rooted_fast")
