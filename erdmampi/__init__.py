"""erdmampi: an mpi4py-compatible MPI for Python over a QUIC engine.

Importing this package starts nothing; ``from erdmampi import MPI`` starts the
engine (unless :data:`rc.initialize` is false), as ``mpi4py`` does.
"""

__version__ = "0.1.0"
__author__ = "erdmampi developers"


class Rc:
    """Runtime configuration options, read when ``erdmampi.MPI`` is imported.

    :param initialize: start the engine on import of ``erdmampi.MPI`` (True).
    :param threads: request thread support (True).
    :param thread_level: "multiple", "serialized", "funneled" or "single".
    :param finalize: finalize at exit: None (default) means when we initialized.
    :param fast_reduce: tree-based reductions for objects (True).
    :param recv_mprobe: receive objects with matched probes (True).
    :param irecv_bufsz: default buffer size for ``irecv()`` without a buffer.
    :param errors: "exception", "default", "abort" or "fatal".
    :param compress: compression of collective traffic: "off", "auto",
        "lossless", "bf16", "int8" or "int4"; None (default) means "auto".
        The environment variable ``ERDMA_COMPRESS`` wins over it.  See
        ``docs/compression.md``.
    """

    initialize = True
    threads = True
    thread_level = "multiple"
    finalize = None
    fast_reduce = True
    recv_mprobe = True
    irecv_bufsz = 32768
    errors = "exception"
    compress = None

    def __init__(self, **kwargs):
        self(**kwargs)

    def __setattr__(self, name, value):
        if not hasattr(self, name):
            raise TypeError(f"object has no attribute {name!r}")
        super().__setattr__(name, value)

    def __call__(self, **kwargs):
        for key in kwargs:
            if not hasattr(self, key):
                raise TypeError(f"unexpected argument {key!r}")
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self):
        return f"<{__name__}.rc>"


rc = Rc()
__import__("sys").modules[f"{__name__}.rc"] = rc


def get_include():
    """Return the directory of the C engine's public header."""
    import os
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "ext", "include")


def get_config():
    """Return a dict describing how erdmampi was built."""
    return {"transport": "quic", "engine": "erdma", "mpi_version": "4.0"}


def profile(name, *, path=None):
    """Load a profiling library by name (searched in ``path``), as mpi4py does.

    The library is loaded with global symbols; erdmampi's calls do not go
    through a C MPI library, so a PMPI tool sees none of them.  Raises
    ValueError when the library is not found, warns when it cannot load.
    """
    import os
    import pathlib
    import warnings
    from _ctypes import dlopen
    if path is None:
        path = [""]
    elif isinstance(path, os.PathLike):
        path = [path]
    elif isinstance(path, str):
        path = path.split(os.pathsep)
    elif isinstance(path, bytes):
        path = path.split(os.fsencode(os.pathsep))
    name = os.fsdecode(name)
    found = None
    for folder in map(pathlib.Path, map(os.fsdecode, path)):
        for prefix, suffix in (("", ""), ("lib", ".so")):
            candidate = folder / f"{prefix}{name}{suffix}"
            if candidate.is_file():
                found = str(candidate.resolve())
                break
        if found:
            break
    if found is None:
        raise ValueError(f"profiler {name!r} not found")
    try:
        handle = dlopen(found, os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as exc:
        warnings.warn(exc.args[0], stacklevel=2)
    else:
        vars(profile).setdefault("registry", []).append((name, (handle, found)))
