"""Collectives made of one round of point-to-point messages.

Neighbourhood collectives (:mod:`erdmampi.topo`) and inter-communicator
collectives (:mod:`erdmampi.intercomm`) both move each block straight from
its sender to its receiver: every receive is posted, then every send, then
all are waited for.  Ranks given here index the ``ranks`` tuple of the
transport (the communicator's group, or an inter-communicator's remote
group); messages between one pair on one tag match in posting order.
"""

import ctypes

import numpy as np

from ._commrt import _CollTransport, _u8
from .buffers import getbuffer, is_bottom
from .datatype import asdatatype
from .exceptions import ERR_UNSUPPORTED_OPERATION, raise_error


def transport(comm, ranks):
    """A transport over ``comm``'s collective context for one call, whose
    rank ``i`` is the COMM_WORLD rank ``ranks[i]``."""
    return _CollTransport(comm, comm._ctx + 1, comm._coll_base(), ranks=ranks, rank=0)


def exchange(t, sends, recvs):
    """Post ``recvs`` [(source, uint8 array, tag)], then ``sends``
    [(dest, uint8 array, tag)], and wait for all of them."""
    reqs = [t.irecv(buf, src, tag) for src, buf, tag in recvs]
    reqs += [t.isend(buf, dest, tag) for dest, buf, tag in sends]
    t.waitall(reqs)


def exchange_obj(t, sends, sources):
    """Send pickled ``sends`` [(dest, bytes, tag)]; receive one pickle from
    each of ``sources`` [(source, tag)] in order: the decoded objects."""
    reqs = []
    for dest, data, tag in sends:
        reqs.append(t.isend(np.frombuffer(data, dtype=np.uint8), dest, tag))
    got = [t.recv_obj(src, tag) for src, tag in sources]
    t.waitall(reqs)
    return got


def blocks(arr, counts, displs):
    """uint8 views of ``arr`` (bytes) at byte ``counts``/``displs``."""
    return [arr[d:d + c] for c, d in zip(counts, displs)]


def message_w(spec, readonly, size):
    """Resolve an ``Alltoallw`` spec ``(buf, (counts, displs), types)`` into
    ``size`` uint8 views (displacements in bytes; BOTTOM: absolute addresses)."""
    # mpi4py's forms: (buf, types), (buf, (counts, displs), types),
    # (buf, counts, displs, types); no counts/displs: one item at offset 0
    nargs = len(spec)
    if nargs == 2:
        (o_buf, o_types), o_counts, o_displs = spec, None, None
    elif nargs == 3:
        o_buf, (o_counts, o_displs), o_types = spec
    elif nargs == 4:
        o_buf, o_counts, o_displs, o_types = spec
    else:
        raise ValueError("message: expecting 2 to 4 items")
    if is_bottom(o_buf) and o_counts is None:
        raise ValueError("message: BOTTOM requires counts")
    if is_bottom(o_buf) and o_displs is None:
        raise ValueError("message: BOTTOM requires displs")
    if o_counts is None and o_displs is None:
        o_counts, o_displs = [1] * size, [0] * size
    elif o_counts is None or o_displs is None:
        raise ValueError("message: expecting counts and displacements")
    counts = [int(c) for c in o_counts]
    displs = [int(d) for d in o_displs]
    types = [asdatatype(x) for x in o_types] if isinstance(o_types, (list, tuple)) \
        else [asdatatype(o_types)] * size
    if len(counts) != size or len(displs) != size or len(types) != size:
        raise ValueError(f"expecting {size} items")
    nbytes = []
    for c, dt in zip(counts, types):
        if c and dt.Get_extent()[1] != dt.Get_size():
            raise_error(ERR_UNSUPPORTED_OPERATION,
                        "Alltoallw: datatypes with gaps are not supported")
        nbytes.append(c * dt.Get_size())
    if is_bottom(o_buf):
        out = []
        for n, d, dt in zip(nbytes, displs, types):
            if n == 0:
                out.append(np.empty(0, np.uint8))
                continue
            # absolute addresses: the displacement plus the datatype's lower
            # bound (a struct type built over Get_address results)
            cbuf = (ctypes.c_uint8 * n).from_address(d + dt.Get_true_extent()[0])
            out.append(np.ctypeslib.as_array(cbuf))
        return out, None
    raw = getbuffer(o_buf, readonly)
    if raw.device:
        raw.stage_in(0, raw.raw.size)
    arr = _u8(raw.raw)
    for n, d in zip(nbytes, displs):
        if n and d + n > arr.size:
            raise ValueError("message: counts and displacements exceed the buffer")
    return blocks(arr, nbytes, displs), raw


def finish_raw(raw):
    """Copy a received device buffer back from its host staging copy."""
    if raw is not None and raw.device:
        raw.stage_out(0, raw.raw.size)
