import json
import math
import pathlib
import pickle

import numpy as np
import pytest

from erdmampi import datatype as D
from erdmampi import exceptions as E
from erdmampi import op as O

REF = json.loads((pathlib.Path(__file__).parent / "data" / "mpi4py_reference.json").read_text())
OPS = ["MAX", "MIN", "SUM", "PROD", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR",
       "MAXLOC", "MINLOC"]


def test_predefined_ops_match_mpi4py():
    names = {n for n, v in REF["names"].items() if v["kind"] == "Op"}
    assert names == set(O.PREDEFINED_OPS)
    for name, ref in REF["ops"].items():
        op = O.PREDEFINED_OPS[name]
        assert bool(op) is not ref["null"]
        assert op.is_predefined
        if ref["null"]:
            with pytest.raises(E.Exception) as info:
                op.Is_commutative()
            assert info.value.Get_error_class() == E.ERR_OP
        else:
            assert op.Is_commutative() is ref["commutative"]


def _matrix_cases():
    for key, ref in sorted(REF["op_matrix"].items()):
        opname, dtname = key.split(":")
        if "abort" in ref:  # MPICH asserts; we define these (see below)
            continue
        yield key, opname, dtname, ref


@pytest.mark.parametrize("key,opname,dtname,ref", list(_matrix_cases()),
                         ids=[c[0] for c in _matrix_cases()])
def test_validity_matches_mpich(key, opname, dtname, ref):
    op = O.PREDEFINED_OPS[opname]
    dt = D.PREDEFINED[dtname]
    n = max(1, 32 // dt.extent)
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, n * dt.extent, dtype=np.uint8)
    b = rng.integers(0, 256, n * dt.extent, dtype=np.uint8)
    if ref.get("ok"):
        op.Reduce_local([a, n, dt], [b, n, dt])
    else:
        with pytest.raises(E.Exception) as info:
            op.Reduce_local([a, n, dt], [b, n, dt])
        assert info.value.Get_error_class() == ref["error_class"]


def test_ops_mpich_aborts_on_are_defined_here():
    # MPICH 4.0 aborts on float16 and on LAND/LOR over C floats; we compute them
    x = np.array([0.0, 1.5, -2.0], "f8")
    y = np.array([3.0, 0.0, 4.0], "f8")
    O.LAND._apply(x, y, D.DOUBLE)
    assert y.tolist() == [0.0, 0.0, 1.0]
    h = np.array([1, 2], "f2")
    k = np.array([3, 5], "f2")
    O.SUM._apply(h, k, D.FLOAT16_T)
    assert k.tolist() == [4.0, 7.0]


NUMERIC = ["SIGNED_CHAR", "SHORT", "INT", "LONG", "LONG_LONG", "UNSIGNED_CHAR",
           "UNSIGNED_SHORT", "UNSIGNED", "UNSIGNED_LONG", "UNSIGNED_LONG_LONG",
           "FLOAT", "DOUBLE", "LONG_DOUBLE", "C_BOOL", "C_DOUBLE_COMPLEX", "BYTE",
           "INT8_T", "UINT64_T", "CHAR", "LOGICAL", "AINT"]


def _sample(dt, n, seed):
    rng = np.random.default_rng(seed)
    nd = dt.np_dtype
    if nd.kind == "b":
        return rng.integers(0, 2, n).astype(bool)
    if nd.kind in "iu":
        info = np.iinfo(nd)
        return rng.integers(max(info.min, -100), min(info.max, 100), n).astype(nd)
    if nd.kind == "c":
        return (rng.normal(size=n) + 1j * rng.normal(size=n)).astype(nd)
    if nd.kind == "S":
        return rng.integers(-100, 100, n).astype("i1").view("S1")
    return rng.normal(size=n).astype(nd)


def test_results_match_live_mpi4py():
    MPI = pytest.importorskip("mpi4py.MPI")
    checked = 0
    for dtname in NUMERIC:
        dt = D.PREDEFINED[dtname]
        for opname in OPS[:10]:
            key = f"{opname}:{REF['datatypes'][dtname]['canonical']}"
            if not REF["op_matrix"].get(key, {}).get("ok"):
                continue
            a = _sample(dt, 17, 1)
            b = _sample(dt, 17, 2)
            ours, theirs = b.copy(), b.copy()
            O.PREDEFINED_OPS[opname].Reduce_local([a, getattr(D, dtname)], [ours, dt])
            getattr(MPI, opname).Reduce_local([a, getattr(MPI, dtname)],
                                              [theirs, getattr(MPI, dtname)])
            if dt.np_dtype.char in "gG":  # padding bytes of x87 long double differ
                np.testing.assert_array_equal(ours, theirs, err_msg=key)
            elif dt.np_dtype.kind == "c":  # complex product: 1-ulp rounding differences
                np.testing.assert_allclose(ours, theirs, rtol=1e-14, err_msg=key)
            else:
                assert ours.tobytes() == theirs.tobytes(), key
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("pair", ["SHORT_INT", "INT_INT", "LONG_INT", "FLOAT_INT",
                                  "DOUBLE_INT", "LONG_DOUBLE_INT"])
def test_maxloc_minloc_tie_rule_and_live(pair):
    dt = D.PREDEFINED[pair]
    a = np.zeros(5, dt.np_dtype)
    b = np.zeros(5, dt.np_dtype)
    a["value"] = [1, 5, 3, 3, 2]
    a["index"] = [0, 1, 9, 2, 7]
    b["value"] = [2, 5, 3, 3, 1]
    b["index"] = [4, 0, 1, 8, 3]
    mx, mn = b.copy(), b.copy()
    O.MAXLOC._apply(a, mx, dt)
    O.MINLOC._apply(a, mn, dt)
    assert mx["value"].tolist() == [2, 5, 3, 3, 2]
    assert mx["index"].tolist() == [4, 0, 1, 2, 7]
    assert mn["value"].tolist() == [1, 5, 3, 3, 1]
    assert mn["index"].tolist() == [0, 0, 1, 2, 3]
    try:
        from mpi4py import MPI
    except ImportError:
        return
    for ours, name in ((mx, "MAXLOC"), (mn, "MINLOC")):
        theirs = b.copy()
        getattr(MPI, name).Reduce_local([a, getattr(MPI, pair)], [theirs, getattr(MPI, pair)])
        assert theirs["value"].tolist() == ours["value"].tolist()
        assert theirs["index"].tolist() == ours["index"].tolist()


def test_max_nan_rule_matches_mpich():
    a = np.array([np.nan, 1.0, 2.0])
    b = np.array([1.0, np.nan, 1.0])
    O.MAX._apply(a, b, D.DOUBLE)
    assert math.isnan(b[0]) and b[1:].tolist() == [1.0, 2.0]


def test_invalid_pairs_raise_err_op():
    with pytest.raises(E.Exception) as info:
        O.BAND._apply(np.ones(2), np.ones(2), D.DOUBLE)
    assert info.value.Get_error_class() == E.ERR_OP
    with pytest.raises(E.Exception):
        O.MAXLOC._apply(np.ones(2, "i4"), np.ones(2, "i4"), D.INT)
    with pytest.raises(E.Exception):
        O.OP_NULL._apply(np.ones(2), np.ones(2), D.DOUBLE)
    with pytest.raises(E.Exception) as info:
        O.SUM._apply(np.ones(2), np.ones(2), D.DATATYPE_NULL)
    assert info.value.Get_error_class() == E.ERR_TYPE
    for op in (O.REPLACE, O.NO_OP):
        with pytest.raises(E.Exception) as info:
            op.Reduce_local(np.ones(2), np.ones(2))
        assert info.value.Get_error_class() == E.ERR_OP


def test_apply_reinterprets_bytes_and_derived_types():
    a = np.arange(6, dtype="i4")
    b = np.ones(6, dtype="i4")
    raw = b.view(np.uint8)
    O.SUM._apply(a.view(np.uint8), raw, D.INT.Create_contiguous(3))
    assert b.tolist() == [1, 2, 3, 4, 5, 6]
    O.REPLACE._apply(a, b, D.INT)
    assert b.tolist() == a.tolist()
    O.NO_OP._apply(np.zeros(6, "i4"), b, D.INT)
    assert b.tolist() == a.tolist()


def test_python_object_form_matches_mpi4py_rules():
    assert O.SUM(2, 3) == 5 and O.PROD(2, 3) == 6
    assert O.MAX(1, 2) == 2 and O.MIN(1, 2) == 1
    assert O.LAND(2, 3) is True and O.LOR(0, 0) is False and O.LXOR(1, 1) is False
    assert O.BAND(6, 3) == 2 and O.BOR(6, 3) == 7 and O.BXOR(6, 3) == 5
    assert O.MAXLOC((1, 5), (1, 3)) == (1, 3)
    assert O.MAXLOC((1, 5), (2, 3)) == (2, 3)
    assert O.MINLOC((1, 2), (1, 3)) == (1, 2)
    assert O.REPLACE(1, 2) == 2 and O.NO_OP(1, 2) == 1
    assert math.isnan(O.MAX(float("nan"), 1.0)) and O.MAX(1.0, float("nan")) == 1.0
    assert O.SUM._py([1], [2]) == [1, 2]
    with pytest.raises(ValueError):
        O.OP_NULL(1, 2)


def test_user_op_create_call_free():
    calls = []

    def concat(x, y, dt):
        calls.append(dt)
        return x + y

    op = O.Op.Create(concat)
    assert op(1, 2) == 3 and calls == [None]
    assert op.Is_commutative() is False and not op.is_predefined and bool(op)
    assert O.Op.Create(concat, commute=True).is_commutative is True
    op.Free()
    assert op == O.OP_NULL and not op
    with pytest.raises(ValueError):
        op(1, 2)
    with pytest.raises(AttributeError):
        O.Op.Create(5)
    for pre in (O.SUM, O.OP_NULL):
        with pytest.raises(E.Exception) as info:
            pre.Free()
        assert info.value.Get_error_class() == E.ERR_OP


def test_user_op_argument_order_non_commutative():
    # inoutbuf = inbuf op inoutbuf with "op" = string-like concatenation
    def first_then_second(inbuf, inoutbuf, dt):
        a = np.frombuffer(inbuf, dtype="i8")
        b = np.frombuffer(inoutbuf, dtype="i8")
        b[:] = a * 10 + b

    op = O.Op.Create(first_then_second)
    acc = np.array([3, 4], "i8")
    op._apply(np.array([1, 2], "i8"), acc, D.INT64_T)
    assert acc.tolist() == [13, 24]
    acc = np.array([3, 4], "i8")
    op.Reduce_local(np.array([1, 2], "i8"), acc)
    assert acc.tolist() == [13, 24]
    seen = []
    O.Op.Create(lambda a, b, dt: seen.append((len(a), dt))).Reduce_local(
        np.ones(3), np.ones(3))
    assert seen[0][0] == 24 and seen[0][1] == D.DOUBLE


def test_unhashable_and_pickle():
    with pytest.raises(TypeError):
        hash(O.SUM)
    assert O.Op() == O.OP_NULL and O.Op(O.SUM) == O.SUM
    assert pickle.loads(pickle.dumps(O.SUM)) is O.SUM


def test_reduce_local_mismatch_errors_like_mpi4py():
    with pytest.raises(ValueError, match="mismatch in send count 3 and receive count 2"):
        O.SUM.Reduce_local(np.ones(3, "i4"), [np.ones(3, "i4"), 2, D.INT])
    with pytest.raises(ValueError, match="datatypes"):
        O.SUM.Reduce_local([np.ones(3, "i4"), D.INT], [np.ones(3, "f4"), D.FLOAT])
