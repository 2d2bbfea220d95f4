"""Parallel I/O (``MPI.File``) on the local filesystem.

Every process opens the file itself (POSIX pread/pwrite); a view maps the
data stream of etypes onto file bytes through the filetype's byte runs.  The
shared file pointer lives in a small side file that the processes lock
(fcntl) to advance it atomically.  Nonblocking and split collective calls run
at once, their request (or ``*_end``) only reports the result.
"""

import fcntl
import os
import struct
import tempfile

import numpy as np

from . import errhandler as _eh
from .buffers import message_p2p
from .exceptions import (ERR_AMODE, ERR_ARG, ERR_FILE, ERR_FILE_EXISTS, ERR_IO,
                         ERR_NO_SUCH_FILE, ERR_READ_ONLY, ERR_UNSUPPORTED_DATAREP,
                         ERR_UNSUPPORTED_OPERATION, ERR_ACCESS,
                         raise_error)
from .handleobj import HandleObject
# Access modes, seek whence, distributions (MPICH's values)
MODE_RDONLY = 2
MODE_RDWR = 8
MODE_WRONLY = 4
MODE_CREATE = 1
MODE_EXCL = 64
MODE_DELETE_ON_CLOSE = 16
MODE_UNIQUE_OPEN = 32
MODE_SEQUENTIAL = 256
MODE_APPEND = 128

SEEK_SET = 600
SEEK_CUR = 602
SEEK_END = 604

DISPLACEMENT_CURRENT = -54278278
DISP_CUR = DISPLACEMENT_CURRENT

DISTRIBUTE_BLOCK = 121
DISTRIBUTE_CYCLIC = 122
DISTRIBUTE_NONE = 123
DISTRIBUTE_DFLT_DARG = -49767


class File(HandleObject, _eh.HasErrhandler):
    """File I/O context."""

    _NULL = 0                   # MPICH's MPI_FILE_NULL
    _FIRST = 0x10000000
    _ERR = ERR_FILE
    _NULL_NAME = "FILE_NULL"
    _registry = {}
    _errh_kind = "File"

    def _check(self):
        return self._state()

    # ROMIO's integer for a file is an index in its table
    def py2f(self):
        """The Fortran integer handle of the file."""
        return self._h - self._FIRST if self._h != self._NULL else 0

    toint = py2f

    @classmethod
    def f2py(cls, arg):
        """The file of a Fortran integer handle."""
        arg = int(arg)
        return cls.fromhandle(cls._FIRST + arg if arg else cls._NULL)

    fromint = f2py

    def free(self):
        """Call Close if not null."""
        if self:
            self.Close()

    def Get_errhandler(self):
        """The error handler of the file (of `FILE_NULL`: the default for `Open`)."""
        if self._h == self._NULL:       # FILE_NULL holds the default for Open
            return _eh._new_ref(self._errh)
        return super().Get_errhandler()

    def Set_errhandler(self, errhandler):
        """Set the error handler of the file (of `FILE_NULL`: the default for `Open`)."""
        if self._h == self._NULL:
            if not isinstance(errhandler, _eh.Errhandler):
                raise TypeError(f"expected Errhandler, got {type(errhandler).__name__}")
            _eh._ref(errhandler._h)
            old, self._errh = self._errh, errhandler._h
            _eh._unref(old)
            return
        super().Set_errhandler(errhandler)

    @classmethod
    def Open(cls, comm, filename, amode=MODE_RDONLY, info=None):
        """Open ``filename`` on every process of ``comm`` (collective)."""
        from .comm import Comm
        if not isinstance(comm, Comm):
            raise TypeError(f"expected Intracomm, got {type(comm).__name__}")
        comm._check()
        path = os.fsdecode(os.fspath(filename))
        amode = int(amode)
        _check_amode(amode)
        dup = comm.Dup()
        rank = dup.Get_rank()
        err = 0
        if amode & MODE_CREATE and rank == 0:
            err = _open_error(lambda: os.close(os.open(path, _flags(amode, True), 0o666)))
        err = dup.bcast(err, 0)
        fd = -1
        if not err:
            try:        # created above: every process just opens it
                fd = os.open(path, _flags(amode, False))
            except OSError as e:
                err = _os_error(e)
        errs = dup.allgather(err)
        bad = next((e for e in errs if e), 0)
        if bad:
            if fd >= 0:
                os.close(fd)
            dup.Free()
            raise_error(bad, f"cannot open {path!r}")
        st = _State(dup, path, fd, amode)
        st.hints = _info_items(info)
        if dup.Get_size() > 1:
            sp = None
            if rank == 0:
                d = "/dev/shm" if os.path.isdir("/dev/shm") else None
                sfd, sp = tempfile.mkstemp(prefix="erdmampi-fp-", dir=d)
                os.write(sfd, struct.pack("<q", 0))
                os.close(sfd)
            sp = dup.bcast(sp, 0)
            st.spfd = os.open(sp, os.O_RDWR)
            dup.Barrier()
            if rank == 0:
                os.unlink(sp)
        f = cls._register(st)
        if FILE_NULL._errh != _eh._RETURN:
            f._errh = FILE_NULL._errh
            _eh._ref(f._errh)
        return f

    def Close(self):
        """Close the file (collective)."""
        st = self._check()
        try:
            os.close(st.fd)
            if st.spfd >= 0:
                os.close(st.spfd)
            st.comm.Barrier()
            if st.amode & MODE_DELETE_ON_CLOSE and st.comm.Get_rank() == 0:
                try:
                    os.unlink(st.path)
                except OSError:
                    pass
            st.comm.Free()
        finally:
            self._release()

    @classmethod
    def Delete(cls, filename, info=None):
        """Delete a file by name."""
        path = os.fsdecode(os.fspath(filename))
        try:
            os.unlink(path)
        except OSError as e:
            raise_error(_os_error(e), f"cannot delete {path!r}")

    # -- size, mode, group, info ----------------------------------------------

    def Set_size(self, size):
        """Truncate or extend the file to ``size`` bytes."""
        st = self._check()
        size = int(size)
        if size < 0:
            raise_error(ERR_ARG, f"invalid file size {size}")
        _io(lambda: os.ftruncate(st.fd, size))
        st.comm.Barrier()

    def Preallocate(self, size):
        """Make sure the file holds at least ``size`` bytes."""
        st = self._check()
        size = int(size)
        if size < 0:
            raise_error(ERR_ARG, f"invalid file size {size}")
        if st.comm.Get_rank() == 0 and os.fstat(st.fd).st_size < size:
            _io(lambda: os.ftruncate(st.fd, size))
        st.comm.Barrier()

    def Get_size(self):
        """The size of the file in bytes."""
        st = self._check()
        return os.fstat(st.fd).st_size

    size = property(Get_size)

    def Get_amode(self):
        """The access mode the file was opened with."""
        return self._check().amode

    amode = property(Get_amode)

    def Get_group(self):
        """The group of the processes that opened the file."""
        return self._check().comm.Get_group()

    group = property(Get_group)

    @property
    def group_size(self):
        return self._check().comm.Get_size()

    @property
    def group_rank(self):
        return self._check().comm.Get_rank()

    def Set_info(self, info):
        """Set the hints of the file."""
        self._check().hints.update(_info_items(info))

    def Get_info(self):
        """An `Info` with the hints of the file."""
        st = self._check()
        from .info import Info
        return Info.Create(st.hints)

    info = property(Get_info, Set_info)

    def Set_atomicity(self, flag):
        """Set the atomicity mode."""
        self._check().atomic = bool(flag)

    def Get_atomicity(self):
        """The atomicity mode."""
        return self._check().atomic

    atomicity = property(Get_atomicity, Set_atomicity)

    def Sync(self):
        """Synchronize the processes of the file (a barrier: writes reach the file when made)."""
        st = self._check()
        st.comm.Barrier()

    def Get_type_extent(self, datatype):
        """The extent of a datatype in the file."""
        self._check()
        return datatype.Get_extent()[1]

    # -- views and positions --------------------------------------------------

    def Set_view(self, disp=0, etype=None, filetype=None, datarep="native", info=None):
        """Set the view: displacement, elementary type, file type and data representation."""
        st = self._check()
        from .datatype import PREDEFINED
        etype = PREDEFINED["BYTE"] if etype is None else etype
        filetype = etype if filetype is None else filetype
        if datarep is None:
            datarep = "native"
        if isinstance(datarep, bytes):
            datarep = datarep.decode()
        if datarep not in ("native", "internal", "external32"):
            raise_error(ERR_UNSUPPORTED_DATAREP, f"unknown data representation {datarep!r}")
        disp = int(disp)
        if disp == DISPLACEMENT_CURRENT:
            if not st.amode & MODE_SEQUENTIAL:
                raise_error(ERR_ARG, "DISPLACEMENT_CURRENT needs MODE_SEQUENTIAL")
            disp = st.byte_offset(st.pos)
        elif disp < 0:
            raise_error(ERR_ARG, f"invalid displacement {disp}")
        st.view = _View(disp, etype, filetype, datarep)
        st.pos = 0
        if st.comm.Get_rank() == 0:
            st.set_shared(0)
        st.comm.Barrier()

    def Get_view(self):
        """The view: (displacement, etype, filetype, datarep)."""
        v = self._check().view
        return (v.disp, v.etype, v.filetype, v.datarep)

    def Seek(self, offset, whence=SEEK_SET):
        """Move the individual file pointer (``whence``: `SEEK_SET`, `SEEK_CUR` or `SEEK_END`)."""
        st = self._check()
        st.pos = st.seek(st.pos, int(offset), int(whence))

    def Get_position(self):
        """The individual file pointer, in etypes."""
        return self._check().pos

    def Get_byte_offset(self, offset):
        """The absolute byte position of an offset in the view."""
        return self._check().byte_offset(int(offset))

    def Seek_shared(self, offset, whence=SEEK_SET):
        """Move the shared file pointer (collective)."""
        st = self._check()
        if st.comm.Get_rank() == 0:
            with st.shared_lock():
                st.set_shared(st.seek(st.get_shared(), int(offset), int(whence)))
        st.comm.Barrier()

    def Get_position_shared(self):
        """The shared file pointer, in etypes."""
        st = self._check()
        with st.shared_lock():
            return st.get_shared()

    # -- data access ----------------------------------------------------------

    def _read(self, offset, buf, status):
        st = self._check()
        msg = message_p2p(buf, False)
        n = st.transfer(offset, msg, False)
        _status(status, n)
        return n

    def _write(self, offset, buf, status):
        st = self._check()
        msg = message_p2p(buf, True)
        n = st.transfer(offset, msg, True)
        _status(status, n)
        return n

    def _individual(self, buf, write, status):
        st = self._check()
        msg = message_p2p(buf, write)
        n = st.transfer(st.pos, msg, write)
        st.pos += st.etypes(msg.nbytes)
        _status(status, n)
        return n

    def _shared(self, buf, write, status):
        st = self._check()
        msg = message_p2p(buf, write)
        count = st.etypes(msg.nbytes)
        with st.shared_lock():
            pos = st.get_shared()
            st.set_shared(pos + count)
        n = st.transfer(pos, msg, write)
        _status(status, n)
        return n

    def _ordered(self, buf, write, status):
        st = self._check()
        msg = message_p2p(buf, write)
        count = st.etypes(msg.nbytes)
        counts = st.comm.allgather(count)
        rank = st.comm.Get_rank()
        base = None
        if rank == 0:
            with st.shared_lock():
                base = st.get_shared()
                st.set_shared(base + sum(counts))
        base = st.comm.bcast(base, 0)
        n = st.transfer(base + sum(counts[:rank]), msg, write)
        _status(status, n)
        return n

    def Read_at(self, offset, buf, status=None):
        """Read at an explicit offset."""
        self._read(int(offset), buf, status)

    def Write_at(self, offset, buf, status=None):
        """Write at an explicit offset."""
        self._write(int(offset), buf, status)

    def Read_at_all(self, offset, buf, status=None):
        """Collective read at explicit offsets."""
        self._read(int(offset), buf, status)

    def Write_at_all(self, offset, buf, status=None):
        """Collective write at explicit offsets."""
        self._write(int(offset), buf, status)

    def Read(self, buf, status=None):
        """Read at the individual file pointer."""
        self._individual(buf, False, status)

    def Write(self, buf, status=None):
        """Write at the individual file pointer."""
        self._individual(buf, True, status)

    Read_all = Read
    Write_all = Write

    def Read_shared(self, buf, status=None):
        """Read at the shared file pointer."""
        self._shared(buf, False, status)

    def Write_shared(self, buf, status=None):
        """Write at the shared file pointer."""
        self._shared(buf, True, status)

    def Read_ordered(self, buf, status=None):
        """Collective read at the shared file pointer, in rank order."""
        self._ordered(buf, False, status)

    def Write_ordered(self, buf, status=None):
        """Collective write at the shared file pointer, in rank order."""
        self._ordered(buf, True, status)

    # nonblocking: done at once

    def Iread_at(self, offset, buf):
        """Nonblocking read at an explicit offset; returns a `Request`."""
        return _done(self._read(int(offset), buf, None))

    def Iwrite_at(self, offset, buf):
        """Nonblocking write at an explicit offset; returns a `Request`."""
        return _done(self._write(int(offset), buf, None))

    Iread_at_all = Iread_at
    Iwrite_at_all = Iwrite_at

    def Iread(self, buf):
        """Nonblocking read at the individual file pointer; returns a `Request`."""
        return _done(self._individual(buf, False, None))

    def Iwrite(self, buf):
        """Nonblocking write at the individual file pointer; returns a `Request`."""
        return _done(self._individual(buf, True, None))

    Iread_all = Iread
    Iwrite_all = Iwrite

    def Iread_shared(self, buf):
        """Nonblocking read at the shared file pointer; returns a `Request`."""
        return _done(self._shared(buf, False, None))

    def Iwrite_shared(self, buf):
        """Nonblocking write at the shared file pointer; returns a `Request`."""
        return _done(self._shared(buf, True, None))

    # split collectives: the transfer happens in *_begin

    def _begin(self, n):
        st = self._check()
        if st.split is not None:
            raise_error(ERR_IO, "a split collective operation is already active")
        st.split = n

    def _end(self, status):
        st = self._check()
        if st.split is None:
            raise_error(ERR_IO, "no split collective operation is active")
        n, st.split = st.split, None
        _status(status, n)

    def Read_at_all_begin(self, offset, buf):
        """Begin a split collective read at explicit offsets."""
        self._begin(self._read(int(offset), buf, None))

    def Read_at_all_end(self, buf, status=None):
        """Complete a split collective read at explicit offsets."""
        self._end(status)

    def Write_at_all_begin(self, offset, buf):
        """Begin a split collective write at explicit offsets."""
        self._begin(self._write(int(offset), buf, None))

    def Write_at_all_end(self, buf, status=None):
        """Complete a split collective write at explicit offsets."""
        self._end(status)

    def Read_all_begin(self, buf):
        """Begin a split collective read at the individual file pointer."""
        self._begin(self._individual(buf, False, None))

    def Read_all_end(self, buf, status=None):
        """Complete a split collective read at the individual file pointer."""
        self._end(status)

    def Write_all_begin(self, buf):
        """Begin a split collective write at the individual file pointer."""
        self._begin(self._individual(buf, True, None))

    def Write_all_end(self, buf, status=None):
        """Complete a split collective write at the individual file pointer."""
        self._end(status)

    def Read_ordered_begin(self, buf):
        """Begin a split collective read at the shared file pointer, in rank order."""
        self._begin(self._ordered(buf, False, None))

    def Read_ordered_end(self, buf, status=None):
        """Complete a split collective ordered read."""
        self._end(status)

    def Write_ordered_begin(self, buf):
        """Begin a split collective write at the shared file pointer, in rank order."""
        self._begin(self._ordered(buf, True, None))

    def Write_ordered_end(self, buf, status=None):
        """Complete a split collective ordered write."""
        self._end(status)


# -----------------------------------------------------------------------------
# Helpers


def _check_amode(amode):
    access = amode & (MODE_RDONLY | MODE_WRONLY | MODE_RDWR)
    if access not in (MODE_RDONLY, MODE_WRONLY, MODE_RDWR):
        raise_error(ERR_AMODE, "exactly one of MODE_RDONLY, MODE_WRONLY, MODE_RDWR")
    if access == MODE_RDONLY and amode & (MODE_CREATE | MODE_EXCL):
        raise_error(ERR_AMODE, "MODE_RDONLY with MODE_CREATE or MODE_EXCL")
    if amode & MODE_RDWR and amode & MODE_SEQUENTIAL:
        raise_error(ERR_AMODE, "MODE_RDWR with MODE_SEQUENTIAL")


def _flags(amode, create):
    if amode & MODE_RDONLY:
        flags = os.O_RDONLY
    elif amode & MODE_WRONLY:
        flags = os.O_WRONLY
    else:
        flags = os.O_RDWR
    if create:
        flags |= os.O_CREAT
        if amode & MODE_EXCL:
            flags |= os.O_EXCL
    return flags


def _os_error(e):
    import errno
    return {errno.ENOENT: ERR_NO_SUCH_FILE, errno.EEXIST: ERR_FILE_EXISTS,
            errno.EACCES: ERR_ACCESS, errno.EPERM: ERR_ACCESS,
            errno.EROFS: ERR_READ_ONLY, errno.EISDIR: ERR_FILE}.get(e.errno, ERR_IO)


def _open_error(fn):
    try:
        fn()
    except OSError as e:
        return _os_error(e)
    return 0


def _io(fn):
    try:
        return fn()
    except OSError as e:
        raise_error(_os_error(e), str(e))


def _info_items(info):
    if info is None or not info:
        return {}
    try:
        return {k: info.Get(k) for k in info.keys()}
    except Exception:
        return {}


def _status(status, nbytes):
    if status is not None:
        status._fill(-2, -1, 0, nbytes, False)


def _done(nbytes):
    from .request import Request, _DoneOp
    return Request._new(_DoneOp(source=-2, tag=-1, nbytes=nbytes))


class _View:
    """disp + tiled filetype; ``runs``: (offset, length) byte runs of one
    filetype item, ``fsize`` its data bytes, ``extent`` its extent."""

    def __init__(self, disp, etype, filetype, datarep):
        self.disp, self.etype, self.filetype, self.datarep = disp, etype, filetype, datarep
        self.esize = etype.Get_size()
        self.fsize = filetype.Get_size()
        self.extent = filetype.Get_extent()[1]
        if self.esize <= 0 or self.fsize % self.esize:
            raise_error(ERR_ARG, "the filetype must be made of whole etypes")
        layout = getattr(filetype, "_get_layout", None)
        if self.fsize == self.extent and filetype.Get_extent()[0] == 0:
            self.runs = [(0, self.fsize)]
        elif layout is not None:
            off, ln = layout().runs()
            self.runs = [(int(o), int(n)) for o, n in zip(off, ln)]
        else:
            raise_error(ERR_UNSUPPORTED_OPERATION, "non-contiguous filetype")
        self.contig = self.runs == [(0, self.extent)]

    def segments(self, data, nbytes):
        """(file offset, length) for ``nbytes`` data bytes from data byte ``data``."""
        if self.contig:
            return [(self.disp + data, nbytes)] if nbytes else []
        out = []
        tile, rem = divmod(data, self.fsize)
        while nbytes > 0:
            base = self.disp + tile * self.extent
            for off, ln in self.runs:
                if rem >= ln:
                    rem -= ln
                    continue
                take = min(ln - rem, nbytes)
                out.append((base + off + rem, take))
                nbytes -= take
                rem = 0
                if nbytes == 0:
                    break
            tile += 1
            rem = 0
        return out


class _State:
    def __init__(self, comm, path, fd, amode):
        from .datatype import PREDEFINED
        byte = PREDEFINED["BYTE"]
        self.comm, self.path, self.fd, self.amode = comm, path, fd, amode
        self.view = _View(0, byte, byte, "native")
        self.pos = 0
        self.spfd = -1
        self.shared_local = 0
        self.atomic = False
        self.hints = {}
        self.split = None

    def etypes(self, nbytes):
        return nbytes // self.view.esize

    def byte_offset(self, offset):
        segs = self.view.segments(offset * self.view.esize, 1)
        return segs[0][0] if segs else self.view.disp

    def seek(self, pos, offset, whence):
        if whence == SEEK_SET:
            new = offset
        elif whence == SEEK_CUR:
            new = pos + offset
        elif whence == SEEK_END:
            v = self.view
            end = max(os.fstat(self.fd).st_size - v.disp, 0)
            tiles, rem = divmod(end, v.extent) if v.extent else (0, 0)
            data = tiles * v.fsize + sum(min(max(rem - o, 0), n) for o, n in v.runs)
            new = data // v.esize + offset
        else:
            raise_error(ERR_ARG, f"invalid whence {whence}")
        if new < 0:
            raise_error(ERR_ARG, f"negative file position {new}")
        return new

    def transfer(self, offset, msg, write):
        """Move ``msg`` to/from the view at etype ``offset``; bytes moved."""
        if offset < 0:
            raise_error(ERR_ARG, f"invalid offset {offset}")
        if write and self.amode & MODE_RDONLY:
            raise_error(ERR_READ_ONLY, "file opened read-only")
        if not write and self.amode & MODE_WRONLY:
            raise_error(ERR_ACCESS, "file opened write-only")
        nbytes = msg.nbytes
        if not nbytes:
            return 0
        mem = np.asarray(msg.array).reshape(-1).view(np.uint8)
        done = 0
        for foff, ln in self.view.segments(offset * self.view.esize, nbytes):
            chunk = mem[done:done + ln]
            if write:
                _io(lambda: os.pwrite(self.fd, chunk, foff))
                got = ln
            else:
                data = _io(lambda: os.pread(self.fd, ln, foff))
                got = len(data)
                if got:
                    chunk[:got] = np.frombuffer(data, np.uint8)
            done += got
            if got < ln:
                break
        if not write:
            msg.finish()
        return done

    # shared file pointer (etype units)

    def shared_lock(self):
        return _SharedLock(self.spfd)

    def get_shared(self):
        if self.spfd < 0:
            return self.shared_local
        return struct.unpack("<q", os.pread(self.spfd, 8, 0))[0]

    def set_shared(self, value):
        if self.spfd < 0:
            self.shared_local = value
        else:
            os.pwrite(self.spfd, struct.pack("<q", value), 0)


class _SharedLock:
    def __init__(self, fd):
        self.fd = fd

    def __enter__(self):
        if self.fd >= 0:
            fcntl.lockf(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        if self.fd >= 0:
            fcntl.lockf(self.fd, fcntl.LOCK_UN)


FILE_NULL = File()
File._null_object = FILE_NULL
File.__module__ = "erdmampi.MPI"
