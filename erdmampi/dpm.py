"""Ports and Join between processes of one job (MPI 4.0 11.8).

erdmampi starts no processes after launch (no Spawn), but the groups of a
running job can still meet as MPI's client/server chapter describes:
``Open_port`` names a port of this process, ``Comm.Accept``/``Comm.Connect``
build an inter-communicator between the accepting and connecting groups,
and ``Comm.Join`` does the same for two processes holding the ends of a
socket.  The handshake runs on a communicator of its own over COMM_WORLD
(context 4, reserved for it), so it never matches user messages; then the
two leaders proceed as ``Create_intercomm`` does.  A port of a process of
another job is refused: name publishing across jobs has no server here.
"""

import itertools
import socket
import struct
import threading

from .exceptions import ERR_ARG, ERR_PORT, raise_error

__all__ = ["Open_port", "Close_port", "IntracommDPM", "join"]

_CTX = 4                   # reserved in _Runtime (next_ctx starts above it)
_PREFIX = "erdmampi-port:"
_lock = threading.Lock()
_ports = set()
_serial = itertools.count(1)
_world = []


def _dpm_world():
    """The handshake communicator: COMM_WORLD's group on its own context."""
    with _lock:
        if not _world:
            from .comm import COMM_WORLD, Intracomm
            c = Intracomm()
            c._setup(COMM_WORLD.Get_group(), _CTX)
            _world.append(c)
        return _world[0]


def _parse(port):
    """(world rank of the port's owner, tag) of a port name."""
    if not isinstance(port, str) or not port.startswith(_PREFIX):
        raise_error(ERR_PORT, f"invalid port name {port!r}")
    try:
        owner, tag = (int(x) for x in port[len(_PREFIX):].split(":"))
    except ValueError:
        raise_error(ERR_PORT, f"invalid port name {port!r}")
    if not 0 <= owner < _dpm_world().Get_size():
        raise_error(ERR_PORT, f"port {port!r} belongs to no process of this job")
    return owner, tag


def Open_port(info=None):
    """A new port name of this process."""
    from .comm import COMM_WORLD
    with _lock:
        tag = next(_serial)
        port = f"{_PREFIX}{COMM_WORLD.Get_rank()}:{tag}"
        _ports.add(port)
    return port


def Close_port(port_name):
    """Close a port opened with `Open_port`."""
    with _lock:
        if port_name not in _ports:
            raise_error(ERR_PORT, f"port {port_name!r} is not open")
        _ports.discard(port_name)


class IntracommDPM:
    """Intracomm's Accept and Connect."""

    __slots__ = ()

    def Accept(self, port_name=None, info=None, root=0):
        """Wait for a Connect to ``port_name`` (significant at ``root``)."""
        self._check()
        root = self._root(root)
        world = _dpm_world()
        peer = None
        if self.Get_rank() == root:
            with _lock:
                if port_name not in _ports:
                    raise_error(ERR_PORT, f"port {port_name!r} is not open")
            owner, tag = _parse(port_name)
            peer = world.recv(source=-2, tag=tag)     # the connecting leader's rank
            peer = (peer, tag)
        peer, tag = self.bcast(peer, root)
        return self.Create_intercomm(root, world, peer, tag)

    def Connect(self, port_name=None, info=None, root=0):
        """Connect to the group accepting on ``port_name`` (at ``root``)."""
        self._check()
        root = self._root(root)
        world = _dpm_world()
        peer = None
        if self.Get_rank() == root:
            owner, tag = _parse(port_name)
            world.send(world.Get_rank(), owner, tag)
            peer = (owner, tag)
        peer, tag = self.bcast(peer, root)
        return self.Create_intercomm(root, world, peer, tag)


def join(fd):
    """Comm.Join: an inter-communicator with the process at the other end of
    the connected socket ``fd`` (which must be a rank of this job)."""
    from .comm import COMM_SELF
    world = _dpm_world()
    fd = int(fd)
    if fd < 0:
        raise_error(ERR_ARG, f"invalid file descriptor {fd}")
    sock = socket.socket(fileno=fd)
    try:
        sock.sendall(struct.pack("!ii", world.Get_size(), world.Get_rank()))
        data = b""
        while len(data) < 8:
            chunk = sock.recv(8 - len(data))
            if not chunk:
                raise_error(ERR_ARG, "Join: the socket closed during the exchange")
            data += chunk
    finally:
        sock.detach()           # the descriptor stays the caller's
    size, peer = struct.unpack("!ii", data)
    if size != world.Get_size() or not 0 <= peer < size or peer == world.Get_rank():
        raise_error(ERR_PORT, "Join: the other end is not another rank of this job")
    return COMM_SELF.Create_intercomm(0, world, peer, 0)
