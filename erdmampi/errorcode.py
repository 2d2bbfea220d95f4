"""User error classes, codes and strings (MPI_Add_error_class & co.).

Codes follow MPICH's layout: a user class or code has bit 30 set (beyond
``ERR_LASTCODE``), so it never collides with a predefined class.  A class
can be removed only once its codes and its string are gone; a code only
once its string is gone (MPI 4.1).
"""

import threading

from . import exceptions as _exc

__all__ = ["Add_error_class", "Add_error_code", "Add_error_string",
           "Remove_error_class", "Remove_error_code", "Remove_error_string",
           "last_used_code", "user_class", "user_string"]

_DYN = 0x40000000
_lock = threading.Lock()
_classes = {}       # class -> string
_codes = {}         # code -> [class, string]
_next = [1]
_last = [_exc.ERR_LASTCODE]


def _new_code():
    code = _DYN | _next[0]
    _next[0] += 1
    _last[0] = max(_last[0], code)
    return code


def last_used_code():
    """MPI_LASTUSEDCODE: the largest code in use."""
    return _last[0]


def user_class(code):
    """The class of a user class or code, None for any other value."""
    if code in _classes:
        return code
    entry = _codes.get(code)
    return entry[0] if entry else None


def user_string(code):
    """The string of a user class or code ("" unset), None if not one."""
    if code in _classes:
        return _classes[code]
    entry = _codes.get(code)
    return entry[1] if entry else None


def Add_error_class():
    """A new error class."""
    with _lock:
        code = _new_code()
        _classes[code] = ""
    return code


def Add_error_code(errorclass):
    """A new error code in ``errorclass``."""
    errorclass = int(errorclass)
    with _lock:
        if errorclass not in _classes and not 0 <= errorclass <= _exc.ERR_LASTCODE:
            _exc.raise_error(_exc.ERR_ARG, f"invalid error class {errorclass}")
        code = _new_code()
        _codes[code] = [errorclass, ""]
    return code


def Add_error_string(errorcode, string):
    """Attach ``string`` to a user class or code."""
    errorcode, string = int(errorcode), str(string)
    with _lock:
        if errorcode in _classes:
            _classes[errorcode] = string
        elif errorcode in _codes:
            _codes[errorcode][1] = string
        else:
            _exc.raise_error(_exc.ERR_ARG, f"{errorcode} is not a user error class or code")


def Remove_error_class(errorclass):
    """Remove a user error class that has no string and no codes left."""
    errorclass = int(errorclass)
    with _lock:
        if errorclass not in _classes:
            _exc.raise_error(_exc.ERR_ARG, f"{errorclass} is not a user error class")
        if _classes[errorclass] or any(c == errorclass for c, _ in _codes.values()):
            _exc.raise_error(_exc.ERR_ARG, "error class still has a string or codes")
        del _classes[errorclass]


def Remove_error_code(errorcode):
    """Remove a user error code that has no string left."""
    errorcode = int(errorcode)
    with _lock:
        if errorcode not in _codes:
            _exc.raise_error(_exc.ERR_ARG, f"{errorcode} is not a user error code")
        if _codes[errorcode][1]:
            _exc.raise_error(_exc.ERR_ARG, "error code still has a string")
        del _codes[errorcode]


def Remove_error_string(errorcode):
    """Remove the string of a user error class or code."""
    errorcode = int(errorcode)
    with _lock:
        if errorcode in _classes:
            _classes[errorcode] = ""
        elif errorcode in _codes:
            _codes[errorcode][1] = ""
        else:
            _exc.raise_error(_exc.ERR_ARG, f"{errorcode} is not a user error class or code")
