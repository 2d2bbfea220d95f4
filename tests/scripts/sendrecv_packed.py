"""Sendrecv of [array, count, derived datatype] specs repeated with the same
arrays (a halo exchange: rows and strided columns of subarray types), as the
packed path runs them from the second call on: data, statuses, a shorter
message, ANY_SOURCE, PROC_NULL, a resized array, a freed datatype, a
read-only receive array, a receive whose message comes only after a blocking
call's first wait (half a second) has passed.  At 1 rank the peer is the rank
itself."""
import time

import numpy as np
from _mpi import MPI, check, done

c = MPI.COMM_WORLD
r, n = c.Get_rank(), c.Get_size()
up, down = (r + 1) % n, (r - 1) % n
N = 6
full = [N + 2, N + 2]


def sub(sizes, starts):
    return MPI.DOUBLE.Create_subarray(full, sizes, starts).Commit()


row_top, row_bot = sub([1, N], [1, 1]), sub([1, N], [N, 1])
halo_top, halo_bot = sub([1, N], [0, 1]), sub([1, N], [N + 1, 1])
col_left, col_right = sub([N, 1], [1, 1]), sub([N, 1], [1, N])
halo_left, halo_right = sub([N, 1], [1, 0]), sub([N, 1], [1, N + 1])


def grid(rank, it):
    return np.arange((N + 2) ** 2, dtype=np.float64).reshape(N + 2, N + 2) + 1000 * rank + it


for it in range(4):
    if it < 2:                         # the same array from the third call on
        a, made = grid(r, it), it
    a[1:-1, 1:-1] = grid(r, it)[1:-1, 1:-1]
    st = MPI.Status()
    c.Sendrecv([a, 1, row_top], down, 1, [a, 1, halo_bot], up, 1, st)
    c.Sendrecv([a, 1, row_bot], up, 2, [a, 1, halo_top], down, 2)
    c.Sendrecv([a, 1, col_left], down, 3, [a, 1, halo_right], up, 3)
    c.Sendrecv([a, 1, col_right], up, 4, [a, 1, halo_left], down, 4)
    check(st.Get_source() == up and st.Get_tag() == 1 and st.Get_count(MPI.DOUBLE) == N,
          f"status {it}")
    check(st.Get_count(row_top) == 1, f"count in datatypes {it}")
    gu, gd = grid(up, it), grid(down, it)
    check((a[N + 1, 1:-1] == gu[1, 1:-1]).all(), f"bottom halo {it}")
    check((a[0, 1:-1] == gd[N, 1:-1]).all(), f"top halo {it}")
    check((a[1:-1, N + 1] == gu[1:-1, 1]).all(), f"right halo {it}")
    check((a[1:-1, 0] == gd[1:-1, N]).all(), f"left halo {it}")
    check((a[1:-1, 1:-1] == grid(r, it)[1:-1, 1:-1]).all(), f"interior untouched {it}")
    check(a[0, 0] == grid(r, made)[0, 0] and a[N + 1, N + 1] == grid(r, made)[N + 1, N + 1],
          f"corners untouched {it}")

# rank 0 sends late: its receiving neighbour waits on past its first slice
for it in range(3):
    a[1:-1, 1:-1] = grid(r, 10 + it)[1:-1, 1:-1]
    if r == 0 and it == 2:
        time.sleep(1.2)
    c.Sendrecv([a, 1, col_left], down, 15, [a, 1, halo_right], up, 15)
    if r == 0 and it == 2:
        time.sleep(1.2)
    c.Sendrecv([a, 1, row_top], down, 16, [a, 1, halo_bot], up, 16)
    gu = grid(up, 10 + it)
    check((a[1:-1, N + 1] == gu[1:-1, 1]).all(), f"late right halo {it}")
    check((a[N + 1, 1:-1] == gu[1, 1:-1]).all(), f"late bottom halo {it}")

# a plain send into a packed receive, and the other way round
b = np.zeros((N + 2, N + 2))
for it in range(3):
    v = np.full(N, float(10 * r + it))
    c.Sendrecv(v, down, 5, [b, 1, halo_right], up, 5)
    check((b[1:-1, N + 1] == 10 * up + it).all(), f"plain into packed {it}")
    w = np.zeros(N)
    b[1:-1, 1] = 20 * r + it
    c.Sendrecv([b, 1, col_left], down, 6, w, up, 6)
    check((w == 20 * up + it).all(), f"packed into plain {it}")

# a tuple spec with a predefined datatype beside a packed side
for it in range(2):
    b[:] = 0
    c.Sendrecv((np.full(N, float(r + it)), MPI.DOUBLE), down, 14, [b, 1, halo_right], up, 14)
    check((b[1:-1, N + 1] == up + it).all(), f"tuple spec beside packed {it}")

# a shorter message: only its elements land, the rest of the array keeps its values
for it in range(3):
    b[:] = -1
    st = MPI.Status()
    c.Sendrecv(np.full(2, float(r)), down, 7, [b, 1, halo_right], up, 7, st)
    check(st.Get_count(MPI.DOUBLE) == 2 and st.Get_elements(MPI.DOUBLE) == 2,
          f"short count {it}")
    check((b[1:3, N + 1] == up).all() and (b[3:-1, N + 1] == -1).all()
          and (b[:, :N + 1] == -1).all(), f"short message {it}")

# ANY_SOURCE and ANY_TAG on the packed receive
for it in range(2):
    b[:] = 0
    st = MPI.Status()
    c.Sendrecv([a, 1, col_left], down, 8, [b, 1, halo_right], MPI.ANY_SOURCE, MPI.ANY_TAG, st)
    check(st.Get_source() == up and st.Get_tag() == 8, f"any source {it}")
    check((b[1:-1, N + 1] == a[1:-1, 1] - 1000 * r + 1000 * up).all() if n > 1
          else (b[1:-1, N + 1] == a[1:-1, 1]).all(), f"any source data {it}")

# PROC_NULL on both sides: nothing moves
for it in range(2):
    b[:] = 5
    st = MPI.Status()
    c.Sendrecv([a, 1, col_left], MPI.PROC_NULL, 9, [b, 1, halo_right], MPI.PROC_NULL, 9, st)
    check(st.Get_source() == MPI.PROC_NULL and (b == 5).all(), f"proc null {it}")

# the same array object resized: its new memory
g = np.zeros((N + 2) * (N + 2))
for it in range(3):
    if it == 2:
        g.resize(((N + 2) * (N + 2) + 64,), refcheck=False)
        g[:] = 0
    h = g[:(N + 2) * (N + 2)].reshape(N + 2, N + 2) if it < 2 else None
    c.Sendrecv(np.full(N, float(r + it)), down, 10, [g, 1, halo_right], up, 10)
    check((g[:(N + 2) ** 2].reshape(N + 2, N + 2)[1:-1, N + 1] == up + it).all(),
          f"resized {it}")

# a read-only receive array is refused as before (the parser's error)
ro = np.zeros((N + 2, N + 2))
ro.flags.writeable = False
try:
    c.Sendrecv([a, 1, col_left], down, 11, [ro, 1, halo_right], up, 11)
except Exception:
    ok = True
else:
    ok = False
check(ok, "read-only receive array")

# a freed datatype is refused, as the first time
t = sub([N, 1], [1, 1])
for it in range(2):
    c.Sendrecv([a, 1, t], down, 12, [b, 1, halo_right], up, 12)
t.Free()
try:
    c.Sendrecv([a, 1, t], down, 13, [b, 1, halo_right], up, 13)
except Exception:
    ok = True
else:
    ok = False
check(ok, "freed datatype")

for d in (row_top, row_bot, halo_top, halo_bot, col_left, col_right, halo_left, halo_right):
    d.Free()
done("sendrecv_packed")
