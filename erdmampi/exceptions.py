"""MPI error classes and the ``MPI.Exception`` type.

Error class values are MPICH's (as exposed by mpi4py built against MPICH 4.0),
so programs that compare ``exc.Get_error_class()`` with ``MPI.ERR_*`` behave
the same under erdmampi and mpi4py.  Error codes are error classes here: this
layer never creates codes with extra bits, but ``Get_error_class`` masks codes
the way MPICH does (the class lives in the low 7 bits).
"""

__all__ = [
    "Exception",
    "MPIException",
    "Get_error_class",
    "Get_error_string",
    "raise_error",
    "ERROR_NAMES",
]

# -----------------------------------------------------------------------------
# Error classes (MPICH values)

SUCCESS = 0
ERR_BUFFER = 1
ERR_COUNT = 2
ERR_TYPE = 3
ERR_TAG = 4
ERR_COMM = 5
ERR_RANK = 6
ERR_ROOT = 7
ERR_GROUP = 8
ERR_OP = 9
ERR_TOPOLOGY = 10
ERR_DIMS = 11
ERR_ARG = 12
ERR_UNKNOWN = 13
ERR_TRUNCATE = 14
ERR_OTHER = 15
ERR_INTERN = 16
ERR_IN_STATUS = 17
ERR_PENDING = 18
ERR_REQUEST = 19
ERR_ACCESS = 20
ERR_AMODE = 21
ERR_BAD_FILE = 22
ERR_CONVERSION = 23
ERR_DUP_DATAREP = 24
ERR_FILE_EXISTS = 25
ERR_FILE_IN_USE = 26
ERR_FILE = 27
ERR_INFO = 28
ERR_INFO_KEY = 29
ERR_INFO_VALUE = 30
ERR_INFO_NOKEY = 31
ERR_IO = 32
ERR_NAME = 33
ERR_NO_MEM = 34
ERR_NOT_SAME = 35
ERR_NO_SPACE = 36
ERR_NO_SUCH_FILE = 37
ERR_PORT = 38
ERR_QUOTA = 39
ERR_READ_ONLY = 40
ERR_SERVICE = 41
ERR_SPAWN = 42
ERR_UNSUPPORTED_DATAREP = 43
ERR_UNSUPPORTED_OPERATION = 44
ERR_WIN = 45
ERR_BASE = 46
ERR_LOCKTYPE = 47
ERR_KEYVAL = 48
ERR_RMA_CONFLICT = 49
ERR_RMA_SYNC = 50
ERR_SIZE = 51
ERR_DISP = 52
ERR_ASSERT = 53
ERR_RMA_RANGE = 55
ERR_RMA_ATTACH = 56
ERR_RMA_SHARED = 57
ERR_RMA_FLAVOR = 58
ERR_SESSION = 75
ERR_PROC_ABORTED = 76
ERR_VALUE_TOO_LARGE = 77
ERR_LASTCODE = 0x3FFFFFFF
# mpi4py gives these the values below when built against MPICH 4.0
ERR_ABI = ERR_LASTCODE
ERR_ERRHANDLER = ERR_LASTCODE
ERR_PROC_FAILED = ERR_UNKNOWN
ERR_PROC_FAILED_PENDING = ERR_UNKNOWN
ERR_REVOKED = ERR_UNKNOWN

#: every public error-class name -> value (what ``MPI`` re-exports)
ERROR_NAMES = {
    name: value
    for name, value in sorted(globals().items())
    if name == "SUCCESS" or name.startswith("ERR_")
}

_CLASS_MASK = 0x7F

# MPICH's MPI_Error_string texts (trailing blanks included, as MPICH has them)
_STRINGS = {
    0: "No MPI error",
    1: "Invalid buffer pointer",
    2: "Invalid count",
    3: "Invalid datatype",
    4: "Invalid tag",
    5: "Invalid communicator",
    6: "Invalid rank",
    7: "Invalid root",
    8: "Invalid group",
    9: "Invalid MPI_Op",
    10: "Invalid topology",
    11: "Invalid dimension argument",
    12: "Invalid argument",
    13: "Unknown error.  Please file a bug report.",
    14: "Message truncated",
    15: "Other MPI error",
    16: "Internal MPI error!",
    17: "See the MPI_ERROR field in MPI_Status for the error code",
    18: "Pending request (no error)",
    19: "Request pending due to failure",
    20: "Access denied to file",
    21: "Invalid amode value in MPI_File_open ",
    22: "Invalid file name",
    23: "An error occurred in a user-defined data conversion function",
    24: "The requested datarep name has already been specified to MPI_REGISTER_DATAREP",
    25: "File exists",
    26: "File in use by some process",
    27: "Invalid MPI_File",
    28: "Invalid MPI_Info",
    29: "Invalid key for MPI_Info ",
    30: "Invalid MPI_Info value ",
    31: "MPI_Info key is not defined ",
    32: "Other I/O error ",
    33: "Invalid service name (see MPI_Publish_name)",
    34: "Unable to allocate memory for MPI_Alloc_mem",
    35: "Inconsistent arguments to collective routine ",
    36: "Not enough space for file ",
    37: "File does not exist",
    38: "Invalid port",
    39: "Quota exceeded for files",
    40: "Read-only file or filesystem name",
    41: "Attempt to lookup an unknown service name ",
    42: "Error in spawn call",
    43: "Unsupported datarep passed to MPI_File_set_view ",
    44: "Unsupported file operation ",
    45: "Invalid MPI_Win",
    46: "Invalid base address",
    47: "Invalid locktype argument",
    48: "Invalid keyval",
    49: "Conflicting accesses to window ",
    50: "Wrong synchronization of RMA calls ",
    51: "Invalid size argument in RMA call",
    52: "Invalid displacement argument in RMA call ",
    53: "Invalid assert argument",
    54: "Process failed",
    55: "Target memory is not contained within the window",
    56: "Memory cannot be attached",
    57: "Memory cannot be shared",
    58: "Incorrect window flavor",
    59: "Communication object revoked",
    60: "Operation could not be issued (EAGAIN)",
    61: "failure occurred while allocating memory for a request object",
}
_UNKNOWN_CLASS = "Unknown error class"


def _check_code(errorcode):
    code = int(errorcode)
    if code < 0 or code > ERR_LASTCODE:
        raise Exception(ERR_ARG)
    return code


def Get_error_class(errorcode):
    """Convert an error code into an error class."""
    from .errorcode import user_class
    cls = user_class(int(errorcode))
    if cls is not None:
        return cls
    return _check_code(errorcode) & _CLASS_MASK


def Get_error_string(errorcode):
    """Return the error string for an error class or an error code."""
    from .errorcode import user_string
    text = user_string(int(errorcode))
    if text is not None:
        return text
    code = _check_code(errorcode)
    text = _STRINGS.get(code)
    if text is None:
        text = _STRINGS.get(code & _CLASS_MASK, _UNKNOWN_CLASS)
    return text


class Exception(RuntimeError):  # noqa: A001 - mirrors mpi4py's MPI.Exception
    """Exception class (``MPI.Exception``).

    ``Exception(ierr)`` holds an error code; it compares, hashes and converts
    to ``int`` like that code.  An optional second argument is a detail
    message appended to ``str()`` (erdmampi-specific; ``args[0]`` stays the
    error code as in mpi4py).
    """

    def __init__(self, ierr=SUCCESS, msg=None, /):
        ierr = int(ierr)
        if ierr < SUCCESS:
            ierr = ERR_UNKNOWN
        if msg is None:
            RuntimeError.__init__(self, ierr)
        else:
            RuntimeError.__init__(self, ierr, str(msg))

    def __int__(self):
        return self.args[0]

    def __index__(self):
        return self.args[0]

    def __bool__(self):
        return int(self) != SUCCESS

    def __hash__(self):
        return hash(int(self))

    def __eq__(self, other):
        return int(self) == other

    def __ne__(self, other):
        return int(self) != other

    def __lt__(self, other):
        return int(self) < other

    def __le__(self, other):
        return int(self) <= other

    def __gt__(self, other):
        return int(self) > other

    def __ge__(self, other):
        return int(self) >= other

    def __repr__(self):
        return f"MPI.Exception({int(self)})"

    def __str__(self):
        text = self.Get_error_string()
        if len(self.args) > 1:
            text = f"{text}, {self.args[1]}"
        return text

    def Get_error_code(self):
        """Error code."""
        return int(self)

    def Get_error_class(self):
        """Error class."""
        return Get_error_class(int(self))

    def Get_error_string(self):
        """Error string."""
        return Get_error_string(int(self))

    @property
    def error_code(self):
        """Error code."""
        return self.Get_error_code()

    @property
    def error_class(self):
        """Error class."""
        return self.Get_error_class()

    @property
    def error_string(self):
        """Error string."""
        return self.Get_error_string()


MPIException = Exception


def raise_error(error_class, msg=None):
    """Raise ``MPI.Exception(error_class)`` with an optional detail message."""
    raise Exception(error_class, msg)


class UnsupportedOperation(Exception, NotImplementedError):
    """A call erdmampi does not implement: ``MPI.Exception`` with error class
    ``ERR_UNSUPPORTED_OPERATION``, and a ``NotImplementedError`` (what mpi4py
    raises for routines its MPI library lacks)."""

    def __init__(self, what):
        Exception.__init__(self, ERR_UNSUPPORTED_OPERATION,
                           f"{what} is not supported by erdmampi (see docs/differences.md)")
