"""Object collectives on sub-communicators, user ops and custom pickles."""
from _mpi import MPI, check, done

w = MPI.COMM_WORLD
r, n = w.Get_rank(), w.Get_size()
sub = w.Split(r % 2, r)
sr, sn = sub.Get_rank(), sub.Get_size()
check(sub.allreduce(r) == sum(range(r % 2, n, 2)), "sub allreduce")
check(w.allreduce(r) == n * (n - 1) // 2, "world allreduce interleaved")
check(sub.bcast(("root", r) if sr == sn - 1 else None, sn - 1)[0] == "root", "sub bcast")
cat = w.allreduce(str(r), op=lambda a, b: a + b)
check(cat == "".join(str(i) for i in range(n)), f"callable op order {cat}")
check(w.allreduce((r, r), MPI.MAXLOC) == (n - 1, n - 1), "MAXLOC")
check(w.allreduce((r, r), MPI.MINLOC) == (0, 0), "MINLOC")
check(w.reduce({r}, op=lambda a, b: a | b, root=0) == (set(range(n)) if r == 0 else None),
      "reduce sets")
check(w.scan([r], op=lambda a, b: a + b) == list(range(r + 1)), "scan lists")
check(w.alltoall([None] * n) == [None] * n, "alltoall None")
check(w.gather(None, n - 1) == ([None] * n if r == n - 1 else None), "gather None")
done("cco_obj")
