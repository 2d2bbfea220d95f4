import json
import pathlib

import pytest

from erdmampi import exceptions as E

REF = json.loads((pathlib.Path(__file__).parent / "data" / "mpi4py_reference.json").read_text())


def test_every_error_name_has_mpi4py_value():
    expected = {k: v["value"] for k, v in REF["errors"].items()}
    assert E.ERROR_NAMES == expected
    for name, value in expected.items():
        assert getattr(E, name) == value


@pytest.mark.parametrize("name", sorted(REF["errors"]))
def test_error_class_and_string_match_mpich(name):
    entry = REF["errors"][name]
    if entry["value"] == E.ERR_LASTCODE:
        return  # MPICH returns garbage for these
    assert E.Get_error_class(entry["value"]) == entry["class"]
    assert E.Get_error_string(entry["value"]) == entry["string"]


def test_exception_behaves_like_mpi4py():
    exc = E.Exception(E.ERR_COMM)
    assert isinstance(exc, RuntimeError)
    assert int(exc) == 5 and exc == 5 and exc != 4 and hash(exc) == hash(5)
    assert exc.Get_error_code() == exc.error_code == 5
    assert exc.Get_error_class() == exc.error_class == E.ERR_COMM
    assert exc.Get_error_string() == exc.error_string == "Invalid communicator"
    assert str(exc) == "Invalid communicator"
    assert repr(exc) == "MPI.Exception(5)"
    assert exc < 6 and exc <= 5 and exc > 4 and exc >= 5
    assert bool(exc) and not bool(E.Exception(E.SUCCESS))
    assert int(E.Exception(-3)) == E.ERR_UNKNOWN
    assert E.MPIException is E.Exception


def test_exception_detail_message_keeps_code():
    exc = E.Exception(E.ERR_TRUNCATE, "got 8 bytes, buffer holds 4")
    assert exc.args[0] == E.ERR_TRUNCATE and int(exc) == 14
    assert str(exc) == "Message truncated, got 8 bytes, buffer holds 4"


def test_raise_error():
    with pytest.raises(E.Exception) as info:
        E.raise_error(E.ERR_RANK, "rank 7 out of range")
    assert info.value.Get_error_class() == E.ERR_RANK
    assert "rank 7" in str(info.value)


def test_error_class_masks_codes_like_mpich():
    assert E.Get_error_class(1000) == 1000 & 0x7F
    with pytest.raises(E.Exception) as info:
        E.Get_error_class(-1)
    assert info.value.Get_error_class() == E.ERR_ARG
    assert E.Get_error_string(70) == "Unknown error class"


def test_against_live_mpi4py():
    MPI = pytest.importorskip("mpi4py.MPI")
    for name, value in E.ERROR_NAMES.items():
        assert getattr(MPI, name) == value
    for code in range(0, 62):
        assert E.Get_error_class(code) == MPI.Get_error_class(code)
        assert E.Get_error_string(code) == MPI.Get_error_string(code)
    assert str(E.Exception(E.ERR_OP)) == str(MPI.Exception(MPI.ERR_OP))
