"""Engine-level point-to-point checks, run under erdmarun with 2 ranks."""
import hashlib
import sys
import time

import numpy as np

from erdmampi import bootstrap
from erdmampi._engine import (ANY_SOURCE, ANY_TAG, ERR_PEER, ERR_TRUNCATE, EngineError)

e = bootstrap.init_world()
rank, peer = e.rank, 1 - e.rank
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)
        print(f"[{rank}] FAIL {what}", flush=True)


def send(arr, dest, tag, ctx=0, sync=False):
    return e.isend(arr.ctypes.data, arr.nbytes, dest, tag, ctx, sync=sync, keep=arr)


def recv(arr, source, tag, ctx=0):
    return e.irecv(arr.ctypes.data, arr.nbytes, source, tag, ctx, keep=arr)


# 1. sizes from 0 bytes to 64 MiB, both directions, contents checked
for n in [0, 1, 7, 4096, 65536, 65537, 1 << 20, 64 << 20]:
    out = np.random.default_rng(n + rank).integers(0, 255, n, dtype=np.uint8)
    inc = np.zeros(n, np.uint8)
    r = recv(inc, peer, 1)
    s = send(out, peer, 1)
    st = r.wait()
    s.wait()
    expect = np.random.default_rng(n + peer).integers(0, 255, n, dtype=np.uint8)
    check(st.error == 0 and st.nbytes == n and st.source == peer and st.tag == 1, f"status {n}: {st}")
    check(hashlib.sha256(inc).digest() == hashlib.sha256(expect).digest(), f"payload {n}")

# 2. non-overtaking: mixed eager/rendezvous messages arrive in order, even unexpected
if rank == 1:
    reqs = [send(np.full(100 if i % 3 else 200000, i, np.int32), 0, 5) for i in range(60)]
    for r in reqs:
        r.wait()
else:
    time.sleep(0.2)  # let them queue as unexpected
    for i in range(60):
        r = e.irecv_alloc(ANY_SOURCE, ANY_TAG, 0)
        st = r.wait()
        got = np.frombuffer(r.take(), np.int32)
        check(st.tag == 5 and got.size in (100, 200000) and (got == i).all(), f"order {i}")

# 3. contexts separate traffic with equal tags
if rank == 1:
    send(np.array([1], np.int64), 0, 3, ctx=10).wait()
    send(np.array([2], np.int64), 0, 3, ctx=11).wait()
else:
    b = np.zeros(1, np.int64)
    recv(b, 1, 3, ctx=11).wait()
    check(b[0] == 2, "ctx 11")
    recv(b, 1, 3, ctx=10).wait()
    check(b[0] == 1, "ctx 10")

# 4. truncation is reported (eager and rendezvous) and the stream stays usable
if rank == 1:
    for n in (10, 100000):
        send(np.arange(n, dtype=np.float64), 0, 7).wait()
    send(np.array([42.0]), 0, 8).wait()
else:
    for n in (10, 100000):
        small = np.zeros(4)
        st = recv(small, 1, 7).wait()
        check(st.error == ERR_TRUNCATE and list(small) == [0, 1, 2, 3], f"truncate {n}: {st}")
    one = np.zeros(1)
    recv(one, 1, 8).wait()
    check(one[0] == 42.0, "after truncation")

# 5. probes: probe sees size, mprobe removes it from matching
if rank == 1:
    big = send(np.arange(300000, dtype=np.int8), 0, 20)  # completes once received
    send(np.arange(3, dtype=np.int8), 0, 21).wait()
    big.wait()
else:
    st = e.probe(1, 21, 0)
    check(st.nbytes == 3 and st.tag == 21, f"probe {st}")
    m, st = e.mprobe(ANY_SOURCE, ANY_TAG, 0)
    check(st.tag == 20 and st.nbytes == 300000, f"mprobe {st}")
    check(e.iprobe(1, 20, 0) is None, "mprobed message still visible")
    r = e.imrecv_alloc(m)
    check(bytes(r.take()) == np.arange(300000, dtype=np.int8).tobytes(), "mrecv payload")
    r = e.irecv_alloc(1, 21, 0)
    check(r.wait().nbytes == 3, "tag 21 after mprobe")

# 6. cancel an unmatched receive
b = np.zeros(1)
r = recv(b, peer, 999)
r.cancel()
check(r.wait().cancelled, "cancel")

# 7. synchronous send completes only once matched
if rank == 1:
    s = send(np.zeros(8, np.uint8), 0, 30, sync=True)
    time.sleep(0.5)
    check(s.test() is None, "ssend completed before the receive was posted")
    send(np.zeros(1, np.uint8), 0, 31).wait()
    s.wait()
else:
    recv(np.zeros(1, np.uint8), 1, 31).wait()
    recv(np.zeros(8, np.uint8), 1, 30).wait()

# 8. self messages, including synchronous ones
x = np.arange(5, dtype=np.int16)
s = send(x, rank, 40)
y = np.zeros(5, np.int16)
recv(y, rank, 40).wait()
s.wait()
check((y == x).all(), "self send")

# 8b. abort: a receive withdrawn while its payload is arriving; the stream
# stays in step and the buffer is never written afterwards
if rank == 1:
    big = send(np.full(4 << 20, 5, np.uint8), 0, 60)
    send(np.array([77], np.int64), 0, 61).wait()
    big.wait()
else:
    buf = np.zeros(4 << 20, np.uint8)
    r = recv(buf, 1, 60)
    while e.iprobe(1, 61, 0) is None and r.test() is None:
        time.sleep(0.0005)  # let the transfer start (or finish)
    r.abort()
    st = r.wait()
    written = int(buf.sum())
    one = np.zeros(1, np.int64)
    recv(one, 1, 61).wait()
    check(one[0] == 77, "message after an aborted receive")
    time.sleep(0.2)
    check(int(buf.sum()) == written, "aborted receive buffer written afterwards")
    check(st.cancelled or st.nbytes == 4 << 20, f"aborted status {st}")

# 9. a dead peer: rank 1 vanishes without goodbye; rank 0 hears within ERDMA_TIMEOUT
if rank == 1:
    send(np.zeros(1), 0, 50).wait()
    time.sleep(0.3)  # let the ack go out
    print(f"[{rank}] OK" if not fails else f"[{rank}] FAILED {fails}", flush=True)
    import os
    os._exit(0)
recv(np.zeros(1), 1, 50).wait()
t0 = time.monotonic()
st = recv(np.zeros(1), 1, 51).wait(timeout=30)
dt = time.monotonic() - t0
check(st.error == ERR_PEER, f"dead peer error {st}")
check(dt < 10, f"dead peer noticed after {dt:.1f}s")
try:
    e.isend(np.zeros(1).ctypes.data, 8, 1, 52, 0).wait()
    err = None
except EngineError as exc:
    err = exc.code
print(f"[{rank}] dead peer after {dt:.1f}s", flush=True)
print(f"[{rank}] OK" if not fails else f"[{rank}] FAILED {fails}", flush=True)
sys.exit(1 if fails else 0)
