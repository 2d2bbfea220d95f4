"""Signature lines for the docstrings of ``erdmampi.MPI``.

As in mpi4py (whose functions are compiled, so ``inspect`` cannot see their
parameters), the first line of the docstring of every function and method of
the ``MPI`` module is its signature, ``Get_rank(self) -> int``, followed by a
blank line and the text.  erdmampi's docstrings hold the text only: ``sign``
prepends the line, computed from the function's code object, once, when the
``MPI`` module is built.  Sphinx's autodoc (``autodoc_docstring_signature``)
takes the line as the signature it shows and drops it from the text.
"""

_VARARGS = 0x04
_VARKEYWORDS = 0x08
_PLAIN = (int, float, str, bytes, bool, type(None))

SIGNED = {}     # function -> its docstring before ``sign``


def _annotation(ann):
    if isinstance(ann, str):
        return ann
    if isinstance(ann, type):
        return ann.__name__ if ann.__module__ != "typing" else repr(ann)
    return repr(ann).replace("typing.", "")


def _default(value, names):
    if not isinstance(value, _PLAIN):
        name = names.get(id(value))
        if name is not None:
            return name
    text = repr(value)
    if "\n" in text or len(text) > 60 or text.startswith("<"):
        return "..."
    return text


def _param(name, anns, value, names, empty):
    ann = anns.get(name, empty)
    text = name if ann is empty else f"{name}: {_annotation(ann)}"
    if value is empty:
        return text
    return f"{text} = {_default(value, names)}" if ann is not empty \
        else f"{text}={_default(value, names)}"


def signature(name, fn, names=None):
    """``name(params) -> ret`` of a Python function; ``name(...)`` if its
    parameters cannot be read."""
    names = names or {}
    try:
        code = fn.__code__
        anns = getattr(fn, "__annotations__", None) or {}
        empty = signature
        varnames = code.co_varnames
        nargs, nkw = code.co_argcount, code.co_kwonlyargcount
        defaults = fn.__defaults__ or ()
        kwdefaults = fn.__kwdefaults__ or {}
        first = nargs - len(defaults)
        parts = []
        for i in range(nargs):
            value = defaults[i - first] if i >= first else empty
            parts.append(_param(varnames[i], anns, value, names, empty))
            if i == code.co_posonlyargcount - 1:
                parts.append("/")
        extra = nargs + nkw
        if code.co_flags & _VARARGS:
            parts.append("*" + varnames[extra])
            extra += 1
        elif nkw:
            parts.append("*")
        for i in range(nargs, nargs + nkw):
            kw = varnames[i]
            parts.append(_param(kw, anns, kwdefaults.get(kw, empty), names, empty))
        if code.co_flags & _VARKEYWORDS:
            parts.append("**" + varnames[extra])
        line = f"{name}({', '.join(parts)})"
        if "return" in anns:
            line += f" -> {_annotation(anns['return'])}"
        return line
    except Exception:  # noqa: BLE001 -- a signature line is best effort
        return f"{name}(...)"


def has_signature(name, doc):
    """Whether ``doc`` starts with a ``name(...)`` line."""
    return doc.startswith(name + "(") and ")" in doc.partition("\n")[0]


def _sign_function(fn, names, done):
    if id(fn) in done:
        return
    done.add(id(fn))
    name = fn.__name__
    doc = fn.__doc__
    if not doc or has_signature(name, doc):
        return
    if getattr(fn, "_erdma_unsupported", False):
        sig = f"{name}(...)"
    else:
        sig = signature(name, fn, names)
    SIGNED[fn] = doc
    fn.__doc__ = f"{sig}\n\n{_clean(doc)}"


def _clean(doc):
    """The text of a docstring, its continuation lines dedented."""
    first, nl, rest = doc.strip().partition("\n")
    if not nl:
        return first
    lines = rest.split("\n")
    indent = min((len(ln) - len(ln.lstrip()) for ln in lines if ln.strip()), default=0)
    return "\n".join([first] + [ln[indent:].rstrip() for ln in lines])


def unsign():
    """Give back the docstrings ``sign`` changed.

    The documentation build calls it: autodoc then shows the signatures it
    reads from the code, with the names of the constants used as defaults.
    """
    for fn, doc in SIGNED.items():
        fn.__doc__ = doc
    SIGNED.clear()


def sign(namespace):
    """Prepend signature lines to the docstrings of a module namespace.

    Those of its functions and of the methods of its classes and their
    bases, erdmampi's own only; the docstrings that have no text or
    already start with a signature are left as they are.  Class docstrings
    lose the indentation of their closing quotes.
    """
    names = {id(v): k for k, v in namespace.items()
             if not k.startswith("_") and k.isupper() and not isinstance(v, _PLAIN)}
    done = set()
    seen = set()
    for value in list(namespace.values()):
        if isinstance(value, type):
            if value in seen or not value.__module__.startswith("erdmampi"):
                continue
            seen.add(value)
            doc = value.__doc__
            if doc and not doc.startswith("\n") and doc != doc.rstrip():
                try:    # a docstring's last line: the closing quotes' indent
                    value.__doc__ = _clean(doc)
                except (AttributeError, TypeError):
                    pass
            for klass in value.__mro__:     # the methods of its mixins too
                if klass in seen and klass is not value:
                    continue
                for attr in vars(klass).values():
                    if isinstance(attr, (classmethod, staticmethod)):
                        attr = attr.__func__
                    if hasattr(attr, "__code__") and \
                            (attr.__module__ or "").startswith("erdmampi"):
                        _sign_function(attr, names, done)
        elif hasattr(value, "__code__") and \
                (getattr(value, "__module__", None) or "").startswith("erdmampi"):
            _sign_function(value, names, done)
