"""Pickle: object serialisation for the lowercase (object) API.

Large buffers (numpy arrays, bytes-like objects at least ``THRESHOLD`` bytes)
travel out of band with pickle protocol 5. On the wire a message is either a
plain pickle stream, or an out-of-band frame::

    MAGIC (8 bytes) | u64 nbuffers | u64 len(data) | u64 len(buf_i)... | data | buf_0 | ...

Received frames are decoded without copying the buffers: the objects they
rebuild (numpy arrays) share the received bytearray.
"""

import os
import pickle as _pickle
import struct

from ._membuf import asbuffer as _asbuffer

__all__ = ["Pickle", "pickle", "PROTOCOL", "THRESHOLD"]

PROTOCOL = _pickle.HIGHEST_PROTOCOL
THRESHOLD = 1024 ** 2 // 4  # 0.25 MiB, as mpi4py
if os.environ.get("MPI4PY_PICKLE_PROTOCOL"):
    PROTOCOL = int(os.environ["MPI4PY_PICKLE_PROTOCOL"])
if os.environ.get("MPI4PY_PICKLE_THRESHOLD"):
    THRESHOLD = int(os.environ["MPI4PY_PICKLE_THRESHOLD"])

_dumps = _pickle.dumps
_loads = _pickle.loads

MAGIC = b"\x00ERDMA5\x00"
# types whose pickle holds no buffer that could travel out of band
_NO_BUFFERS = frozenset((int, float, complex, bool, str, bytes, type(None)))
_U64 = struct.Struct("<Q")
# told of every change of a Pickle's wiring (set by comm.c_methods: the C
# methods cache each communicator's pickling arguments)
_pickle_changed = None


class _OobBuffers(list):
    """A pickle ``buffer_callback`` collecting the buffers that travel out of
    band: those of at least ``threshold`` bytes (smaller ones stay in band)."""

    __slots__ = ("threshold",)

    def __init__(self, threshold):
        self.threshold = threshold

    def __call__(self, pb):
        raw = _asbuffer(pb, True)  # an MPI.buffer, as mpi4py hands out
        if raw.nbytes < self.threshold:
            return True
        self.append(raw)
        return False


class Pickle:
    """Serializer for Python objects, as ``MPI.Pickle``.

    :param dumps: callable ``dumps(obj, protocol[, buffer_callback=...])``.
    :param loads: callable ``loads(data[, buffers=...])``.
    :param protocol: pickle protocol (None: highest, when the default dumps).
    :param threshold: size in bytes from which buffers travel out of band.
    """

    def __init__(self, dumps=None, loads=None, protocol=None, threshold=None):
        if dumps is None:
            dumps = _dumps
        if loads is None:
            loads = _loads
        if protocol is None and dumps is _dumps:
            protocol = PROTOCOL
        if threshold is None:
            threshold = THRESHOLD
        self._dumps = dumps
        self._loads = loads
        self._protocol = protocol
        self._threshold = threshold
        self._rewire()

    def _rewire(self):
        # what the engine's send_obj pickles with in C: (pickle.dumps,
        # protocol, threshold), or None (another dumps: _encode only)
        p, t = self._protocol, self._threshold
        self._wire = ((_dumps, p, t) if self._dumps is _dumps and type(p) is int
                      and type(t) is int and 0 <= p <= _pickle.HIGHEST_PROTOCOL else None)
        if _pickle_changed is not None:
            _pickle_changed()       # the C methods' cached arguments are stale

    @property
    def PROTOCOL(self):
        """Protocol version."""
        return self._protocol

    @PROTOCOL.setter
    def PROTOCOL(self, protocol):
        if protocol is None and self._dumps is _dumps:
            protocol = PROTOCOL
        self._protocol = protocol
        self._rewire()

    @property
    def THRESHOLD(self):
        """Out-of-band threshold."""
        return self._threshold

    @THRESHOLD.setter
    def THRESHOLD(self, threshold):
        self._threshold = THRESHOLD if threshold is None else threshold
        self._rewire()

    def dumps(self, obj):
        """Serialize ``obj`` to a pickle data stream."""
        if self._protocol is None:
            return self._dumps(obj)
        return self._dumps(obj, self._protocol)

    def loads(self, data):
        """Deserialize an object from a pickle data stream."""
        return self._loads(data)

    def dumps_oob(self, obj):
        """Serialize ``obj`` to a pickle data stream and out-of-band buffers."""
        protocol = PROTOCOL if self._protocol is None else self._protocol
        return self._dumps_oob(obj, max(protocol, 5))  # oob needs protocol 5

    def _dumps_oob(self, obj, protocol):
        buffers = _OobBuffers(self._threshold)
        data = self._dumps(obj, protocol, buffer_callback=buffers)
        return data, list(buffers)

    def loads_oob(self, data, buffers):
        """Deserialize an object from a pickle data stream and buffers."""
        return self._loads(data, buffers=buffers)

    # Private: the wire frame used by the lowercase API

    def _encode(self, obj):
        """Return a bytes-like message for ``obj`` (one engine message)."""
        protocol = self._protocol
        if protocol is None or protocol < 5:
            data, buffers = self.dumps(obj), []
        elif type(obj) in _NO_BUFFERS:
            return self._dumps(obj, protocol)   # nothing out of band (no closure made)
        else:
            buffers = _OobBuffers(self._threshold)
            data = self._dumps(obj, protocol, buffer_callback=buffers)
        if not buffers:
            return data
        nb = len(buffers)
        header = bytearray(MAGIC)
        header += _U64.pack(nb) + _U64.pack(len(data))
        for b in buffers:
            header += _U64.pack(b.nbytes)
        total = len(header) + len(data) + sum(b.nbytes for b in buffers)
        out = bytearray(total)
        pos = len(header)
        out[:pos] = header
        out[pos:pos + len(data)] = data
        pos += len(data)
        for b in buffers:
            n = b.nbytes
            out[pos:pos + n] = b.cast("B") if b.format != "B" else b
            pos += n
        return out

    def _decode(self, msg):
        """Rebuild an object from a message made by :meth:`_encode`."""
        if type(msg) is bytes and msg and not msg.startswith(MAGIC):
            return self._loads(msg)     # one in-band pickle: the common case
        mv = memoryview(msg)
        if mv.nbytes >= 24 and mv[:8] == MAGIC:
            nb = _U64.unpack_from(mv, 8)[0]
            ndata = _U64.unpack_from(mv, 16)[0]
            pos = 24
            sizes = [_U64.unpack_from(mv, pos + 8 * i)[0] for i in range(nb)]
            pos += 8 * nb
            data = mv[pos:pos + ndata]
            pos += ndata
            buffers = []
            for n in sizes:
                buffers.append(_pickle.PickleBuffer(mv[pos:pos + n]))
                pos += n
            return self.loads_oob(data, buffers)
        if mv.nbytes == 0:
            return None
        return self.loads(mv)


pickle = Pickle()
