"""One-sided communication (Win), file I/O (File) and sessions."""
import numpy as np
import pytest

from harness import run_mpi

MPI = pytest.importorskip("erdmampi.MPI")


def err(fn, *args):
    with pytest.raises(MPI.Exception) as info:
        fn(*args)
    return info.value.Get_error_class()


def test_null_objects():
    for null, cls in ((MPI.WIN_NULL, MPI.Win), (MPI.FILE_NULL, MPI.File),
                      (MPI.SESSION_NULL, MPI.Session)):
        assert not null and cls() == null and cls() is not null
        assert cls.fromhandle(null.handle) == null
        assert cls.f2py(null.py2f()) == null
        with pytest.raises(TypeError):
            hash(null)
        with pytest.raises(TypeError):
            cls(1234)
    assert MPI.WIN_NULL.handle == 0x20000000 and MPI.FILE_NULL.handle == 0
    assert err(MPI.WIN_NULL.Fence) == MPI.ERR_WIN
    assert err(MPI.SESSION_NULL.Get_num_psets) == MPI.ERR_SESSION
    assert MPI.WIN_NULL.Get_name() == "MPI_WIN_NULL"


def test_win_self():
    mem = MPI.Alloc_mem(64)
    mem[:] = 0
    win = MPI.Win.Create(mem, 1, MPI.INFO_NULL, MPI.COMM_SELF)
    assert win.attrs == (MPI.Get_address(mem), 64, 1)
    assert win.Get_attr(MPI.WIN_CREATE_FLAVOR) == MPI.WIN_FLAVOR_CREATE
    win.Fence()
    win.Put(np.arange(4, dtype="i"), 0)
    win.Accumulate(np.ones(4, dtype="i"), 0, op=MPI.SUM)
    win.Fence()
    out = np.zeros(4, dtype="i")
    win.Get(out, 0)
    win.Fence()
    assert out.tolist() == [1, 2, 3, 4]
    res = np.zeros(1, dtype="i")
    win.Lock(0)
    win.Fetch_and_op(np.array([10], "i"), res, 0, 0, MPI.SUM)
    win.Unlock(0)
    assert res[0] == 1 and np.frombuffer(mem, "i")[0] == 11
    assert err(win.Put, np.zeros(1), 3) == MPI.ERR_RANK
    win.Free()
    assert not win


def test_file_self(tmp_path):
    path = tmp_path / "data.bin"
    f = MPI.File.Open(MPI.COMM_SELF, path, MPI.MODE_CREATE | MPI.MODE_RDWR)
    f.Set_view(0, MPI.INT)
    f.Write(np.arange(5, dtype="i"))
    assert f.Get_position() == 5 and f.Get_size() == 20
    out = np.zeros(3, dtype="i")
    f.Read_at(2, out)
    assert out.tolist() == [2, 3, 4]
    f.Close()
    MPI.File.Delete(path)
    assert err(MPI.File.Open, MPI.COMM_SELF, path) == MPI.ERR_NO_SUCH_FILE


def test_session():
    s = MPI.Session.Init()
    assert [s.Get_nth_pset(i) for i in range(s.Get_num_psets())] == \
        ["mpi://WORLD", "mpi://SELF"]
    assert s.Create_group("mpi://SELF").Get_size() == 1
    assert err(s.Get_pset_info, "nope") == MPI.ERR_ARG
    s.Finalize()
    assert not s


@pytest.mark.parametrize("nprocs", [2, 3])
def test_win_passive_target_and_shared(nprocs):
    script = """
import numpy as np
from erdmampi import MPI
c = MPI.COMM_WORLD
win = MPI.Win.Allocate(8, 8, MPI.INFO_NULL, c)
np.frombuffer(win.tomemory(), "q")[:] = 0
c.Barrier()
one = np.ones(1, "q")
old = np.zeros(1, "q")
for _ in range(20):                 # atomic counter on rank 0
    win.Lock(0, MPI.LOCK_SHARED)
    win.Fetch_and_op(one, old, 0, 0, MPI.SUM)
    win.Unlock(0)
c.Barrier()
if c.rank == 0:
    assert np.frombuffer(win.tomemory(), "q")[0] == 20 * c.size
win.Free()
shm = MPI.Win.Allocate_shared(4, 1, MPI.INFO_NULL, c)
mem = shm.tomemory()
mem[:] = c.rank + 1
c.Barrier()
peer, _ = shm.Shared_query((c.rank + 1) % c.size)
assert bytes(peer) == bytes([(c.rank + 1) % c.size + 1]) * 4
c.Barrier()
shm.Free()
print("ok", c.rank)
"""
    p = run_mpi(nprocs, script, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("ok") == nprocs
