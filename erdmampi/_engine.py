"""The only importer of the cffi engine (erdmampi._erdma).

Thin handle wrappers over ext/include/erdma.h: the engine speaks world ranks,
byte counts and 32-bit context ids.  Blocking calls release the GIL (cffi does
that for every call) and wait in slices so that Ctrl-C still works.
"""
from __future__ import annotations

import sys
import threading

from . import config
from ._erdma import ffi, lib

ANY_SOURCE = lib.ERDMA_ANY_SOURCE
ANY_TAG = lib.ERDMA_ANY_TAG

ERR_INVAL = lib.ERDMA_ERR_INVAL
ERR_NOMEM = lib.ERDMA_ERR_NOMEM
ERR_TRUNCATE = lib.ERDMA_ERR_TRUNCATE
ERR_TIMEOUT = lib.ERDMA_ERR_TIMEOUT
ERR_PEER = lib.ERDMA_ERR_PEER
ERR_RANK = lib.ERDMA_ERR_RANK
ERR_STATE = lib.ERDMA_ERR_STATE
ERR_AUTH = lib.ERDMA_ERR_AUTH
ERR_PKTIO = lib.ERDMA_ERR_PKTIO
ERR_PEER_PENDING = lib.ERDMA_ERR_PEER_PENDING

PAIR_CMA_MAX = lib.ERDMA_PAIR_CMA_MAX     # a two-rank Alltoall's blocks below: by flags and CMA
PAIR_BCAST_MAX = lib.ERDMA_PAIR_BCAST_MAX  # a two-rank Bcast below: by flags and CMA
PAIR_DATA_MAX = lib.ERDMA_PAIR_DATA_MAX   # a two-rank Bcast by flags, at most

CC_ALGOS = {"auto": lib.ERDMA_CC_AUTO, "reno": lib.ERDMA_CC_RENO,
            "cubic": lib.ERDMA_CC_CUBIC, "bbr": lib.ERDMA_CC_BBR, "bbr2": lib.ERDMA_CC_BBR2}

# Engine.create(**tuning): name -> allowed range
TUNING = {
    "stream_window": (1 << 16, 1 << 40), "conn_window": (1 << 16, 1 << 40),
    "max_stream_window": (1 << 16, 1 << 40), "max_conn_window": (1 << 16, 1 << 40),
    "sock_buf": (0, (1 << 31) - 1), "data_streams": (0, 16), "lanes": (0, 8),
    "chunk_size": (4096, 1 << 30), "shm_eager_limit": (0, 1 << 30),
    "shm_bulk_cma_min": (0, 1 << 30), "shm_p2p_cma_min": (0, 1 << 30),
    "shm_p2p_split_min": (0, 1 << 30),
    "unexpected_max": (1 << 16, 1 << 44), "recv_alloc_max": (1, 1 << 50),
    "shm_unexpected_max": (1 << 16, 1 << 44),
}

PKTIO_KINDS = {"udp": lib.ERDMA_PKTIO_UDP, "dpdk": lib.ERDMA_PKTIO_DPDK}
NO_DPDK = "this build has no DPDK support: install libdpdk-dev and rebuild"


def dpdk_plugin_path() -> str:
    """File of the DPDK backend (erdmampi._erdma_dpdk), which the engine
    dlopens; "" when this build has none (the engine then says so)."""
    try:
        from . import _erdma_dpdk
    except ImportError as exc:
        if "No module named" in str(exc):
            return ""
        raise EngineError(ERR_PKTIO, f"cannot load the DPDK backend: {exc}") from None
    if not _erdma_dpdk.lib.erdma_dpdk_built():
        return ""
    return _erdma_dpdk.__file__


_SLICE = 0.5  # seconds a blocking call waits before checking for signals


def strerror(code: int) -> str:
    return ffi.string(lib.erdma_strerror(code)).decode()


def cpu_settle() -> None:
    """Clear the upper halves of this thread's AVX registers (erdma_cpu.c):
    code that leaves them in use (the ChaCha20-Poly1305 that seals the
    rendezvous records) slows every later SSE instruction of the thread,
    NumPy's included, until something does."""
    lib.erdma_cpu_settle()


def cpu_upper_in_use() -> int | None:
    """Whether this thread's AVX upper halves are in use (None: unknown)."""
    v = lib.erdma_cpu_upper_in_use()
    return None if v < 0 else bool(v)


_INTERRUPTED = -(1 << 30)   # not an ERDMA_ERR_* code: the wait raised (_pair_run)


def _pair_wait_slices(arg, e, slot):
    """erdma_pair_waiter.wait for _pair_run: erdma_pair_wait in slices (the
    GIL released in each); an exception (a signal's handler) is kept in the
    run's list and ends the protocol."""
    try:
        while (rc := lib.erdma_pair_wait(e, slot, _SLICE)) == ERR_TIMEOUT:
            pass
        return rc
    except BaseException as exc:
        ffi.from_handle(arg).append(exc)
        return _INTERRUPTED


_PAIR_WAIT = ffi.callback("int(void *, erdma_engine *, int)", _pair_wait_slices,
                          error=_INTERRUPTED)


class EngineError(Exception):
    """An ERDMA_ERR_* code from the C engine (mapped to MPI.Exception above)."""

    def __init__(self, code: int, what: str = ""):
        self.code = code
        msg = strerror(code)
        super().__init__(f"{what}: {msg}" if what else msg)


def _check(rc: int, what: str = "") -> None:
    if rc != 0:
        raise EngineError(rc, what)


class RawStatus:
    __slots__ = ("source", "tag", "error", "cancelled", "nbytes")

    def __init__(self, st=None):
        if st is None:
            self.source, self.tag, self.error, self.cancelled, self.nbytes = -1, -1, 0, False, 0
        else:
            self.source, self.tag, self.error = st.source, st.tag, st.error
            self.cancelled, self.nbytes = bool(st.cancelled), st.nbytes

    def __repr__(self):
        return (f"RawStatus(source={self.source}, tag={self.tag}, error={self.error}, "
                f"cancelled={self.cancelled}, nbytes={self.nbytes})")


class EngineRequest:
    """One engine request.  Holds the Python buffer alive until completion."""

    __slots__ = ("_req", "_keep", "_status", "_engine")

    def __init__(self, engine, req, keep):
        self._engine = engine
        self._req = req
        self._keep = keep
        self._status = None

    @property
    def done(self) -> bool:
        return self._status is not None

    def test(self):
        if self._status is None:
            done = ffi.new("int *")
            st = ffi.new("erdma_status *")
            rc = lib.erdma_req_test(self._req, done, st)
            if not done[0]:
                if rc:  # ERR_PEER_PENDING: still posted
                    raise EngineError(rc, "test")
                return None
            self._status = RawStatus(st)
        return self._status

    def wait(self, timeout: float | None = None) -> RawStatus:
        if self._status is not None:
            return self._status
        st = ffi.new("erdma_status *")
        if timeout is None:
            rc = _req_wait(self._req, _SLICE, st)
            while rc:
                if rc != ERR_TIMEOUT:
                    raise EngineError(rc, "wait")
                rc = _req_wait(self._req, _SLICE, st)
            self._status = RawStatus(st)
            return self._status
        left = timeout
        while True:
            step = _SLICE if left is None else min(_SLICE, max(left, 0.0))
            rc = lib.erdma_req_wait(self._req, step, st)
            if rc == 0:
                self._status = RawStatus(st)
                return self._status
            if rc != ERR_TIMEOUT:
                raise EngineError(rc, "wait")
            if left is not None:
                left -= step
                if left <= 0:
                    raise EngineError(ERR_TIMEOUT, "wait")

    def wait_blocking(self) -> RawStatus:
        """wait() for a blocking call: a receive from ANY_SOURCE whose
        communicator lost a member is withdrawn and fails (ERR_PEER) instead
        of staying posted (ERR_PEER_PENDING)."""
        while True:
            try:
                return self.wait()
            except EngineError as e:
                if e.code != ERR_PEER_PENDING:
                    raise
                lib.erdma_req_withdraw_failed(self._req)

    def cancel(self) -> None:
        if self._req is not None:
            lib.erdma_req_cancel(self._req)

    def abort(self) -> None:
        """Withdraw the request whatever its state (error paths): the engine
        never touches its buffer again."""
        if self._req is not None:
            lib.erdma_req_abort(self._req)

    def take(self) -> bytearray:
        """Copy out the engine-allocated payload of an alloc receive."""
        st = self.wait()
        data = lib.erdma_req_data(self._req)
        if data == ffi.NULL or st.nbytes == 0:
            return bytearray()
        return bytearray(ffi.buffer(data, st.nbytes))

    def view(self):
        """Zero-copy view of an alloc receive's payload (valid until free)."""
        st = self.wait()
        data = lib.erdma_req_data(self._req)
        return ffi.buffer(data, st.nbytes) if st.nbytes else b""

    def free(self) -> None:
        """Release the handle; a pending request is parked (with the buffers it
        uses) until the engine completes it."""
        if self._req is None:
            return
        if self.test() is None:
            with _deferred_lock:
                _deferred.append(self)
            return
        lib.erdma_req_free(self._req)
        self._req = None
        self._keep = None

    def __del__(self):
        try:
            if self._req is not None and self._status is not None:
                lib.erdma_req_free(self._req)
        except Exception:
            pass


class EngineMessage:
    """A message removed from the queue by a matched probe."""

    __slots__ = ("_msg", "source", "tag", "nbytes")

    def __init__(self, msg, st: RawStatus):
        self._msg = msg
        self.source, self.tag, self.nbytes = st.source, st.tag, st.nbytes


def waitany(reqs) -> int:
    """Index of a completed request among reqs: EngineRequests and request
    addresses (ints, 0: none), None entries ignored; -1 if none is active."""
    handles = []
    for r in reqs:
        if type(r) is int:
            handles.append(_cast("erdma_req *", r) if r else ffi.NULL)
        elif r is not None and r.done:
            return len(handles)
        else:
            handles.append(r._req if r is not None and r._req is not None else ffi.NULL)
    if all(h == ffi.NULL for h in handles):
        return -1
    arr = ffi.new("erdma_req *[]", handles)
    idx = ffi.new("int *")
    while True:
        rc = lib.erdma_req_waitany(arr, len(handles), _SLICE, idx)
        if rc == 0:
            return idx[0]
        if rc != ERR_TIMEOUT:
            raise EngineError(rc, "waitany")


_deferred: list = []  # freed by the user but still pending in the engine
_deferred_lock = threading.Lock()


def _reap_deferred() -> None:
    if not _deferred:
        return
    with _deferred_lock:
        pending = list(_deferred)
        _deferred.clear()
    for r in pending:
        r.free()  # re-parks itself if still pending


def _ptr(addr):
    return ffi.cast("void *", addr)


#: ``buffer_pointer(obj)``: a pointer to the first byte of ``obj``, a
#: C-contiguous buffer-protocol object; it holds a buffer export of ``obj``
#: (keeping it alive and its size fixed).  Every ``addr`` argument below takes
#: one as well as an integer.
buffer_pointer = ffi.from_buffer


def _wait_free(req, keep):
    """Wait for ``req`` and free it: its ``erdma_status`` (cffi struct).  If the
    wait is interrupted the request is parked with ``keep`` (see free)."""
    st = _new("erdma_status *")
    try:
        rc = _req_wait(req, _SLICE, st)
        while rc:
            if rc == ERR_PEER_PENDING:  # blocking: withdrawn, fails with ERR_PEER
                lib.erdma_req_withdraw_failed(req)
            elif rc != ERR_TIMEOUT:
                raise EngineError(rc, "wait")
            rc = _req_wait(req, _SLICE, st)
    except BaseException:
        EngineRequest(None, req, keep).free()
        raise
    _req_free(req)
    return st


def _blocking_rest(rc, out, keep, what):
    """erdma_send/erdma_recv returned ``rc``: wait on for a request still
    pending after the first slice, else raise."""
    if rc != ERR_TIMEOUT or out.left == ffi.NULL:
        raise EngineError(rc, what)
    return _wait_free(out.left, keep)


class _Scratch(threading.local):
    """Per-thread result struct of the *_plain calls (read before returning)."""

    def __init__(self):
        self.out = ffi.new("erdma_blocking *")


_scratch = _Scratch()


# bound once for the lean blocking calls
_new = ffi.new
_cast = ffi.cast
_req_wait = lib.erdma_req_wait
_req_free = lib.erdma_req_free
_send = lib.erdma_send
_recv = lib.erdma_recv
_SEND_SYNC = lib.ERDMA_SEND_SYNC
_SEND_BUFFERED = lib.ERDMA_SEND_BUFFERED

#: The CPython fast path of blocking Send/Recv (ext/src/erdma_pyfast.c), or
#: None (Python < 3.11): ``fast.send(state, buf, dest, tag)`` /
#: ``fast.recv(state, buf, source, tag)`` on a state from
#: :meth:`Engine.fast_state` return 0 (done), 1 (miss: nothing done, take the
#: normal path), a negative ERDMA error the operation completed with, or
#: ``(rc, left)`` (see :func:`fast_rest`); ``fast.recv_status`` answers
#: ``(error, world source, tag, nbytes)`` for a completed receive; ``fast.remember(state, recv, spec,
#: arr, datatype, arr.flags.num)`` makes ``spec`` (a plain array, alone or
#: with ``datatype``) known to it.  ``fast.allreduce(state, sendbuf, recvbuf,
#: op)`` likewise runs a small Allreduce made known by
#: ``fast.remember_allreduce`` (see erdmampi.comm), answering 0, 1 or ``(rc,
#: pending)`` (see :func:`fast_coll_rest`).  ``fast.sendrecv(state, sendbuf,
#: dest, sendtag, recvbuf, source, recvtag)`` runs a Sendrecv of two
#: remembered specs: 1, ``(rerr, world source, tag, nbytes, serr)`` or
#: ``(rc, rleft, sleft)`` (see :func:`fast_rest_sendrecv`).
fast = sys.modules.get("erdmampi._erdma_fast")
if fast is None and lib.erdma_pyfast_init(b"erdmampi._erdma_fast") == 0:
    fast = sys.modules.get("erdmampi._erdma_fast")


def fast_coll_rest(r, what) -> None:
    """A fast collective answered ``(rc, pending)``: continue it in slices
    (see :func:`coll_allreduce`), or raise."""
    rc, left = r
    pending = _new("erdma_coll **")
    if left:
        pending[0] = _cast("erdma_coll *", left)
    _coll_finish(rc, pending, what)


def fast_rest_bytes(r, what):
    """A fast recv_bytes answered ``(rc, left)``: wait on for the alloc
    receive still pending, or raise; ``(payload or None, error)``."""
    rc, left = r
    if rc != ERR_TIMEOUT or not left:
        raise EngineError(rc, what)
    req = EngineRequest(None, _cast("erdma_req *", left), None)
    try:
        raw = req.wait_blocking()
        return (None if raw.error else req.take()), raw.error
    finally:
        req.free()


def fast_rest_sendrecv(r, rkeep, skeep):
    """A fast sendrecv answered ``(rc, rleft, sleft)``: wait on for the
    receive and the send still pending (``rkeep``/``skeep`` keep their
    buffers alive), or raise; ``(receive's erdma_status, send's error)``."""
    rc, rleft, sleft = r
    if rc != ERR_TIMEOUT:
        raise EngineError(rc, "sendrecv")
    sreq = _cast("erdma_req *", sleft) if sleft else None
    try:
        rst = _wait_free(_cast("erdma_req *", rleft), rkeep)
    except BaseException:
        if sreq is not None:
            EngineRequest(None, sreq, skeep).free()
        raise
    return rst, (_wait_free(sreq, skeep).error if sreq is not None else 0)


def fast_rest(r, keep, what):
    """The ``erdma_status`` a fast call's ``(rc, left)`` answer ends with:
    wait on for a request still pending after the first slice, else raise."""
    rc, left = r
    if rc != ERR_TIMEOUT or not left:
        raise EngineError(rc, what)
    return _wait_free(_cast("erdma_req *", left), keep)


class Engine:
    """A rank's transport engine: one UDP socket, QUIC to every peer, matching."""

    def __init__(self, handle, rank: int, size: int):
        self._h = handle
        self.rank = rank
        self.size = size
        self._lock = threading.Lock()
        self._closed = False
        #: seconds, the longest gap between probes of a relayed peer's direct path
        self.direct_recheck = 0.0

    @classmethod
    def create(cls, rank: int = 0, size: int = 1, bind: str = "127.0.0.1", port: int = 0,
               cc: str = "auto", eager_limit: int = 65536, idle_timeout: float = 60.0,
               connect_timeout: float = 60.0, max_udp_payload: int = 0,
               spin_us: int = 50, verbose: int = 0, keepalive: float | None = None,
               path_timeout: float = 5.0, direct_recheck: float | None = None,
               pktio: str = "udp",
               dpdk_eal: str = "", dpdk_port: int = 0, dpdk_queue: int = 0,
               dpdk_prefix: int = 24, dpdk_gateway: str = "", dpdk_neigh: str = "",
               dpdk_poll_us: int = 200, hello_timeout: float | None = None,
               insecure: bool | None = None, **tuning) -> "Engine":
        """``cc``: "auto" (BBR to other hosts, CUBIC over loopback) or an algorithm.
        ``keepalive``: seconds of idleness before a QUIC PING (keeps NAT bindings
        open); None: idle_timeout / 4, 0: off.  ``path_timeout``: seconds a
        fallback relay waits on a silent direct path (:meth:`set_peer_relay`);
        ``direct_recheck``: the longest gap in seconds between its probes of the
        direct path while on the relay (None: ``ERDMA_DIRECT_RECHECK``, 0: none).
        ``tuning`` (None or absent: the engine's default): stream_window,
        conn_window, max_stream_window, max_conn_window, sock_buf (bytes),
        data_streams (count), chunk_size (bytes), lanes (QUIC connections per
        peer on another host, 0: automatic), shm_eager_limit, shm_bulk_cma_min, shm_p2p_cma_min,
        shm_p2p_split_min,
        unexpected_max (unexpected-message bytes held per peer before its
        sending is held back), shm_unexpected_max (the same for a rank of
        this host while nothing here waits on a peer), recv_alloc_max (largest
        message an allocating receive takes) (bytes); see docs/design.md.
        ``pktio``: "udp" (kernel socket) or "dpdk"; the ``dpdk_*`` keywords
        configure the latter (docs/dpdk.md): EAL arguments, port id, queue,
        prefix length of the subnet ``bind`` is on, gateway, static
        neighbours "ip=mac,...", longest idle sleep of the poller (µs).
        ``hello_timeout``: seconds a connection this engine accepts has, from
        its first packet, to finish the handshake and send its HELLO (None:
        ``ERDMA_HELLO_TIMEOUT`` or 10).  ``insecure``: let :meth:`set_peer`
        take an empty fingerprint, which accepts any certificate or none
        (None: true if ``ERDMA_INSECURE`` is 1, yes, true or on); for tests
        and trusted networks only."""
        if cc not in CC_ALGOS:
            raise ValueError(f"unknown congestion control {cc!r}; choose one of {sorted(CC_ALGOS)}")
        if pktio not in PKTIO_KINDS:
            raise ValueError(f"unknown packet I/O {pktio!r}; choose one of {sorted(PKTIO_KINDS)}")
        for name, value, lo, hi in (("dpdk_port", dpdk_port, 0, 65535),
                                    ("dpdk_queue", dpdk_queue, 0, 65535),
                                    ("dpdk_prefix", dpdk_prefix, 1, 32),
                                    ("dpdk_poll_us", dpdk_poll_us, 1, 1000000)):
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")
        cfg = ffi.new("erdma_config *")
        lib.erdma_config_default(cfg)
        for name, value in tuning.items():
            if name not in TUNING:
                raise TypeError(f"Engine.create() got an unexpected keyword argument {name!r}")
            if value is None:
                continue
            lo, hi = TUNING[name]
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")
            if name == "shm_bulk_cma_min" and value == 0:
                value = (1 << 64) - 1       # never (the engine's 0 is: measure)
            setattr(cfg, name, value)
        bind_c = ffi.new("char[]", bind.encode())
        cfg.rank, cfg.size, cfg.bind_addr, cfg.port = rank, size, bind_c, port
        cfg.cc_algo = CC_ALGOS[cc]
        cfg.eager_limit = eager_limit
        cfg.idle_timeout = idle_timeout
        cfg.handshake_timeout = connect_timeout
        cfg.max_udp_payload = max_udp_payload
        cfg.spin_us = spin_us
        cfg.verbose = int(verbose)  # 2: path statistics (cwnd, RTT, rates) every second
        # diagnostics and test switches: the C engine reads no environment
        if config.get("ERDMA_CC_LOG"):
            cfg.cc_log = 2 if config.get("ERDMA_CC_LOG_ALL") else 1
        cfg.path_log_ms = config.get("ERDMA_PATH_LOG_MS")
        cfg.pace = int(config.get("ERDMA_PACE"))
        cfg.shm_cma_bounce = {"auto": 0, "on": 1, "off": 2}[config.get("ERDMA_SHM_CMA_BOUNCE")]
        cfg.shm_demote = {"auto": 0, "on": 1, "off": 2}[config.get("ERDMA_SHM_DEMOTE")]
        cfg.max_pacing_rate = config.get("ERDMA_MAX_PACING_RATE") or 0
        cfg.pace_learn = int(config.get("ERDMA_PACE_LEARN"))
        cfg.launcher_pid = config.get("ERDMA_LAUNCHER_PID") or 0
        cfg.trace_msgs = config.get("ERDMA_TRACE_MSGS")
        cfg.dpdk_copy = int(config.get("ERDMA_DPDK_COPY"))
        cfg.dpdk_nobuf_every = config.get("ERDMA_DPDK_TEST_NOBUF_EVERY")
        if keepalive is not None:
            if not keepalive >= 0:
                raise ValueError(f"keepalive must be >= 0 seconds, not {keepalive!r}")
            cfg.keepalive = keepalive
        if not path_timeout > 0:
            raise ValueError(f"path_timeout must be > 0 seconds, not {path_timeout!r}")
        cfg.path_timeout = path_timeout
        if direct_recheck is None:
            direct_recheck = config.get("ERDMA_DIRECT_RECHECK")
        if not direct_recheck >= 0:
            raise ValueError(f"direct_recheck must be >= 0 seconds, not {direct_recheck!r}")
        cfg.direct_recheck = direct_recheck
        if hello_timeout is None:
            hello_timeout = config.get("ERDMA_HELLO_TIMEOUT")
        if not hello_timeout > 0:
            raise ValueError(f"hello_timeout must be > 0 seconds, not {hello_timeout!r}")
        cfg.hello_timeout = hello_timeout
        if insecure is None:
            insecure = config.get("ERDMA_INSECURE")
        cfg.insecure = int(bool(insecure))
        keep = []  # C strings the engine reads during erdma_engine_new

        def cstr(text):
            keep.append(ffi.new("char[]", text.encode()))
            return keep[-1]

        cfg.pktio = PKTIO_KINDS[pktio]
        if pktio == "dpdk":
            cfg.dpdk_plugin = cstr(dpdk_plugin_path())
            cfg.dpdk_eal = cstr(dpdk_eal)
            cfg.dpdk_port, cfg.dpdk_queue = dpdk_port, dpdk_queue
            cfg.dpdk_prefix, cfg.dpdk_poll_us = dpdk_prefix, dpdk_poll_us
            cfg.dpdk_gateway = cstr(dpdk_gateway)
            cfg.dpdk_neigh = cstr(dpdk_neigh)
        out = ffi.new("erdma_engine **")
        rc = lib.erdma_engine_new(cfg, out)
        if rc != 0:
            detail = ffi.string(lib.erdma_last_error()).decode(errors="replace")
            raise EngineError(rc, f"engine start ({pktio}, bind {bind}:{port})"
                              + (f": {detail}" if detail else ""))
        eng = cls(out[0], rank, size)
        eng.direct_recheck = direct_recheck
        eng.pace = bool(cfg.pace)
        return eng

    # -- bootstrap
    @property
    def local_addr(self) -> str:
        buf = ffi.new("char[128]")
        lib.erdma_engine_local_addr(self._h, buf, 128)
        return ffi.string(buf).decode()

    @property
    def fingerprint(self) -> str:
        buf = ffi.new("char[80]")
        lib.erdma_engine_fingerprint(self._h, buf, 80)
        return ffi.string(buf).decode()

    def set_peer(self, rank: int, host: str, port: int, fingerprint: str | None = None) -> None:
        """``fingerprint``: SHA-256 (hex) of the certificate rank ``rank`` must
        present; empty or None (any certificate) only in an insecure engine."""
        rc = lib.erdma_engine_set_peer(self._h, rank, host.encode(), port,
                                       (fingerprint or "").encode())
        if rc == ERR_AUTH:
            raise EngineError(rc, f"peer {rank}: no certificate fingerprint; only an insecure "
                                  "engine (Engine.create(insecure=True), ERDMA_INSECURE=1) "
                                  "accepts any certificate")
        _check(rc, f"peer {rank}")

    def shm_setup(self, job: str, local_ranks, ring_bytes: int = 2 << 20,
                  cma: bool = True) -> None:
        """Use shared memory with these ranks (all on this host, this one included);
        cma: large messages are read from the sender's memory with one copy."""
        ranks = sorted(local_ranks)
        arr = ffi.new("int[]", ranks)
        _check(lib.erdma_engine_shm_setup(self._h, job.encode(), arr, len(ranks), ring_bytes,
                                          int(cma)), "shared memory setup")

    def connect(self) -> None:
        _check(lib.erdma_engine_connect(self._h), "connecting to peers")

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        lib.erdma_pyfast_invalidate()
        lib.erdma_engine_shutdown(self._h, timeout)

    def fast_state(self, ctx: int, ranks, me: int, tag_ub: int, seq):
        """A state for :data:`fast` calls of a communicator: point-to-point
        context ``ctx`` (collectives: ``ctx + 1``), world ranks ``ranks`` of
        its ranks 0..n-1, its own rank ``me``, and ``seq``, the iterator
        counting its collective calls (tag bases); None without :data:`fast`."""
        if fast is None or self._closed:
            return None
        return fast.new(int(_cast("uintptr_t", self._h)), self, ctx, ranks, me, tag_ub, _SLICE,
                        seq)

    def config(self) -> dict:
        """The numeric settings in effect (``TUNING``'s and the eager limits),
        measured ones included: ``shm_bulk_cma_min`` is None where the
        engine sends a collective's blocks to ranks of this host through
        the ring alone (never by CMA); ``shm_cma_bounce`` whether a CMA copy
        whose destination lies 1-63 bytes after its source modulo the page
        goes through a buffer (None where it was left to a measurement that
        did not run: no local peer, or CMA off); ``shm_demote`` whether lines
        written for a rank of this host go to the shared cache (CLDEMOTE;
        None without shared memory)."""
        cfg = ffi.new("erdma_config *")
        _check(lib.erdma_engine_config(self._h, cfg), "engine config")
        out = {k: getattr(cfg, k) for k in (*TUNING, "eager_limit")}
        if out["shm_bulk_cma_min"] in (0, (1 << 64) - 1):   # (0: shared memory not set up)
            out["shm_bulk_cma_min"] = None
        # True / False: an aliased CMA copy bounces or not (None: left to a measurement
        # that did not run)
        out["shm_cma_bounce"] = {1: True, 2: False}.get(cfg.shm_cma_bounce)
        # True / False: lines written for a rank of this host are demoted to the shared
        # cache or not (None: shared memory not set up)
        out["shm_demote"] = {1: True, 2: False}.get(cfg.shm_demote)
        return out

    def stats(self) -> dict:
        st = ffi.new("erdma_stats *")
        lib.erdma_engine_stats(self._h, st)
        return {k: getattr(st, k) for k in ("pkts_sent", "pkts_recv", "bytes_sent",
                                            "bytes_recv", "msgs_sent", "msgs_recv", "unexpected",
                                            "chunks_sent", "chunks_recv", "raw_queued",
                                            "raw_dropped", "relay_sent", "relay_recv",
                                            "to_relay", "to_direct", "direct_probes",
                                            "lane_chunks_sent", "lane_chunks_recv",
                                            "lanes_ready", "conns_pending", "retries_sent",
                                            "pending_dropped", "rate_reports_sent",
                                            "rate_reports_recv", "split_recvs",
                                            "split_pushes", "shm_demotes")}

    # -- message trace (tests)
    def trace_start(self, cap: int = 1 << 16) -> None:
        """Record, afresh, the next ``cap`` point-to-point messages this
        engine posts (its own and those of the C collectives); ``cap`` 0
        stops.  ``ERDMA_TRACE_MSGS`` starts one with the engine."""
        _check(lib.erdma_trace_start(self._h, int(cap)), "trace")

    def trace_take(self) -> list:
        """The records so far, oldest first, and forget them: tuples
        ``("send" | "recv", world peer, tag, bytes, context id)`` (a
        receive's bytes: its capacity).  Raises RuntimeError if some were
        dropped on a full trace."""
        out, recs = [], ffi.new("erdma_trace_rec[]", 1024)
        dropped = ffi.new("uint64_t *")
        lost = 0
        while True:
            k = lib.erdma_trace_take(self._h, recs, 1024, dropped)
            lost += dropped[0]
            out.extend(("send" if r.op == lib.ERDMA_TRACE_SEND else "recv", r.peer, r.tag,
                        r.nbytes, r.ctx) for r in recs[0:k])
            if k < 1024:
                break
        if lost:
            raise RuntimeError(f"message trace full: {lost} records dropped")
        return out

    def peer_error(self, rank: int) -> int:
        return lib.erdma_engine_peer_error(self._h, rank)

    def peer_stat(self, rank: int) -> dict:
        """QUIC figures towards ``rank`` (see erdma_peer_stat)."""
        st = ffi.new("erdma_peer_stat *")
        _check(lib.erdma_engine_peer_stat(self._h, rank, st), f"statistics of rank {rank}")
        return {k: getattr(st, k) for k in ("connections", "lost", "srtt_us", "min_rtt_us",
                                            "rttvar_us", "cwnd", "bytes_in_flight",
                                            "pto_count", "lost_packets",
                                            "delivery_rate_bps")}

    def describe(self, limit: int = 20) -> str:
        """The pending operations, one per line (for stack dumps)."""
        if self._closed:
            return "  engine closed\n"
        buf = ffi.new("char[]", 16384)
        lib.erdma_engine_describe(self._h, buf, len(buf), limit)
        return ffi.string(buf).decode("utf-8", "replace")

    # -- two-rank Barriers by flags (ext/src/erdma_shm.c)
    def pair_barrier(self, peer: int, ctx: int) -> bool:
        """A Barrier with world rank ``peer`` by flags in shared memory when
        the two agreed on them for context ``ctx`` at an earlier Barrier:
        True when done, False (nothing done) when they did not."""
        slot = lib.erdma_pair_find(self._h, peer, ctx)
        if slot < 0:
            return False
        lib.erdma_pair_arrive(self._h, slot)
        self._pair_wait(slot, "barrier")
        return True

    def pair_bcast(self, peer: int, ctx: int, addr, nbytes: int, isroot: bool) -> bool:
        """A Bcast of fewer than PAIR_BCAST_MAX bytes at ``addr`` with world
        rank ``peer`` by flags, as pair_barrier: True when done, False
        (nothing done) when the two did not agree on flags.  Above
        PAIR_DATA_MAX: the buffers' addresses by flags, the bytes copied by
        both with CMA (erdma_pair_write)."""
        slot = self._pair_slot(peer, ctx, nbytes, PAIR_BCAST_MAX)
        if slot < 0:
            return False
        self._pair_run("bcast", lib.erdma_pair_bcast, slot, ffi.cast("char *", addr), nbytes,
                       int(isroot))
        return True

    def pair_allgather(self, peer: int, ctx: int, saddr, raddr, blk: int, me: int) -> bool:
        """A two-rank Allgather of ``blk``-byte blocks (at most PAIR_DATA_MAX)
        with world rank ``peer`` by flags, as pair_bcast; ``saddr`` None: in
        place in ``raddr``, where this rank's block is block ``me``."""
        slot = self._pair_slot(peer, ctx, blk)
        if slot < 0:
            return False
        rbuf = ffi.cast("char *", raddr)
        mine, theirs = rbuf + me * blk, rbuf + (1 - me) * blk
        if saddr is not None:
            ffi.memmove(mine, ffi.cast("char *", saddr), blk)
        self._pair_run("allgather", lib.erdma_pair_exchange, slot, mine, theirs, blk, ffi.NULL,
                       ffi.NULL, 0)
        return True

    def pair_alltoall(self, peer: int, ctx: int, saddr, raddr, blk: int, me: int) -> bool:
        """A two-rank Alltoall of ``blk``-byte blocks (below PAIR_CMA_MAX)
        with world rank ``peer`` (erdma_pair_alltoall: by flags, and by CMA
        above PAIR_DATA_MAX); ``saddr`` None: in place, where this rank's
        block is block ``me``."""
        slot = self._pair_slot(peer, ctx, blk, PAIR_CMA_MAX)
        if slot < 0:
            return False
        sbuf = ffi.NULL if saddr is None else ffi.cast("char *", saddr)
        self._pair_run("alltoall", lib.erdma_pair_alltoall, slot, sbuf,
                       ffi.cast("char *", raddr), blk, me)
        return True

    def _pair_run(self, what: str, fn, slot: int, *args) -> None:
        """``fn`` (erdma_pair_alltoall, _bcast, _exchange) on ``slot``,
        waiting as _pair_wait does: in slices, a signal's handler between
        two; an exception it raises ends the protocol (what was counted
        withdrawn) and is raised here."""
        raised = []
        handle = ffi.new_handle(raised)
        waiter = ffi.new("erdma_pair_waiter *", {"wait": _PAIR_WAIT, "arg": handle,
                                                 "interrupted": _INTERRUPTED})
        rc = fn(self._h, slot, *args, waiter)
        if raised:
            raise raised[0]
        _check(rc, what)

    def _pair_slot(self, peer: int, ctx: int, nbytes: int, below=PAIR_DATA_MAX + 1) -> int:
        """The slot agreed with world rank ``peer`` for ``nbytes`` by flags
        on context ``ctx``, or -1 (none, or ``below`` bytes or more)."""
        if not 0 < nbytes < below:
            return -1
        return lib.erdma_pair_find(self._h, peer, ctx)

    def _pair_wait(self, slot: int, what: str) -> None:
        """erdma_pair_wait in slices (the GIL released in each; a signal's
        handler runs between two)."""
        while (rc := lib.erdma_pair_wait(self._h, slot, _SLICE)) == ERR_TIMEOUT:
            pass
        _check(rc, what)

    # -- failures and ANY_SOURCE receives (ext/src/erdma_ulfm.c)
    def ctx_group(self, ctx: int, ranks) -> None:
        """The world ranks a receive on context ``ctx`` can match (empty: forget ctx)."""
        arr = ffi.new("int[]", list(ranks) or [0])
        _check(lib.erdma_ctx_group(self._h, ctx, arr, len(ranks)), "communicator group")

    def ctx_failed(self, ctx: int):
        """``(failed world ranks of ctx in failure order, how many are acknowledged)``."""
        nacked = ffi.new("int *")
        n = lib.erdma_ctx_failed(self._h, ctx, ffi.NULL, 0, nacked)
        cap = max(n, 1)
        out = ffi.new("int[]", cap)
        n = lib.erdma_ctx_failed(self._h, ctx, out, cap, nacked)
        return [out[i] for i in range(min(n, cap))], nacked[0]

    def ctx_ack(self, ctx: int, upto: int) -> int:
        """Acknowledge the first ``upto`` failures of ctx; how many are acknowledged."""
        rc = lib.erdma_ctx_ack(self._h, ctx, min(int(upto), (1 << 31) - 1))
        _check(min(rc, 0), "acknowledging failures")
        return rc

    # -- NAT traversal (ext/src/erdma_nat.c; docs/wire.md, "Demultiplexing")
    def raw_send(self, data: bytes, host: str, port: int) -> None:
        """Send one datagram (STUN, TURN, ICE checks) from the engine's socket."""
        data = bytes(data)
        _check(lib.erdma_engine_raw_send(self._h, data, len(data), host.encode(), int(port)),
               f"raw send to {host}:{port}")

    def raw_recv(self, timeout: float):
        """The next STUN/TURN datagram the engine set aside, as ``(data, host,
        port)``, or None after ``timeout`` seconds.  Works before :meth:`connect`."""
        buf = ffi.new("uint8_t[]", 65536)
        n = ffi.new("size_t *")
        host = ffi.new("char[64]")
        port = ffi.new("int *")
        left = max(0.0, float(timeout))
        while True:
            step = min(_SLICE, left)
            rc = lib.erdma_engine_raw_recv(self._h, buf, 65536, n, host, 64, port, step)
            if rc == 0:
                return bytes(ffi.buffer(buf, n[0])), ffi.string(host).decode(), port[0]
            if rc != ERR_TIMEOUT:
                raise EngineError(rc, "raw recv")
            left -= step
            if left <= 0:
                return None

    def add_turn_server(self, host: str, port: int) -> None:
        """Datagrams from this TURN server are demultiplexed (ChannelData vs the rest)."""
        _check(lib.erdma_engine_add_turn_server(self._h, host.encode(), int(port)),
               f"TURN server {host}:{port}")

    def set_peer_relay(self, rank: int, turn_host: str, turn_port: int, channel: int,
                       peer_host: str, peer_port: int, fallback: bool = False,
                       relay_first: bool = False) -> None:
        """Tunnel QUIC to ``rank`` through our TURN allocation on turn_host:turn_port,
        channel ``channel`` bound to peer_host:peer_port; always, or (``fallback``)
        once the direct path falls silent for ``path_timeout`` seconds.  A
        fallback tunnel is left for the direct path when the peer's packets come
        that way again, found by probes every ``direct_recheck`` seconds at most;
        ``relay_first``: such a tunnel that starts on the relay (the checks
        found no direct path in time)."""
        if relay_first:
            mode = lib.ERDMA_RELAY_FIRST
        else:
            mode = lib.ERDMA_RELAY_FALLBACK if fallback else lib.ERDMA_RELAY_ALWAYS
        _check(lib.erdma_engine_set_peer_relay(self._h, rank, turn_host.encode(), int(turn_port),
                                               int(channel), peer_host.encode(), int(peer_port),
                                               mode), f"relay for rank {rank}")

    def set_peer_redirect(self, rank: int, relay_host: str, relay_port: int,
                          relay_first: bool = True) -> None:
        """Reach ``rank`` through *its* TURN allocation: packets go plainly to its
        relayed address relay_host:relay_port, and QUIC packets from there are
        its own.  ``relay_first``: until the direct path (the address of
        :meth:`set_peer`) carries the peer's packets, as with
        :meth:`set_peer_relay`; else always."""
        mode = lib.ERDMA_RELAY_FIRST if relay_first else lib.ERDMA_RELAY_ALWAYS
        _check(lib.erdma_engine_set_peer_relay(self._h, rank, ffi.NULL, 0, 0,
                                               relay_host.encode(), int(relay_port), mode),
               f"relay for rank {rank}")

    def clear_peer_relay(self, rank: int) -> None:
        _check(lib.erdma_engine_set_peer_relay(self._h, rank, ffi.NULL, 0, 0, ffi.NULL, 0,
                                               lib.ERDMA_RELAY_OFF), f"relay for rank {rank}")

    def peer_route(self, rank: int) -> str:
        """How packets to ``rank`` travel now: "direct", "relay", "shm" or "self"."""
        out = ffi.new("int *")
        _check(lib.erdma_engine_peer_route(self._h, rank, out), f"route to rank {rank}")
        return _ROUTES[out[0]]

    # -- point to point
    def _post_send(self, addr, nbytes, dest, tag, ctx, sync, buffered=False):
        if _deferred:
            _reap_deferred()
        out = _new("erdma_req **")
        rc = lib.erdma_isend(self._h, _cast("void *", addr), nbytes, dest, tag, ctx,
                             (_SEND_SYNC if sync else 0) | (_SEND_BUFFERED if buffered else 0),
                             out)
        if rc:
            raise EngineError(rc, "send")
        return out[0]

    def _post_recv(self, addr, nbytes, source, tag, ctx):
        out = _new("erdma_req **")
        rc = lib.erdma_irecv(self._h, _cast("void *", addr), nbytes, source, tag, ctx, 0, out)
        if rc:
            raise EngineError(rc, "recv")
        return out[0]

    def isend(self, addr: int, nbytes: int, dest: int, tag: int, ctx: int, sync: bool = False,
              keep=None, buffered: bool = False) -> EngineRequest:
        """``buffered``: complete without the receiver (Bsend) where the
        size allows an eager message."""
        return EngineRequest(self, self._post_send(addr, nbytes, dest, tag, ctx, sync, buffered),
                             keep)

    def irecv(self, addr: int, nbytes: int, source: int, tag: int, ctx: int,
              keep=None) -> EngineRequest:
        return EngineRequest(self, self._post_recv(addr, nbytes, source, tag, ctx), keep)

    def send(self, addr, nbytes: int, dest: int, tag: int, ctx: int, sync: bool = False,
             keep=None, buffered: bool = False):
        """Blocking :meth:`isend` + wait without a request object, in one
        engine call: a struct with the fields of ``erdma_status`` (as
        RawStatus).  ``addr``: an int or a pointer cdata (``buffer_pointer``).
        An interrupted wait leaves the request to the engine with ``keep``."""
        if _deferred:
            _reap_deferred()
        out = _new("erdma_blocking *")
        rc = _send(self._h, _cast("void *", addr) if type(addr) is int else addr, nbytes,
                   dest, tag, ctx,
                   (_SEND_SYNC if sync else 0) | (_SEND_BUFFERED if buffered else 0), _SLICE, out)
        if rc:
            return _blocking_rest(rc, out, addr if keep is None else keep, "send")
        return out

    def send_plain(self, ptr, nbytes: int, dest: int, tag: int, ctx: int, keep) -> int:
        """:meth:`send` of a pointer cdata: only the ERDMA error the send
        completed with (0: success)."""
        if _deferred:
            _reap_deferred()
        out = _scratch.out
        rc = _send(self._h, ptr, nbytes, dest, tag, ctx, 0, _SLICE, out)
        if rc:
            return _blocking_rest(rc, out, keep, "send").error
        return out.error

    def recv_plain(self, ptr, nbytes: int, source: int, tag: int, ctx: int, keep) -> int:
        """:meth:`recv` of a pointer cdata: only the ERDMA error the receive
        completed with (0: success)."""
        out = _scratch.out
        rc = _recv(self._h, ptr, nbytes, source, tag, ctx, _SLICE, out)
        if rc:
            return _blocking_rest(rc, out, keep, "recv").error
        return out.error

    def recv(self, addr, nbytes: int, source: int, tag: int, ctx: int, keep=None):
        """Blocking :meth:`irecv` + wait, as :meth:`send`."""
        out = _new("erdma_blocking *")
        rc = _recv(self._h, _cast("void *", addr) if type(addr) is int else addr, nbytes,
                   source, tag, ctx, _SLICE, out)
        if rc:
            return _blocking_rest(rc, out, addr if keep is None else keep, "recv")
        return out

    def irecv_alloc(self, source: int, tag: int, ctx: int) -> EngineRequest:
        out = ffi.new("erdma_req **")
        _check(lib.erdma_irecv(self._h, ffi.NULL, 0, source, tag, ctx, 1, out), "recv")
        return EngineRequest(self, out[0], None)

    def iprobe(self, source: int, tag: int, ctx: int):
        flag = ffi.new("int *")
        st = ffi.new("erdma_status *")
        _check(lib.erdma_iprobe(self._h, source, tag, ctx, flag, st), "iprobe")
        return RawStatus(st) if flag[0] else None

    def probe(self, source: int, tag: int, ctx: int) -> RawStatus:
        st = ffi.new("erdma_status *")
        while True:
            rc = lib.erdma_probe(self._h, source, tag, ctx, _SLICE, st)
            if rc == 0:
                return RawStatus(st)
            if rc != ERR_TIMEOUT:
                raise EngineError(rc, "probe")

    def improbe(self, source: int, tag: int, ctx: int):
        flag = ffi.new("int *")
        st = ffi.new("erdma_status *")
        msg = ffi.new("erdma_msg **")
        _check(lib.erdma_improbe(self._h, source, tag, ctx, flag, msg, st), "improbe")
        if not flag[0]:
            return None
        raw = RawStatus(st)
        return EngineMessage(msg[0], raw), raw

    def mprobe(self, source: int, tag: int, ctx: int):
        st = ffi.new("erdma_status *")
        msg = ffi.new("erdma_msg **")
        while True:
            rc = lib.erdma_mprobe(self._h, source, tag, ctx, _SLICE, msg, st)
            if rc == 0:
                raw = RawStatus(st)
                return EngineMessage(msg[0], raw), raw
            if rc != ERR_TIMEOUT:
                raise EngineError(rc, "mprobe")

    def imrecv(self, msg: EngineMessage, addr: int, nbytes: int, keep=None) -> EngineRequest:
        out = ffi.new("erdma_req **")
        handle, msg._msg = msg._msg, None
        if handle is None:
            raise EngineError(ERR_INVAL, "message already received")
        _check(lib.erdma_imrecv(self._h, handle, _ptr(addr), nbytes, 0, out), "mrecv")
        return EngineRequest(self, out[0], keep)

    def imrecv_alloc(self, msg: EngineMessage) -> EngineRequest:
        out = ffi.new("erdma_req **")
        handle, msg._msg = msg._msg, None
        if handle is None:
            raise EngineError(ERR_INVAL, "message already received")
        _check(lib.erdma_imrecv(self._h, handle, ffi.NULL, 0, 1, out), "mrecv")
        return EngineRequest(self, out[0], None)


_ROUTES = {lib.ERDMA_ROUTE_SELF: "self", lib.ERDMA_ROUTE_DIRECT: "direct",
           lib.ERDMA_ROUTE_RELAY: "relay", lib.ERDMA_ROUTE_SHM: "shm"}


# ---- schedules (ext/src/erdma_sched.c) ----

#: reduction op name -> ERDMA_OP_* (predefined ops the C reducer handles)
SCHED_OPS = {name: getattr(lib, "ERDMA_OP_" + name) for name in
             ("SUM", "PROD", "MAX", "MIN", "LAND", "LOR", "LXOR", "BAND", "BOR", "BXOR")}
#: element type name (NumPy's) -> ERDMA_DT_*
SCHED_DTYPES = {name: getattr(lib, "ERDMA_DT_" + name.upper()) for name in
                ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                 "uint64", "float32", "float64", "complex64", "complex128")}


def ranks_array(ranks):
    """``int[]`` cdata of a communicator's world ranks (for the coll_* calls)."""
    return ffi.new("int[]", list(ranks))


def _coll_finish(rc, pending, what):
    """Continue a small collective in slices until it ends; raise on error."""
    if rc == ERR_TIMEOUT and pending[0] != ffi.NULL:
        c = pending[0]
        try:
            while rc == ERR_TIMEOUT:
                rc = lib.erdma_coll_resume(c, _SLICE)
        except BaseException:  # interrupted between slices: withdraw it
            if rc == ERR_TIMEOUT:
                lib.erdma_coll_free(c)
            raise
    if rc:
        raise EngineError(rc, what)


def _coll_call(fn, what, *args):
    """Run an erdma_coll_* call (its last arguments ``_SLICE, pending``
    added here), continuing it in slices; raise on error."""
    pending = _new("erdma_coll **")
    rc = fn(*args, _SLICE, pending)
    if rc:
        _coll_finish(rc, pending, what)


def coll_allreduce(eng, saddr, raddr, count, op, dtype, cranks, n, me, tag, ctx):
    """Recursive-doubling Allreduce in one engine call (erdma_coll_allreduce);
    ``saddr`` None: in place; ``op``/``dtype``: ERDMA_OP_*/ERDMA_DT_*."""
    _coll_call(lib.erdma_coll_allreduce, "allreduce", eng._h,
               ffi.NULL if saddr is None else saddr, raddr, count, op, dtype, cranks, n, me,
               tag, ctx)


def coll_bcast(eng, addr, nbytes, root, cranks, n, me, tag, ctx):
    """Binomial Bcast in one engine call (erdma_coll_bcast); two ranks that
    agreed on flags: by flags, waited for in slices (signals)."""
    if n == 2 and eng.pair_bcast(cranks[1 - me], ctx, addr, nbytes, me == root):
        return
    _coll_call(lib.erdma_coll_bcast, "bcast", eng._h, addr, nbytes, root, cranks, n, me, tag,
               ctx)


def coll_barrier(eng, cranks, n, me, tag, ctx):
    """Dissemination barrier in one engine call (erdma_coll_barrier)."""
    _coll_call(lib.erdma_coll_barrier, "barrier", eng._h, cranks, n, me, tag, ctx)


def coll_alltoall(eng, saddr, raddr, blk, cranks, n, me, tag, ctx):
    """Direct Alltoall of ``blk``-byte blocks in one engine call
    (erdma_coll_alltoall); ``saddr`` None: in place.  Two ranks that agreed
    on flags: by flags, waited for in slices (signals)."""
    if n == 2 and eng.pair_alltoall(cranks[1 - me], ctx, saddr, raddr, blk, me):
        return
    _coll_call(lib.erdma_coll_alltoall, "alltoall", eng._h,
               ffi.NULL if saddr is None else saddr, raddr, blk, cranks, n, me, tag, ctx)


def coll_allgather(eng, saddr, raddr, blk, cranks, n, me, tag, ctx):
    """Direct Allgather of ``blk``-byte blocks in one engine call
    (erdma_coll_allgather); ``saddr`` None: in place.  Two ranks that agreed
    on flags: by flags, waited for in slices (signals)."""
    if n == 2 and eng.pair_allgather(cranks[1 - me], ctx, saddr, raddr, blk, me):
        return
    _coll_call(lib.erdma_coll_allgather, "allgather", eng._h,
               ffi.NULL if saddr is None else saddr, raddr, blk, cranks, n, me, tag, ctx)


def coll_reduce_scatter(eng, saddr, raddr, count, op, dtype, cranks, n, me, tag, ctx):
    """Ring Reduce_scatter_block in one engine call (erdma_coll_reduce_scatter);
    ``saddr`` None: in place (the n blocks in ``raddr``)."""
    _coll_call(lib.erdma_coll_reduce_scatter, "reduce_scatter", eng._h,
               ffi.NULL if saddr is None else saddr, raddr, count, op, dtype, cranks, n, me,
               tag, ctx)


def coll_gather(eng, saddr, raddr, blk, root, cranks, n, me, tag, ctx):
    """Linear Gather of ``blk``-byte blocks in one engine call (erdma_coll_gather);
    the root's ``saddr`` None: in place."""
    _coll_call(lib.erdma_coll_gather, "gather", eng._h, ffi.NULL if saddr is None else saddr,
               ffi.NULL if raddr is None else raddr, blk, root, cranks, n, me, tag, ctx)


def coll_scatter(eng, saddr, raddr, blk, root, cranks, n, me, tag, ctx):
    """Linear Scatter of ``blk``-byte blocks in one engine call (erdma_coll_scatter);
    the root's ``raddr`` None: in place."""
    _coll_call(lib.erdma_coll_scatter, "scatter", eng._h, ffi.NULL if saddr is None else saddr,
               ffi.NULL if raddr is None else raddr, blk, root, cranks, n, me, tag, ctx)


def coll_reduce(eng, saddr, raddr, count, op, dtype, root, cranks, n, me, tag, ctx):
    """Binomial Reduce in one engine call (erdma_coll_reduce); the root's
    ``saddr`` None: in place."""
    _coll_call(lib.erdma_coll_reduce, "reduce", eng._h, ffi.NULL if saddr is None else saddr,
               ffi.NULL if raddr is None else raddr, count, op, dtype, root, cranks, n, me,
               tag, ctx)


def coll_alltoall_bulk(eng, saddr, raddr, blk, pull_part, cranks, n, me, tag, ctx):
    """Alltoall of ``blk``-byte blocks, CMA reads among ranks of one host
    (erdma_coll_alltoall_bulk; distinct buffers)."""
    _check(lib.erdma_coll_alltoall_bulk(eng._h, _ptr(saddr), _ptr(raddr), blk, cranks, n, me,
                                        pull_part, tag, ctx, -1.0), "alltoall")


def coll_allgather_bulk(eng, saddr, raddr, offs, lens, cranks, n, me, tag, ctx):
    """Allgather(v), each block read out of its owner's buffer on one host
    (erdma_coll_allgather_bulk); ``saddr`` None: in place; ``offs``/``lens``
    ``uint64_t[]`` cdata."""
    _check(lib.erdma_coll_allgather_bulk(eng._h, ffi.NULL if saddr is None else _ptr(saddr),
                                         _ptr(raddr), offs, lens, cranks, n, me, tag, ctx,
                                         -1.0), "allgather")


def coll_allreduce_pair(eng, saddr, raddr, count, op, dtype, cranks, n, me, tag, ctx):
    """Two ranks: in0 OP in1 on both, each reading the other's input
    (erdma_coll_allreduce_pair); ``saddr`` None: in place."""
    _check(lib.erdma_coll_allreduce_pair(eng._h, ffi.NULL if saddr is None else _ptr(saddr),
                                         _ptr(raddr), count, op, dtype, cranks, n, me, tag, ctx,
                                         -1.0), "allreduce")


def coll_allreduce_slices(eng, saddr, raddr, count, op, dtype, cranks, n, me, tag, ctx):
    """Three or more ranks of one host: rank k reduces slice k of every input
    (CMA reads), then all read each slice out of its owner
    (erdma_coll_allreduce_slices); ``saddr`` None: in place.  False, on
    every rank alike and with no buffer written, where some pair cannot use
    CMA."""
    rc = lib.erdma_coll_allreduce_slices(eng._h, ffi.NULL if saddr is None else _ptr(saddr),
                                         _ptr(raddr), count, op, dtype, cranks, n, me, tag,
                                         ctx, -1.0)
    _check(min(rc, 0), "allreduce")
    return rc == 0


def coll_reduce_scatter_slices(eng, saddr, raddr, count, op, dtype, cranks, n, me, tag, ctx):
    """Three or more ranks of one host: block ``me`` (``count`` elements) of
    in0 OP in1 OP ..., read out of every rank's input
    (erdma_coll_reduce_scatter_slices; distinct buffers).  False, on every
    rank alike and with the inputs intact, where CMA cannot be used."""
    rc = lib.erdma_coll_reduce_scatter_slices(eng._h, _ptr(saddr), _ptr(raddr), count, op,
                                              dtype, cranks, n, me, tag, ctx, -1.0)
    _check(min(rc, 0), "reduce_scatter")
    return rc == 0


def coll_reduce_scatter_pair(eng, saddr, raddr, count, op, dtype, cranks, n, me, tag, ctx):
    """Two ranks: block ``me`` (``count`` elements) of in0 OP in1, the other's
    block read out of its input (erdma_coll_reduce_scatter_pair; distinct
    buffers)."""
    _check(lib.erdma_coll_reduce_scatter_pair(eng._h, _ptr(saddr), _ptr(raddr), count, op,
                                              dtype, cranks, n, me, tag, ctx, -1.0),
           "reduce_scatter")


def reduce_local(in_addr: int, inout_addr: int, count: int, op: int, dtype: int) -> None:
    """``inout = in OP inout`` over ``count`` elements with the C kernels."""
    _check(lib.erdma_reduce_local(_ptr(in_addr), _ptr(inout_addr), count, op, dtype),
           "reduce_local")


class Schedule:
    """A graph of chunked send/recv/reduce/copy steps run by the engine.

    Build it with the step methods (each returns the step index), then
    :meth:`start` it (a C worker thread runs it, the GIL is free) and
    :meth:`wait`/:meth:`test`.  Buffers are raw addresses; pass the objects
    owning them to :meth:`keep` so they live until the schedule is done.
    """

    __slots__ = ("_s", "_keep", "_state", "_result")

    def __init__(self, engine: "Engine", chunk: int = 0):
        out = ffi.new("erdma_sched **")
        _check(lib.erdma_sched_new(engine._h, chunk, out), "schedule")
        self._s = out[0]
        self._keep = [engine]
        self._state = 0          # 0 built, 1 started, 2 done
        self._result = 0

    def _step(self, rc: int, what: str) -> int:
        if rc < 0:
            raise EngineError(rc, what)
        return rc

    def send(self, addr: int, nbytes: int, dest: int, tag: int, ctx: int) -> int:
        return self._step(lib.erdma_sched_send(self._s, _ptr(addr), nbytes, dest, tag, ctx),
                          "schedule send")

    def recv(self, addr: int, nbytes: int, source: int, tag: int, ctx: int) -> int:
        return self._step(lib.erdma_sched_recv(self._s, _ptr(addr), nbytes, source, tag, ctx),
                          "schedule recv")

    def reduce(self, in_addr: int, inout_addr: int, count: int, op: int, dtype: int) -> int:
        return self._step(lib.erdma_sched_reduce(self._s, _ptr(in_addr), _ptr(inout_addr),
                                                 count, op, dtype), "schedule reduce")

    def copy(self, src: int, dst: int, nbytes: int) -> int:
        return self._step(lib.erdma_sched_copy(self._s, _ptr(src), _ptr(dst), nbytes),
                          "schedule copy")

    def after(self, step: int, on: int, chunkwise: bool = True) -> None:
        _check(lib.erdma_sched_after(self._s, step, on, 1 if chunkwise else 0),
               "schedule dependency")

    def barrier(self) -> None:
        _check(lib.erdma_sched_barrier(self._s), "schedule barrier")

    def keep(self, obj) -> None:
        self._keep.append(obj)

    @property
    def nsteps(self) -> int:
        return lib.erdma_sched_nsteps(self._s)

    def start(self) -> None:
        _check(lib.erdma_sched_start(self._s), "schedule start")
        self._state = 1

    def test(self) -> bool:
        """True once finished; raises :class:`EngineError` if it failed."""
        if self._state == 1:
            done = ffi.new("int *")
            rc = lib.erdma_sched_test(self._s, done)
            if not done[0]:
                return False
            self._finish(rc)
        return self._done()

    def wait(self) -> None:
        """Block (GIL released, in slices for Ctrl-C) until finished."""
        while self._state == 1:
            rc = lib.erdma_sched_wait(self._s, _SLICE)
            if rc != ERR_TIMEOUT:
                self._finish(rc)
        self._done()

    def run(self) -> None:
        """:meth:`start` then :meth:`wait`."""
        self.start()
        self.wait()

    def _finish(self, rc: int) -> None:
        self._state = 2
        self._result = rc
        lib.erdma_sched_free(self._s)
        self._s = None
        self._keep = None

    def _done(self) -> bool:
        if self._state != 2:
            raise EngineError(lib.ERDMA_ERR_STATE, "schedule not started")
        if self._result:
            raise EngineError(self._result, "schedule")
        return True

    def __del__(self):
        # a started schedule that nobody waited for keeps its buffers
        # (leaked) rather than blocking the garbage collector
        if getattr(self, "_s", None) is not None and self._state == 0:
            lib.erdma_sched_free(self._s)
            self._s = None


# -- derived-datatype pack/unpack (erdma_pack.c) ------------------------------

def int64_array(arr):
    """A ``const int64_t *`` over the int64 ndarray ``arr`` (kept alive by it)."""
    return ffi.from_buffer("int64_t[]", arr)


def writable_pointer(obj):
    """Like :data:`buffer_pointer`, refusing a read-only buffer (BufferError)."""
    return ffi.from_buffer(obj, require_writable=True)


def pack_runs(dst, src, count: int, extent: int, off, ln, nruns: int) -> None:
    """Gather ``count`` items (runs ``off``/``ln`` of :func:`int64_array`, item
    ``i`` at ``src + i * extent``) into ``dst``; ``dst``/``src`` are pointers
    (:data:`buffer_pointer`, possibly offset).  Bounds are the caller's."""
    rc = lib.erdma_pack_runs(dst, src, count, extent, off, ln, nruns)
    if rc:
        raise EngineError(rc, "pack_runs")


def unpack_runs(dst, src, count: int, extent: int, off, ln, nruns: int) -> None:
    """Scatter packed bytes at ``src`` into the runs at ``dst`` (see pack_runs)."""
    rc = lib.erdma_unpack_runs(dst, src, count, extent, off, ln, nruns)
    if rc:
        raise EngineError(rc, "unpack_runs")


def address(ptr) -> int:
    """The address a cffi pointer (e.g. from :data:`buffer_pointer`) holds."""
    return int(ffi.cast("uintptr_t", ptr))
