"""Comm's one-call methods in C (erdma_pyfast.c, "methods"): the same
behaviour as the Python methods they replace, by every route of calling
(tests/scripts/comm_methods.py), calls written as programs write them (a
new [array, datatype] list or a new array every call take the one-call
path: tests/scripts/new_arrays.py), both also run against mpi4py, and a C
method that takes only what it can check."""
import shutil
import subprocess
import sys

import pytest

from _ranks import assert_ok, run_script, run_script_mpi4py


SCRIPTS = ["comm_methods.py", "new_arrays.py"]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_comm_methods_by_every_route(script, nprocs):
    assert_ok(run_script(script, nprocs), script, nprocs)


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec")
@pytest.mark.parametrize("script,nprocs", [("comm_methods.py", 2), ("new_arrays.py", 3)])
def test_comm_methods_script_holds_for_mpi4py(script, nprocs):
    pytest.importorskip("mpi4py")
    assert_ok(run_script_mpi4py(script, nprocs), script, nprocs)


def _python(code):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_c_methods_carry_the_python_ones_docstrings():
    out = _python("""
from erdmampi import MPI
from erdmampi import comm
from erdmampi._engine import fast
assert fast is not None
for name in comm._C_METHODS:
    m = getattr(MPI.Comm, name)
    py = getattr(MPI.Comm, "_py_" + name)
    assert type(m).__name__ == "method_descriptor", (name, type(m))
    assert m.__doc__ == py.__doc__, name
    assert m.__name__ == name and m.__qualname__ == "Comm." + name
    assert getattr(MPI.Intracomm, name) is m, name
# the inter-communicator's collectives are its own
assert MPI.Intercomm.Bcast is not MPI.Comm.Bcast
assert MPI.Comm.Send.__doc__.startswith("Send(self, buf")
print("ok")
""")
    assert out.strip() == "ok"


def test_c_methods_setup_refuses_what_it_cannot_use():
    out = _python("""
import pickle
from erdmampi import MPI
from erdmampi._engine import fast
from erdmampi._membuf import handle
# cls, slot, fast, nmin, nmax, none_mask, defaults, order, more, full, name, doc,
# extra, result, names: valid but for the one item changed
GOOD = [MPI.Comm, 19, "send", 2, 3, 0, (0,), (0, 1, 2), "a", "b", "X", None, 0, 0,
        ("buf", "dest", "tag")]
def refused(exc, i, value):
    args = list(GOOD)
    if i is None:
        args = args[:3]
    else:
        args[i] = value
    try:
        fast.method(*args)
    except exc:
        return True
    return False
ok = [
    refused(TypeError, None, None),             # too few arguments
    refused(TypeError, 0, int),                 # not a handle class
    refused(ValueError, 1, 0),                  # a slot in use
    refused(TypeError, 1, 20),                  # no such slot
    refused(ValueError, 2, "nosuch"),           # no such fast call
    refused(ValueError, 7, (0, 1, 5)),          # argument 5 of 3
    refused(ValueError, 7, (-1,)),              # no constant
    refused(TypeError, 6, ()),                  # a default missing
    refused(TypeError, 5, 8),                   # None-mask past the arguments
    refused(TypeError, 12, 5),                  # no such extra argument
    refused(TypeError, 13, 3),                  # no such result
    refused(TypeError, 14, ("buf", "dest")),    # a name missing
]
try:
    fast.setup(handle, 24, [], len, pickle.loads, MPI.Request, MPI.Status)
except ValueError:
    ok.append(True)
print(ok)
""")
    assert out.strip() == str([True] * 13)


def test_requests_freed_by_the_user_are_reaped_by_the_c_methods():
    # a freed request still pending in the engine waits in _engine._deferred;
    # the Python Send reaped that list before sending, and so does the C one,
    # then stays on the fast path; keywords stay there too
    out = _python("""
import numpy as np
from erdmampi import MPI, _engine
c = MPI.COMM_SELF
a, b = np.arange(3.0), np.zeros(3)
calls = []
py = MPI.Comm._py_Send
def spy(self, *args, **kw):
    calls.append(args)
    return py(self, *args, **kw)
MPI.Comm._py_Send = spy
for _ in range(3):
    rq = c.Irecv(b, 0, 1)
    c.Send(a, 0, 1)
    rq.Wait()
    rq = c.Irecv(b, 0, 1)
    c.Send(tag=1, buf=a, dest=0)
    rq.Wait()
freed = []
_engine._deferred.append(type("Fake", (), {"free": lambda self: freed.append(1)})())
rq = c.Irecv(b, 0, 2)
c.Send(a, 0, 2)
rq.Wait()
assert calls == [] and freed == [1] and not _engine._deferred, (calls, freed)
assert np.array_equal(a, b)
rq = c.Irecv(b, 0, 1)
try:
    c.Send(a, 0, dest=0)
except TypeError:
    pass
else:
    raise AssertionError("no TypeError for dest given twice")
assert len(calls) == 1
rq.Cancel()
rq.Wait()
print("ok")
""")
    assert out.strip() == "ok"
