"""Find the job's rendezvous records: a TCP store or a Kademlia DHT, authenticated.

Contract used by :mod:`erdmampi.bootstrap`::

    store = open_store(env=os.environ, timeout=60.0)
    store.set(key, value_bytes)          # publish this rank's record
    value = store.get(key, timeout)      # wait up to timeout s; -> bytes
    store.close()

* ``key`` is a str such as ``"ep/3"``; the store adds the job id itself
  (``ERDMA_JOBID``, default ``SLURM_JOB_ID``, else ``"job"``), so callers never
  prefix keys. Values are bytes (str is encoded as UTF-8).
* Where the records live: ``ERDMA_RENDEZVOUS=host:port`` -> the TCP store
  (:mod:`erdmampi.rendezvous`); otherwise ``ERDMA_DHT=host:port[,host:port...]``
  -> a client node of the Kademlia DHT (:mod:`erdmampi.dht`) bootstrapped from
  those peers (``ERDMA_DHT_BIND`` picks its UDP address, default
  ``0.0.0.0:0``). Neither -> :class:`ValueError`. In the DHT the records are
  signed with an Ed25519 key derived from the job secret (HKDF label
  ``dht-sign``) that also names their keys: DHT nodes refuse values it did not
  sign, so a forger cannot crowd out the job's records (without a secret the
  key follows from the job id: no protection).
* With a job secret (``ERDMA_JOB_SECRET`` hex or ``ERDMA_JOB_SECRET_FILE``,
  see :mod:`erdmampi.jobauth`) the store is a :class:`~erdmampi.jobauth.SealedStore`:
  record names are opaque, values sealed (ChaCha20-Poly1305 bound to the
  name), and a TCP connection proves the job to the server before any
  operation (the job gets its own space there). Without a secret the records
  are plain, under ``JOBID/KEY`` in the server's open space (the old protocol).
* ``get`` raises :class:`TimeoutError` naming the missing key when it does not
  appear in time, and :class:`~erdmampi.jobauth.RecordAuthError` (after one
  warning on the ``erdmampi.discovery`` logger naming the key) when what is
  stored does not authenticate: a forged or altered value is never returned.
  Connecting raises :class:`ConnectionError` (server unreachable),
  :class:`erdmampi.rendezvous.StoreError` (server refused the job's proof) or
  :class:`TimeoutError` (no DHT peer answered) within ``timeout``.
* ``add(key, n)`` (atomic counter) exists on the TCP store only.

:class:`DhtStoreServer` serves a TCP store on a local address whose records
live in the DHT: ``erdmarun --dht`` runs one per site, so its ranks use the
TCP path. :func:`claim_ranks` and :class:`JoinWatch` are the site bookkeeping
of ``erdmarun --rendezvous/--dht --job-id``.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from . import jobauth
from .rendezvous import Store, StoreError

__all__ = ["open_store", "store_for", "DhtStoreServer", "claim_ranks", "JoinWatch",
           "parse_ranks", "job_id"]

log = logging.getLogger("erdmampi.discovery")


def job_id(env=os.environ) -> str:
    return env.get("ERDMA_JOBID") or env.get("SLURM_JOB_ID") or "job"


def open_store(env=os.environ, timeout: float = 60.0):
    """The job's rendezvous store, from the environment (see the module docstring)."""
    jobid = job_id(env)
    secret = jobauth.load_secret(env)
    rdv = env.get("ERDMA_RENDEZVOUS", "").strip()
    dht = env.get("ERDMA_DHT", "").strip()
    if rdv:
        return store_for(jobid, secret, rendezvous=rdv, timeout=timeout)
    if dht:
        from .dht import DhtNode, parse_peers
        bind = env.get("ERDMA_DHT_BIND", "0.0.0.0:0")
        host, _, port = bind.rpartition(":")
        node = DhtNode(host.strip("[]") or "0.0.0.0", int(port or 0), client=True)
        try:
            node.bootstrap(parse_peers(dht), timeout)
        except BaseException:
            node.close()
            raise
        return store_for(jobid, secret, dht_node=node, timeout=timeout, owns_node=True)
    raise ValueError("no rendezvous for this job: set ERDMA_RENDEZVOUS=host:port (a TCP "
                     "store) or ERDMA_DHT=host:port[,...] (DHT peers)")


def store_for(jobid, secret, rendezvous=None, dht_node=None, timeout=60.0, owns_node=False):
    """A job's store on a TCP server (``rendezvous``) or a DHT node, sealed if ``secret``."""
    keys = jobauth.JobKeys(secret, jobid) if secret else None
    if rendezvous:
        if keys is None:
            return Store.from_address(rendezvous, prefix=f"{jobid}/", timeout=timeout)
        raw = Store.from_address(rendezvous, timeout=timeout, auth=keys.store_auth())
        return jobauth.SealedStore(raw, keys)
    from .dht import DhtKey, DhtStore
    # values in the DHT are signed with a key only the job's secret gives (nodes refuse
    # the rest); without a secret the key follows from the job id, so anyone can forge
    if keys and isinstance(secret, str):
        secret = jobauth.parse_secret(secret)
    signer = DhtKey(jobauth._hkdf(bytes(secret), "dht-sign", keys.jobid)) if keys else None
    raw = DhtStore(dht_node, prefix="" if keys else f"{jobid}/", timeout=timeout,
                   owns_node=owns_node, signer=signer)
    return jobauth.SealedStore(raw, keys) if keys else raw


# -- a TCP store backed by the DHT --------------------------------------------

class DhtStoreServer:
    """A local TCP store whose records are published to and found in the DHT.

    Every SET is sealed with the job's keys (if a secret is given) and stored
    in the DHT; a GET/WAIT for a key not set locally looks it up in the DHT
    until it appears (values that do not authenticate are refused and logged).
    ``ADD``, ``CHECK`` and ``DELETE`` act on this site's copy only.

    :param node: a bootstrapped :class:`erdmampi.dht.DhtNode`.
    """

    def __init__(self, node, jobid, secret=None, host="127.0.0.1", port=0, poll=0.2):
        from erdmampi.launcher.store_server import StoreServer

        outer = self
        self.node = node
        self.backend = store_for(jobid, secret, dht_node=node)
        self.poll = poll
        self._queue = []
        self._cv = threading.Condition()
        self._closed = False

        class _Server(StoreServer):
            def _on_set(self, namespace, key, value):
                with outer._cv:
                    outer._queue.append((namespace, key, value))
                    outer._cv.notify()

        self.server = _Server(host, port)
        self._threads = [threading.Thread(target=self._publisher, daemon=True,
                                          name="erdma-dht-pub"),
                         threading.Thread(target=self._finder, daemon=True,
                                          name="erdma-dht-find")]

    @property
    def address(self):
        return self.server.address

    @staticmethod
    def _name(namespace, key):
        return key if namespace is None else namespace + b"|" + key

    def start(self):
        self.server.start()
        for t in self._threads:
            t.start()
        return self

    def close(self):
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self.server.close()
        for t in self._threads:
            t.join(3.0)

    # Private

    def _publisher(self):
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                ns, key, value = self._queue.pop(0)
            try:
                self.backend.set(self._name(ns, key), value)
            except Exception as e:
                log.warning("DHT: publishing a record failed: %s", e)

    def _finder(self):
        while not self._closed:
            for ns, key in self.server.pending():
                if self._closed:
                    return
                try:
                    value = self.backend.get(self._name(ns, key), 0)
                except (TimeoutError, jobauth.RecordAuthError):
                    continue
                except Exception as e:
                    log.debug("DHT lookup failed: %s", e)
                    continue
                self.server.inject(ns, key, value)
            time.sleep(self.poll)


# -- sites joining one job ------------------------------------------------------

def parse_ranks(text, size):
    """``"A-B"`` or ``"A"`` -> ``(first, count)`` within a job of ``size`` ranks."""
    a, sep, b = str(text).partition("-")
    try:
        first, last = int(a), int(b) if sep else int(a)
    except ValueError:
        raise ValueError(f"--ranks takes A-B (e.g. 0-3), got {text!r}") from None
    if not 0 <= first <= last < size:
        raise ValueError(f"--ranks {text}: not a range of ranks of a job of {size} "
                         f"(0-{size - 1})")
    return first, last - first + 1


def claim_ranks(store, size, count=None, first=None):
    """This site's ranks: ``(first, count)``.

    With ``first`` given (explicit ``--ranks``) each rank is claimed with an
    atomic ADD where the store has one, so two sites claiming a rank are told.
    Otherwise ``count`` ranks are taken off a shared counter: contiguous and
    unique per site, in the order the sites arrive.
    """
    if first is not None:
        if hasattr(store, "add") and not _is_dht(store):
            for r in range(first, first + count):
                if store.add(f"claim/{r}", 1) != 1:
                    raise ValueError(f"rank {r} of this job is already taken by another "
                                     f"site (check the --ranks of each site)")
        return first, count
    if _is_dht(store):
        raise ValueError("with --dht each site needs explicit --ranks A-B "
                         "(a DHT has no atomic counter)")
    end = store.add("next-rank", count)
    start = end - count
    if end > size:
        raise ValueError(f"the job already has its {size} ranks (this site would get "
                         f"ranks {start}-{end - 1}): check -n and --local-n on each site, "
                         f"or use a fresh --job-id")
    return start, count


def _is_dht(store):
    raw = getattr(store, "raw", store)
    return type(raw).__name__ == "DhtStore"


class JoinWatch:
    """Announces this site's ranks and checks that all ``size`` ranks joined in time.

    :param store: the job's store (sealed or not).
    :param size: ranks in the job.
    :param first, count: this site's ranks.
    :param timeout: seconds the other sites have to join.
    """

    def __init__(self, store, size, first, count, timeout, jobid="", poll=0.25,
                 progress=None, progress_every=10.0):
        self.progress = progress          # called with a line: who joined, who is awaited
        self.progress_every = progress_every
        self.store = store
        self.size = size
        self.mine = range(first, first + count)
        self.timeout = timeout
        self.jobid = jobid
        self.poll = poll
        self._stop = threading.Event()
        self._thread = None
        self._seen = set()
        self.joined = False

    def start(self, report):
        for r in self.mine:
            self.store.set(f"joined/{r}", b"1")
        self._thread = threading.Thread(target=self._watch, args=(report,), daemon=True,
                                        name="erdma-join")
        self._thread.start()

    def close(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        try:
            self.store.close()
        except Exception:
            pass

    def missing(self):
        """Ranks of other sites not announced yet (announcements must authenticate)."""
        out = []
        for r in range(self.size):
            if r in self.mine or r in self._seen:
                continue
            try:
                self.store.get(f"joined/{r}", 0)
                self._seen.add(r)
            except Exception:
                out.append(r)
        return out

    def _say_progress(self, missing):
        if self.progress is None:
            return
        joined = self.size - len(missing)
        if missing:
            self.progress(f"job {self.jobid}: {joined} of {self.size} ranks joined; waiting "
                          f"for ranks {format_ranks(missing)}")
        else:
            self.progress(f"job {self.jobid}: all {self.size} ranks joined")

    def _watch(self, report):
        deadline = time.monotonic() + self.timeout
        last, said_at = None, time.monotonic()
        while not self._stop.is_set():
            missing = self.missing()
            now = time.monotonic()
            # a line when the set changes (at most every poll) or every progress_every s
            if missing != last and (last is not None or missing) or \
                    (missing and now - said_at >= self.progress_every):
                self._say_progress(missing)
                last, said_at = missing, now
            if not missing:
                self.joined = True
                return
            if time.monotonic() >= deadline:
                report(f"job {self.jobid}: ranks {format_ranks(missing)} of {self.size} did not "
                       f"join within {self.timeout:g} s (is erdmarun running on the other "
                       f"site(s) with the same --job-id, secret and -n?)")
                return
            self._stop.wait(self.poll)


def format_ranks(ranks):
    """[0, 1, 2, 5] -> "0-2,5"."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)
