import json
import pathlib
import pickle

import numpy as np
import pytest

from erdmampi import datatype as D
from erdmampi import exceptions as E

REF = json.loads((pathlib.Path(__file__).parent / "data" / "mpi4py_reference.json").read_text())
REF_TYPES = REF["datatypes"]
_LATE_NAMES = {"FLOAT16_T": "MPIX_C_FLOAT16"}


def test_every_mpi4py_datatype_name_exists():
    mpi4py_names = {n for n, v in REF["names"].items() if v["kind"] == "Datatype"}
    assert mpi4py_names == set(D.PREDEFINED)
    for name in mpi4py_names:
        assert isinstance(getattr(D, name), D.Datatype)


@pytest.mark.parametrize("name", sorted(REF_TYPES))
def test_predefined_matches_mpi4py(name):
    ref = REF_TYPES[name]
    dt = D.PREDEFINED[name]
    assert (dt == D.DATATYPE_NULL) == ref["null"]
    assert dt.typechar == ref["typechar"]
    assert dt.typestr == ref["typestr"]
    # MPICH names its float16 type only once the type is first used (the
    # reference was recorded before); mpi4py's own tests see the name
    assert dt.Get_name() == _LATE_NAMES.get(name, ref["mpi_name"])
    if ref["null"]:
        with pytest.raises(E.Exception) as info:
            dt.Get_size()
        assert info.value.Get_error_class() == E.ERR_TYPE
        with pytest.raises(ValueError):
            dt.tocode()
        return
    assert dt.Get_size() == dt.size == ref["size"]
    assert list(dt.Get_extent()) == ref["extent"]
    assert (dt.lb, dt.extent, dt.ub) == (ref["extent"][0], ref["extent"][1], sum(ref["extent"]))
    assert list(dt.Get_true_extent()) == ref["true_extent"]
    assert dt.is_predefined is ref["is_predefined"]
    if isinstance(ref["tocode"], dict):
        with pytest.raises(ValueError):
            dt.tocode()
    else:
        assert dt.tocode() == ref["tocode"]
    if dt.np_dtype is not None:
        assert dt.np_dtype.itemsize == dt.extent


def test_aliases_share_identity_like_mpi4py():
    # names with the same MPICH handle are equal; others differ
    for a in REF_TYPES:
        for b in REF_TYPES:
            same = REF_TYPES[a]["canonical"] == REF_TYPES[b]["canonical"]
            assert (D.PREDEFINED[a] == D.PREDEFINED[b]) == same, (a, b)


@pytest.mark.parametrize("table,ours", [
    ("typedict", D.TYPEDICT), ("typedict_c", D.TYPEDICT_C), ("typedict_f", D.TYPEDICT_F)])
def test_typedicts_match_mpi4py(table, ours):
    ref = REF[table]
    assert set(ours) == set(ref)
    for code, name in ref.items():
        assert ours[code] == D.PREDEFINED[name], code


def test_fromcode_tocode_roundtrip():
    for code, dt in D.TYPEDICT.items():
        assert D.Datatype.fromcode(code) == dt
    assert D.Datatype.fromcode(D.INT.tocode()) == D.INT
    with pytest.raises(ValueError):
        D.Datatype.fromcode("x")


def test_pair_dtypes_layout():
    for name, vtype in [("FLOAT_INT", "f4"), ("DOUBLE_INT", "f8"), ("LONG_INT", "i8"),
                        ("INT_INT", "i4"), ("SHORT_INT", "i2"), ("LONG_DOUBLE_INT", "g")]:
        dt = D.PREDEFINED[name]
        assert dt.np_dtype.names == ("value", "index")
        assert dt.np_dtype["value"] == np.dtype(vtype)
        assert dt.np_dtype["index"] == np.dtype("i4")
        assert dt.np_dtype.itemsize == dt.extent
        assert dt.np_dtype.fields["index"][1] + 4 == dt.true_extent or name == "SHORT_INT"
    for name in ("DATATYPE_NULL", "PACKED"):
        assert D.PREDEFINED[name].np_dtype is None


def test_unhashable_and_bool():
    with pytest.raises(TypeError):
        hash(D.INT)
    assert bool(D.INT) and not bool(D.DATATYPE_NULL)
    assert D.Datatype() == D.DATATYPE_NULL
    assert D.Datatype(D.INT) == D.INT
    assert D.INT != D.FLOAT and not (D.INT == 1)


def test_free_predefined_raises_err_type():
    for dt in (D.INT, D.DATATYPE_NULL):
        with pytest.raises(E.Exception) as info:
            dt.Free()
        assert info.value.Get_error_class() == E.ERR_TYPE
    assert D.INT.Commit() is D.INT
    D.INT.free()  # no-op on predefined


def test_dup_contiguous_free():
    d = D.DOUBLE.Dup()
    assert d != D.DOUBLE and d.size == 8 and d.name == ""
    assert d.typechar == "d" and d.tocode() == "d" and not d.is_predefined
    c = D.INT.Create_contiguous(3).Commit()
    assert (c.size, c.extent, c.Get_true_extent()) == (12, 12, (0, 12))
    assert (c.typechar, c.typestr, c.name) == ("V", "V12", "")
    assert c._elements(2) == 6 and c.np_dtype == np.dtype("i4")
    with pytest.raises(ValueError):
        c.tocode()
    c.Set_name("three ints")
    assert c.name == "three ints"
    cc = c.Create_contiguous(2)
    assert cc.size == 24 and cc._elements(1) == 6
    c.Free()
    assert c == D.DATATYPE_NULL
    with pytest.raises(E.Exception):
        c.Get_size()
    with pytest.raises(E.Exception) as info:
        D.INT.Create_contiguous(-1)
    assert info.value.Get_error_class() == E.ERR_COUNT
    assert D.INT.Create_contiguous(0).size == 0
    with pytest.raises(E.Exception):
        D.DATATYPE_NULL.Dup()


def test_set_name_on_predefined():
    old = D.INT.name
    try:
        D.INT.name = "x"
        assert D.INT.Get_name() == "x"
    finally:
        D.INT.Set_name(old)


def test_pickle_predefined_by_name():
    import erdmampi.datatype as mod
    assert pickle.loads(pickle.dumps(D.INT)) is D.INT
    assert D.INT.__reduce__() == "INT"
    assert mod.__name__ == D.INT.__class__.__module__


@pytest.mark.parametrize("key", sorted(k for k in REF["formats"] if k.startswith("numpy:")))
def test_from_numpy_matches_mpi4py(key):
    ref = REF["formats"][key]
    code = key.split(":", 1)[1]
    if code == "structured":
        dtype = np.dtype("f8,i4")
    elif len(code) == 1:
        dtype = np.dtype(code + ("8[s]" if code in "Mm" else "1" if code in "SU" else ""))
    else:
        dtype = np.dtype(code)
    if "error" in ref:
        with pytest.raises((KeyError, BufferError)):
            D.from_numpy(dtype)
        return
    assert D.from_numpy(dtype) == D.PREDEFINED[ref["datatype"]]


def test_from_numpy_pairs_and_from_format():
    assert D.from_numpy(D.DOUBLE_INT.np_dtype) == D.DOUBLE_INT
    assert D.from_format("<i") == D.INT
    assert D.from_format("@d") == D.DOUBLE
    assert D.from_format("Zf") == D.C_FLOAT_COMPLEX
    assert D.from_format("c") == D.CHAR and D.from_format("?") == D.C_BOOL
    with pytest.raises(BufferError):
        D.from_format(">i")
    with pytest.raises(KeyError):
        D.from_format("T{d:i}")


def test_against_live_mpi4py():
    MPI = pytest.importorskip("mpi4py.MPI")
    for name, dt in D.PREDEFINED.items():
        ref = getattr(MPI, name)
        assert (dt == D.DATATYPE_NULL) == (ref == MPI.DATATYPE_NULL)
        if dt:
            assert (dt.size, dt.Get_extent(), dt.typestr) == (ref.size, ref.Get_extent(), ref.typestr)
