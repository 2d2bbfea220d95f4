"""The ``MPI`` facade: ``from erdmampi import MPI`` as ``from mpi4py import MPI``.

Constants, predefined objects and module functions; the logic lives in the
modules it re-exports.  Importing this module starts the engine unless
``erdmampi.rc.initialize`` is false, and registers ``Finalize`` at exit
(``rc.finalize``: None means "if we initialized").
"""

# functions, not modules: the module's namespace holds no module object (as
# mpi4py's; tools that walk it, like its documentation test, would recurse),
# and no Python function of another package (they would be walked too)
from socket import gethostname as _gethostname
import sys as _sys
from time import perf_counter as _perf_counter

from . import rc as _rc
from ._objmodel import HANDLE_SIZE as _HANDLE_SIZE
from .comm import finalize as _comm_finalize, init as _comm_init
from ._commrt import _rt
from .buffers import (BOTTOM, BUFFER_AUTOMATIC, IN_PLACE, BottomType,  # noqa: F401
                      BufferAutomaticType, InPlaceType)
from .comm import (APPNUM, COMM_NULL, COMM_SELF, COMM_TYPE_HW_GUIDED,  # noqa: F401
                   COMM_TYPE_HW_UNGUIDED, COMM_TYPE_RESOURCE_GUIDED, COMM_TYPE_SHARED,
                   COMM_WORLD, ERRHANDLER_NULL, ERRORS_ABORT, ERRORS_ARE_FATAL,
                   ERRORS_RETURN, IO, KEYVAL_INVALID, LASTUSEDCODE, TAG_UB, UNIVERSE_SIZE,
                   WTIME_IS_GLOBAL, Cartcomm, Comm, Distgraphcomm, Errhandler, Graphcomm,
                   Intercomm, Intracomm, Topocomm)
from .intracomm_topo import UNWEIGHTED, WEIGHTS_EMPTY  # noqa: F401
from .datatype import PREDEFINED as _PREDEFINED_TYPES
from .datatype import Datatype  # noqa: F401
from .datatype import (  # noqa: F401
    COMBINER_CONTIGUOUS, COMBINER_DARRAY, COMBINER_DUP, COMBINER_F90_COMPLEX,
    COMBINER_F90_INTEGER, COMBINER_F90_REAL, COMBINER_HINDEXED, COMBINER_HINDEXED_BLOCK,
    COMBINER_HVECTOR, COMBINER_INDEXED, COMBINER_INDEXED_BLOCK, COMBINER_NAMED,
    COMBINER_RESIZED, COMBINER_STRUCT, COMBINER_SUBARRAY, COMBINER_VALUE_INDEX,
    COMBINER_VECTOR, DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC, DISTRIBUTE_DFLT_DARG,
    DISTRIBUTE_NONE, _datatype_create, _datatype_decode, _typealign, _typecode)
from .exceptions import ERROR_NAMES as _ERROR_NAMES
from .exceptions import Exception, Get_error_class, Get_error_string  # noqa: F401,A004
from .group import (CONGRUENT, GROUP_EMPTY, GROUP_NULL, IDENT, SIMILAR,  # noqa: F401
                    UNEQUAL, Group)
from .message import MESSAGE_NO_PROC, MESSAGE_NULL, Message  # noqa: F401
from .msgpickle import Pickle, pickle  # noqa: F401
from .op import PREDEFINED_OPS as _PREDEFINED_OPS
from .op import Op  # noqa: F401
from .request import REQUEST_NULL, Grequest, Prequest, Request  # noqa: F401
from .status import Status  # noqa: F401
from .commctx import (_comm_lock, _comm_lock_table, _commctx_inter,  # noqa: F401
                      _commctx_intra)

globals().update(_PREDEFINED_TYPES)
globals().update(_PREDEFINED_OPS)
globals().update(_ERROR_NAMES)

# -----------------------------------------------------------------------------
# Constants (MPICH 4.0 values, as mpi4py exposes them)

VERSION = 4
SUBVERSION = 0

ANY_SOURCE = -2
ANY_TAG = -1
PROC_NULL = -1
ROOT = -3
UNDEFINED = -32766
BSEND_OVERHEAD = 96

THREAD_SINGLE = 0
THREAD_FUNNELED = 1
THREAD_SERIALIZED = 2
THREAD_MULTIPLE = 3

MAX_PROCESSOR_NAME = 128
MAX_ERROR_STRING = 512
MAX_PORT_NAME = 1024
MAX_INFO_KEY = 255
MAX_INFO_VAL = 1024
MAX_OBJECT_NAME = 128
MAX_DATAREP_STRING = 128
MAX_LIBRARY_VERSION_STRING = 8192
MAX_PSET_NAME_LEN = 256
MAX_STRINGTAG_LEN = 256

GRAPH = 1
CART = 2
DIST_GRAPH = 3

ORDER_C = 56
ORDER_F = 57
ORDER_FORTRAN = 57

TYPECLASS_REAL = 1
TYPECLASS_INTEGER = 2
TYPECLASS_COMPLEX = 3
TYPECLASS_LOGICAL = 4

F_SOURCE = 2
F_TAG = 3
F_ERROR = 4
F_STATUS_SIZE = 5

_THREAD_LEVELS = {"single": THREAD_SINGLE, "funneled": THREAD_FUNNELED,
                  "serialized": THREAD_SERIALIZED, "multiple": THREAD_MULTIPLE}


# -----------------------------------------------------------------------------
# Info (a plain key/value store; hints are ignored by erdmampi)


from .info import INFO_ENV, INFO_NULL, Info  # noqa: E402,F401

# -----------------------------------------------------------------------------
# One-sided communication, I/O and sessions

from .win import (WIN_NULL, Win, WIN_BASE, WIN_SIZE, WIN_DISP_UNIT,  # noqa: E402,F401
                  WIN_CREATE_FLAVOR, WIN_FLAVOR, WIN_MODEL, WIN_FLAVOR_CREATE,
                  WIN_FLAVOR_ALLOCATE, WIN_FLAVOR_DYNAMIC, WIN_FLAVOR_SHARED,
                  WIN_SEPARATE, WIN_UNIFIED, MODE_NOCHECK, MODE_NOSTORE, MODE_NOPUT,
                  MODE_NOPRECEDE, MODE_NOSUCCEED, LOCK_EXCLUSIVE, LOCK_SHARED)
from .file import (FILE_NULL, File, MODE_RDONLY, MODE_RDWR, MODE_WRONLY,  # noqa: E402,F401
                   MODE_CREATE, MODE_EXCL, MODE_DELETE_ON_CLOSE, MODE_UNIQUE_OPEN,
                   MODE_SEQUENTIAL, MODE_APPEND, SEEK_SET, SEEK_CUR, SEEK_END,
                   DISPLACEMENT_CURRENT, DISP_CUR, DISTRIBUTE_BLOCK, DISTRIBUTE_CYCLIC,
                   DISTRIBUTE_NONE, DISTRIBUTE_DFLT_DARG)
from .session import SESSION_NULL, Session  # noqa: E402,F401
from .mpibuffer import buffer  # noqa: E402,F401
from .mpibuffer import alloc_mem as _alloc_mem, free_mem as _free_mem  # noqa: E402
from .mpibuffer import attach as _attach, detach as _detach  # noqa: E402
memory = buffer

# -----------------------------------------------------------------------------
# Initialization


def Init():
    """Start the engine (MPI_Init)."""
    _comm_init(THREAD_MULTIPLE)


def Init_thread(required=THREAD_MULTIPLE):
    """Start the engine; the engine is thread safe, so THREAD_MULTIPLE is provided."""
    _comm_init(THREAD_MULTIPLE)
    return THREAD_MULTIPLE


def Finalize():
    """Synchronise and shut the engine down (MPI_Finalize)."""
    if _rt.initialized and not _rt.finalized:
        from . import diagnostics as _diag
        _diag.report_stats(_rt.engine)
    _comm_finalize()


def Is_initialized():
    """Whether the engine has been started (`Init` or the import of MPI)."""
    return _rt.initialized


def Is_finalized():
    """Whether `Finalize` has completed."""
    return _rt.finalized


def Query_thread():
    """The level of thread support provided by the engine."""
    return _rt.thread_level


def Is_thread_main():
    """Whether the calling thread is the main thread of the process."""
    from threading import current_thread, main_thread
    return current_thread() is main_thread()


# -----------------------------------------------------------------------------
# Environment

_T0 = _perf_counter()


def Wtime():
    """Elapsed wall-clock time in seconds (monotonic)."""
    return _perf_counter()


def Wtick():
    """Resolution of Wtime."""
    return 1e-9


def Get_processor_name():
    """The name of this host."""
    return _gethostname()


def Get_version():
    """MPI standard version implemented: (4, 0)."""
    return (VERSION, SUBVERSION)


def Get_library_version():
    """A string naming erdmampi, its version and its transport."""
    from . import __version__
    return (f"erdmampi {__version__} (MPI {VERSION}.{SUBVERSION} API over QUIC: "
            "ngtcp2 + GnuTLS engine)")


def get_vendor():
    """The name and version of the implementation: ``("erdmampi", (0, 1, 0))``."""
    from . import __version__
    return ("erdmampi", tuple(int(x) for x in __version__.split(".")[:3]))


def Pcontrol(level):
    """Control profiling (no profiling layer: does nothing)."""


def Attach_buffer(buf):
    """Attach a user-provided buffer for sending in buffered mode.

    Kept only to hand back on detach: the engine buffers sends itself.
    """
    _attach(None, buf)


def Detach_buffer():
    """Remove an existing attached buffer."""
    return _detach(None)


def Flush_buffer():
    """Wait for the buffered sends to complete (sends are never held back: returns)."""


def Alloc_mem(size, info=None):
    """Allocate memory for message passing and remote memory access."""
    return _alloc_mem(size)


def Free_mem(mem):
    """Free memory allocated with `Alloc_mem`."""
    _free_mem(mem)


def Get_address(location):
    """The address in memory of a buffer (0 for None and `BOTTOM`)."""
    from .buffers import InPlaceType, BufferAutomaticType, getbuffer, is_bottom
    if location is None or is_bottom(location):
        return 0
    if isinstance(location, (InPlaceType, BufferAutomaticType)):
        return int(location)     # the constant's own address value, as MPI's
    if isinstance(location, buffer):
        return location.address
    return getbuffer(location, True).raw.ctypes.data


def Get_abi_version():
    """The version of the standard MPI ABI: (-1, -1), none (as MPICH 4.0)."""
    return (-1, -1)


def Get_abi_info():
    """An `Info` with the sizes in bytes of the ABI's integer types."""
    return Info.Create([("mpi_aint_size", "8"), ("mpi_count_size", "8"),
                        ("mpi_offset_size", "8")])


def Get_abi_fortran_info():
    """Sizes of the Fortran types and which sized ones exist."""
    items = [(f"mpi_{n}_size", str(globals()[n.upper()].Get_size()))
             for n in ("logical", "integer", "real", "double_precision")]
    for cls, sizes in (("logical", (1, 2, 4, 8, 16)), ("integer", (1, 2, 4, 8, 16)),
                       ("real", (2, 4, 8, 16)), ("complex", (4, 8, 16, 32)),
                       ("double_complex", ("",))):
        for size in sizes:
            dt = globals().get(f"{cls}{size}".upper())
            ok = dt is not None and dt != DATATYPE_NULL
            items.append((f"mpi_{cls}{size}_supported", "true" if ok else "false"))
    return Info.Create(items)


def Get_hw_resource_info():
    """Information about the hardware resources (an MPI 4.1 call).

    erdmampi implements MPI 4.0: NotImplementedError, as mpi4py over an MPI
    4.0 library.
    """
    raise NotImplementedError("MPI_Get_hw_resource_info (MPI 4.1)")


def Aint_add(base, disp):
    """The address ``base`` plus the displacement ``disp``."""
    return int(base) + int(disp)


def Aint_diff(addr1, addr2):
    """The difference ``addr1 - addr2`` between two addresses."""
    return int(addr1) - int(addr2)


def Compute_dims(nnodes, dims):
    """Balanced dimensions for a Cartesian grid (zeros in ``dims`` are free)."""
    if isinstance(dims, int):
        dims = [0] * dims
    dims = [int(d) for d in dims]
    fixed = 1
    for d in dims:
        if d < 0:
            from .exceptions import ERR_DIMS, raise_error
            raise_error(ERR_DIMS)
        if d:
            fixed *= d
    free = [i for i, d in enumerate(dims) if d == 0]
    n = int(nnodes)
    if fixed == 0 or n % fixed:
        from .exceptions import ERR_DIMS, raise_error
        raise_error(ERR_DIMS, "nnodes is not a multiple of the fixed dimensions")
    rest = n // fixed
    factors = []
    p = 2
    while rest > 1:
        while rest % p == 0:
            factors.append(p)
            rest //= p
        p += 1
    sizes = [1] * len(free)
    for f in sorted(factors, reverse=True):
        if sizes:
            i = sizes.index(min(sizes))
            sizes[i] *= f
    sizes.sort(reverse=True)
    for i, s in zip(free, sizes):
        dims[i] = s
    return dims


from .dpm import Close_port, Open_port  # noqa: E402,F401
from .errorcode import (Add_error_class, Add_error_code, Add_error_string,  # noqa: E402,F401
                        Remove_error_class, Remove_error_code, Remove_error_string)


# -----------------------------------------------------------------------------
# Automatic initialization and finalization (mpi4py.rc)


# Handle introspection (mpi4py's MPI._sizeof/_handleof/_addressof).  Every
# handle object keeps its handle in C memory (_objmodel.HandleBase): one
# unsigned 64-bit field, so every handle type is 8 bytes (the handle values
# are MPICH's, sign-extended where MPICH's int is negative); MPI_Status is
# MPICH's 5 ints.  Requests, groups and messages make their handle on demand:
# _handleof and _addressof store the current one in the field first.

def _handle_kind(arg):
    kinds = (Status, Datatype, Request, Message, Op, Group, Info, Errhandler,
             Session, Comm, Win, File)
    for kind in kinds:
        if (isinstance(arg, type) and issubclass(arg, kind)) or isinstance(arg, kind):
            return kind
    raise TypeError("expecting an MPI type or instance")


def _sizeof(arg):
    """Size in bytes of the underlying MPI handle."""
    kind = _handle_kind(arg)
    return 20 if kind is Status else _HANDLE_SIZE


def _handle_field(arg):
    """Return an MPI instance with its current handle in its handle field."""
    if isinstance(arg, type):
        raise TypeError("expecting an MPI instance")
    sync = getattr(type(arg), "_sync_handle", None)
    if sync is not None:
        sync(arg)
    return arg


def _handleof(arg):
    """Unsigned integer value of the underlying MPI handle (a Status: its address)."""
    if _handle_kind(arg) is Status:
        _handle_field(arg)
        return arg._mem.buffer_info()[0]
    return _handle_field(arg)._h


def _addressof(arg):
    """Memory address of the underlying MPI handle.

    A Status: the address of its fields; any other object: the address of
    its handle field (``_sizeof`` bytes, the value ``_handleof`` returns).
    A handle written there with ctypes or cffi makes a null object the MPI
    object that handle designates.
    """
    if _handle_kind(arg) is Status:
        _handle_field(arg)
        return arg._mem.buffer_info()[0]
    # imported here: a C function in this module's namespace would be walked
    # by documentation tools as one of its functions
    from ._objmodel import handle_address
    return handle_address(_handle_field(arg))


def _install_unsupported():
    """Install stand-ins for the names that nothing above defined.

    The names are those listed in ``_unsupported`` (generated by
    ``tests/upstream/api_diff.py``).
    """
    from . import _unsupported as _u
    from .exceptions import UnsupportedOperation
    g = globals()

    def stub(what):
        def unsupported(*_args, **_kwargs):
            raise UnsupportedOperation(what)
        unsupported.__name__ = what.rsplit(".", 1)[-1]
        unsupported.__doc__ = f"{what}: not supported by erdmampi."
        unsupported._erdma_unsupported = True
        return unsupported

    for name in _u.FUNCTIONS:
        g.setdefault(name, stub(f"MPI.{name}"))
    for name in _u.CLASSES:
        if name not in g:
            g[name] = type(name, (), {"__init__": stub(f"MPI.{name}"),
                                      "__module__": __name__, "_erdma_unsupported": True})
    for cls, names in _u.METHODS.items():
        klass = g.get(cls)
        for entry in names:
            name = entry.split()[0]
            if klass is None or hasattr(klass, name):
                continue
            fn = stub(f"{cls}.{name}")
            setattr(klass, name, property(fn) if entry.endswith("(property)")
                    else (classmethod(fn) if name[0].islower() and name.startswith("from")
                          else fn))


_install_unsupported()


# An uncaught exception on one rank ends the job, as under ``python -m
# mpi4py``: Finalize would wait in a barrier for ranks that may be waiting for
# this one, so the rank aborts instead (the launcher then ends the others).
# The traceback is printed first; atexit handlers registered after the import
# of MPI still run.  ERDMA_ABORT_ON_EXCEPTION=0 keeps Python's plain exit.
_UNCAUGHT = []


def _abort_on_exception_enabled():
    from . import config
    return config.get("ERDMA_ABORT_ON_EXCEPTION")


def _install_excepthook():
    if not _abort_on_exception_enabled():
        return
    previous = _sys.excepthook

    def excepthook(etype, value, tb):
        if not issubclass(etype, (SystemExit, KeyboardInterrupt)):
            _UNCAUGHT.append(etype)
        previous(etype, value, tb)

    _sys.excepthook = excepthook


def _atexit_finalize():
    if _rt.initialized and not _rt.finalized:
        if _UNCAUGHT and COMM_WORLD.Get_size() > 1:
            COMM_WORLD.Abort(1)
        try:
            Finalize()
        except BaseException:
            pass


def _startup():
    if not _rc.initialize:
        return
    if not _rt.initialized:
        level = _THREAD_LEVELS.get(str(_rc.thread_level).lower(), THREAD_MULTIPLE)
        _comm_init(level if _rc.threads else THREAD_SINGLE)
        if _rc.finalize is None or _rc.finalize:
            from atexit import register
            register(_atexit_finalize)
            _install_excepthook()
        from . import diagnostics as _diag
        _diag.report_startup(_rt.engine, _rt.info)
        from . import stackdump as _stackdump
        _stackdump.install(lambda: _rt.engine, _rt.engine.rank
                           if _rt.engine is not None else 0)


_startup()

del _sys

# the first line of each docstring: the signature (as mpi4py's)
from ._docsig import sign as _sign_docstrings  # noqa: E402
_sign_docstrings(globals())
del _sign_docstrings
# then Comm's one-call methods in C, with those signed docstrings
from .comm import c_methods as _c_methods  # noqa: E402
_c_methods()
del _c_methods
