"""Docstrings of the MPI facade, in mpi4py's form.

Every public function of ``erdmampi.MPI`` and every public method of its
classes has a docstring whose first line is its signature (``Name(...)``,
added by erdmampi/_docsig.py), then a blank line and a text whose first line
is a sentence; class docstrings are sentences too.  mpi4py's own test suite
checks the same (its ``test_doc``); this keeps it from regressing here.
"""
import re
import types

import pytest

MPI = pytest.importorskip("erdmampi.MPI")

SIGNATURE = re.compile(r"^(\w+)\(.*\)( -> .+)?$")


def _text_problem(text):
    """What is wrong with the text of a docstring (None: nothing)."""
    if not text or not text.strip():
        return "no text"
    if text != text.strip():
        return "leading or trailing whitespace"
    summary = text.partition("\n")[0]
    if not summary[0].isupper() and summary[0] not in "`\"'(":
        return "the summary does not start with a capital"
    if summary[0] in "`\"'(" and summary.lstrip("`\"'(")[:1].islower():
        return "the summary does not start with a capital"
    if not summary.endswith("."):
        return "the summary line does not end with '.'"
    if not text.endswith("."):
        return "the text does not end with '.'"
    return None


def _function_problem(name, fn):
    doc = fn.__doc__
    if doc is None:
        return "no docstring"
    first, _, rest = doc.partition("\n")
    m = SIGNATURE.match(first)
    if not m or m.group(1) != name:
        return f"the first line is not a signature: {first!r}"
    if not rest.startswith("\n"):
        return "no blank line after the signature"
    return _text_problem(rest[1:])


def _classes():
    return [(name, obj) for name, obj in vars(MPI).items()
            if isinstance(obj, type) and not name.startswith("_")
            and obj.__module__.startswith("erdmampi")]


def _methods(cls):
    for name, attr in vars(cls).items():
        if isinstance(attr, (classmethod, staticmethod)):
            attr = attr.__func__
        if isinstance(attr, types.FunctionType) and not name.startswith("_"):
            yield name, attr


def test_module_functions():
    bad = {}
    for name, obj in vars(MPI).items():
        if isinstance(obj, types.FunctionType) and not name.startswith("_"):
            problem = _function_problem(obj.__name__, obj)
            if problem:
                bad[name] = problem
    assert not bad, bad


def test_class_docstrings():
    bad = {name: _text_problem(cls.__doc__ and cls.__doc__.strip())
           for name, cls in _classes()}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, bad


def test_methods():
    bad = {}
    for cname, cls in _classes():
        for name, fn in _methods(cls):
            problem = _function_problem(fn.__name__, fn)
            if problem:
                bad[f"{cname}.{name}"] = problem
    assert len(_docstrings_checked()) > 400
    assert not bad, bad


def _docstrings_checked():
    return [fn for _, cls in _classes() for _, fn in _methods(cls)]


def test_inherited_methods_signed():
    """A documented method a class gets from a base (its mixins: point to
    point, collectives, ...) has its signature line too."""
    bad = []
    for cname, cls in _classes():
        for name in dir(cls):
            if name.startswith("_") or name in vars(cls):
                continue
            fn = getattr(cls, name)
            fn = getattr(fn, "__func__", fn)
            if isinstance(fn, types.FunctionType) and fn.__doc__ and \
                    not SIGNATURE.match(fn.__doc__.partition("\n")[0]):
                bad.append(f"{cname}.{name}")
    assert not bad, bad


def test_namespace_holds_only_erdmampi_functions():
    """Python functions of other packages in the namespace would be walked
    by tools that walk it (mpi4py's documentation test), under their own
    names and docstrings."""
    foreign = [name for name, obj in vars(MPI).items()
               if isinstance(obj, types.FunctionType)
               and not obj.__module__.startswith("erdmampi")]
    assert not foreign, foreign
    assert not [name for name, obj in vars(MPI).items()
                if isinstance(obj, types.ModuleType)]


def test_signature_lines():
    assert MPI.Comm.Get_rank.__doc__.startswith("Get_rank(self)\n\n")
    assert MPI.Comm.Get_parent.__doc__.startswith("Get_parent(cls)\n\n")
    assert MPI.Intracomm.Scan.__doc__.startswith(
        "Scan(self, sendbuf, recvbuf, op=SUM)\n\n")
    assert MPI.Init_thread.__doc__.startswith("Init_thread(required=3)\n\n")
