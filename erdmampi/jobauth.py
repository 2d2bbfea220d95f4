"""Job secret, derived keys and authenticated (sealed) rendezvous records.

Only holders of a job's secret can join the job, read its rendezvous records
or write records that the job accepts:

* **secret** -- at least 128 random bits, given as hex in ``ERDMA_JOB_SECRET``
  or in the file named by ``ERDMA_JOB_SECRET_FILE`` (``erdmarun`` makes one for
  local and ssh jobs; ``python -m erdmampi.jobauth`` prints a fresh one).
* **derived keys** (HKDF-SHA256, salt ``erdmampi-job/1``, info
  ``LABEL \\0 JOBID``): ``names`` hides key names, ``records`` seals values,
  ``store-auth`` seeds the Ed25519 key that proves the job to a store server,
  ``store-ns`` names the job's space on a server; ``store-admit`` (info
  ``store-admit \\0``, no job id) admits the job to a store that was given
  the secret (``--admit-file``). Keys for another job id
  (same secret) are unrelated.
* **opaque key names** -- a record ``KEY`` is stored under
  ``hex(HMAC-SHA256(k_names, JOBID "/" KEY))``: a stranger reading the store
  cannot tell which keys a job has, nor which job they belong to.
* **sealed values** -- ``0x01 | nonce(12) | ChaCha20-Poly1305(k_records,
  nonce, value, aad = "erdma-record/1" \\0 OPAQUE_KEY)``. The opaque name (and
  so the job and the logical key) is bound as associated data, so a record
  cannot be replayed under another key or into another job. A value that does
  not authenticate is refused: one warning on the ``erdmampi.discovery``
  logger naming the key, then :class:`RecordAuthError`. Its bytes are never
  parsed (no json, no pickle).

A record can still be replayed under the *same* key of the *same* job id (e.g.
from an earlier run): use a fresh job id for each run.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import sys

__all__ = ["RecordAuthError", "JobKeys", "SealedStore", "generate_secret", "parse_secret",
           "load_secret", "SECRET_ENV", "SECRET_FILE_ENV", "MIN_SECRET_BYTES", "INSECURE_ENV",
           "insecure", "admission_key", "admit_tag"]

SECRET_ENV = "ERDMA_JOB_SECRET"
SECRET_FILE_ENV = "ERDMA_JOB_SECRET_FILE"
INSECURE_ENV = "ERDMA_INSECURE"
MIN_SECRET_BYTES = 16            # 128 bits
_SALT = b"erdmampi-job/1"
_AAD = b"erdma-record/1\0"
_VERSION = 1
_NONCE = 12
_TAG = 16
_STORE_AUTH_CONTEXT = b"erdma-store-auth/1\0"
_STORE_ADMIT_CONTEXT = b"erdma-store-admit/1\0"

log = logging.getLogger("erdmampi.discovery")


class RecordAuthError(ValueError):
    """A rendezvous record did not authenticate (forged, other job, tampered)."""


# -- the secret --------------------------------------------------------------

def generate_secret(nbytes: int = 32) -> str:
    """A fresh job secret as hex (256 bits by default)."""
    if nbytes < MIN_SECRET_BYTES:
        raise ValueError(f"a job secret needs at least {MIN_SECRET_BYTES} bytes")
    return secrets.token_hex(nbytes)


def parse_secret(text: str, where: str = SECRET_ENV) -> bytes:
    """Hex text (whitespace ignored) -> secret bytes; at least 128 bits."""
    compact = "".join(str(text).split())
    try:
        raw = bytes.fromhex(compact)
    except ValueError:
        raise ValueError(f"{where}: the job secret must be hex digits "
                         f"(make one with: python -m erdmampi.jobauth)") from None
    if len(raw) < MIN_SECRET_BYTES:
        raise ValueError(f"{where}: the job secret has {len(raw) * 8} bits; at least "
                         f"{MIN_SECRET_BYTES * 8} are needed ({MIN_SECRET_BYTES * 2} hex digits)")
    return raw


def read_secret_file(path: str) -> bytes:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"cannot read the job secret file {path!r}: {e.strerror}") from None
    try:
        mode = os.stat(path).st_mode
        if mode & 0o077:
            log.warning("job secret file %s is readable by other users (chmod 600 it)", path)
    except OSError:
        pass
    return parse_secret(text, path)


def load_secret(env=os.environ) -> bytes | None:
    """The job secret from ``ERDMA_JOB_SECRET`` or ``ERDMA_JOB_SECRET_FILE``; None if neither."""
    text = env.get(SECRET_ENV, "").strip()
    if text:
        return parse_secret(text, SECRET_ENV)
    path = env.get(SECRET_FILE_ENV, "").strip()
    if path:
        return read_secret_file(path)
    return None


def insecure(env=os.environ) -> bool:
    """``ERDMA_INSECURE`` is set to a true value (1, yes, true, on): the job
    opted out of authentication (erdmarun ``--insecure``)."""
    from . import config
    return config.get(INSECURE_ENV, env)


# -- keys --------------------------------------------------------------------

def _hkdf(secret: bytes, label: str, jobid: bytes, length: int = 32) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=_SALT,
                info=label.encode() + b"\0" + jobid).derive(secret)


def _as_bytes(x) -> bytes:
    if isinstance(x, str):
        return x.encode("utf-8")
    return bytes(x)


class JobKeys:
    """The keys of one job, derived from its secret and id.

    :param secret: the job secret (bytes, or hex text).
    :param jobid: the job id (``ERDMA_JOBID``).
    """

    def __init__(self, secret, jobid):
        if isinstance(secret, str):
            secret = parse_secret(secret)
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"a job secret needs at least {MIN_SECRET_BYTES * 8} bits")
        self.jobid = _as_bytes(jobid)
        self._names = _hkdf(secret, "names", self.jobid)
        self._records = _hkdf(secret, "records", self.jobid)
        self._auth_seed = _hkdf(secret, "store-auth", self.jobid)
        self._admit = admission_key(secret)
        #: the job's space on a store server (hex, reveals nothing about the job id)
        self.namespace = _hkdf(secret, "store-ns", self.jobid, 16).hex().encode()
        self._aead = None
        self._signer = None

    def opaque(self, key) -> bytes:
        """The store name of record ``key``: hex HMAC of ``JOBID/KEY``."""
        return hmac.new(self._names, self.jobid + b"/" + _as_bytes(key),
                        hashlib.sha256).hexdigest().encode()

    def seal(self, key, value) -> bytes:
        """Encrypt and authenticate ``value`` as the record of ``key``."""
        nonce = os.urandom(_NONCE)
        return bytes((_VERSION,)) + nonce + self._cipher().encrypt(
            nonce, _as_bytes(value), _AAD + self.opaque(key))

    def open(self, key, sealed, opaque=None) -> bytes:
        """The value of a sealed record of ``key``.

        :param opaque: the store name it came from, when the logical key is not
            known (it binds the same way).
        :raises RecordAuthError: (and logs a warning) if it does not authenticate.
        """
        name = opaque if opaque is not None else self.opaque(key)
        shown = key if key is not None else name
        if isinstance(shown, bytes):
            shown = shown.decode(errors="replace")
        sealed = bytes(sealed)
        if len(sealed) < 1 + _NONCE + _TAG or sealed[0] != _VERSION:
            return self._refuse(shown, "not a sealed record")
        from cryptography.exceptions import InvalidTag
        try:
            return self._cipher().decrypt(sealed[1:1 + _NONCE], sealed[1 + _NONCE:],
                                          _AAD + name)
        except InvalidTag:
            return self._refuse(shown, "it does not authenticate (forged, another "
                                       "job's, or altered)")

    def open_opaque(self, opaque, sealed) -> bytes:
        """:meth:`open` for a record known only by its store name."""
        return self.open(None, sealed, opaque=_as_bytes(opaque))

    # store-server authentication (Ed25519, seed derived from the secret)

    @property
    def public_key(self) -> bytes:
        from cryptography.hazmat.primitives import serialization
        return self._sign_key().public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def sign_challenge(self, namespace: bytes, nonce: bytes) -> bytes:
        return self._sign_key().sign(_STORE_AUTH_CONTEXT + namespace + b"\0" + nonce)

    def admit_tag(self, namespace: bytes, nonce: bytes) -> bytes:
        """Proves to a store given this secret (``--admit-file``) that the job may
        create its space there."""
        return admit_tag(self._admit, namespace, nonce, self.public_key)

    def store_auth(self):
        """The ``auth`` object :class:`erdmampi.rendezvous.Store` takes."""
        return StoreAuth(self)

    # Private

    def _cipher(self):
        if self._aead is None:
            from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
            self._aead = ChaCha20Poly1305(self._records)
        return self._aead

    def _sign_key(self):
        if self._signer is None:
            from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
            self._signer = Ed25519PrivateKey.from_private_bytes(self._auth_seed)
        return self._signer

    def _refuse(self, key, why):
        log.warning("refused rendezvous record %r of job %s: %s", key,
                    self.jobid.decode(errors="replace"), why)
        raise RecordAuthError(f"rendezvous record {key!r} refused: {why}")


class StoreAuth:
    """Proves a job to a store server (see :mod:`erdmampi.rendezvous`, op AUTH)."""

    def __init__(self, keys: JobKeys):
        self.namespace = keys.namespace
        self.public_key = keys.public_key
        self._keys = keys

    def sign(self, nonce: bytes) -> bytes:
        return self._keys.sign_challenge(self.namespace, nonce)

    def admit_tag(self, nonce: bytes) -> bytes:
        return self._keys.admit_tag(self.namespace, nonce)


def admission_key(secret) -> bytes:
    """The key a store derives from a secret it admits (independent of the job id:
    one secret given to a store admits every job id that uses it)."""
    if isinstance(secret, str):
        secret = parse_secret(secret)
    return _hkdf(secret, "store-admit", b"")


def admit_tag(k_admit: bytes, namespace: bytes, nonce: bytes, public_key: bytes) -> bytes:
    return hmac.new(k_admit, _STORE_ADMIT_CONTEXT + bytes(namespace) + b"\0" + bytes(nonce)
                    + b"\0" + bytes(public_key), hashlib.sha256).digest()


def verify_challenge(namespace: bytes, nonce: bytes, public_key: bytes, signature: bytes) -> bool:
    """Server side of :meth:`JobKeys.sign_challenge`."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    try:
        Ed25519PublicKey.from_public_bytes(bytes(public_key)).verify(
            bytes(signature), _STORE_AUTH_CONTEXT + bytes(namespace) + b"\0" + bytes(nonce))
        return True
    except (InvalidSignature, ValueError):
        return False


# -- the sealed store --------------------------------------------------------

class SealedStore:
    """A store whose record names are opaque and whose values are sealed.

    :param raw: a store with ``set(key, bytes)``, ``get(key, timeout)`` (or
        ``get_all(key, timeout) -> [bytes, ...]``, as the DHT has: the first
        candidate that authenticates wins), and optionally ``add``, ``check``,
        ``delete``, ``close``. Its keys are used as given (no job prefix needed:
        the opaque names already depend on the job).
    :param keys: the job's :class:`JobKeys`.
    """

    def __init__(self, raw, keys: JobKeys):
        self.raw = raw
        self.keys = keys
        self._refused = set()         # forgeries seen, so each is logged once

    def __repr__(self):
        return f"SealedStore({self.raw!r}, job={self.keys.jobid.decode(errors='replace')!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set(self, key, value):
        if isinstance(value, str):
            value = value.encode("utf-8")
        self.raw.set(self.keys.opaque(key), self.keys.seal(key, value))

    def get(self, key, timeout=None):
        """The value of ``key`` (waits up to ``timeout`` s for it to appear).

        :raises TimeoutError: naming ``key`` (not its opaque name).
        :raises RecordAuthError: when no stored candidate authenticates.
        """
        name = self.keys.opaque(key)
        try:
            if hasattr(self.raw, "get_all"):
                candidates = self.raw.get_all(name, timeout)
            else:
                candidates = [self.raw.get(name, timeout)]
        except TimeoutError:
            raise TimeoutError(f"rendezvous record {_show(key)!r} of job "
                               f"{self.keys.jobid.decode(errors='replace')!r} did not appear "
                               f"within {_secs(timeout, self.raw)}") from None
        found = err = None
        for c in candidates:          # newest first; every forgery is refused (logged once)
            c = bytes(c)
            digest = hashlib.sha256(name + b"\0" + c).digest()
            if digest in self._refused:
                err = RecordAuthError(f"rendezvous record {_show(key)!r} refused (again)")
                continue
            try:
                value = self.keys.open(key, c, opaque=name)
            except RecordAuthError as e:
                if len(self._refused) < 4096:
                    self._refused.add(digest)
                err = e
                continue
            if found is None:
                found = value
        if found is not None:
            return found
        raise err if err else RecordAuthError(f"rendezvous record {_show(key)!r}: no value")

    def add(self, key, n=1):
        """Atomic counter (plaintext on the server: protected by store authentication)."""
        return self.raw.add(self.keys.opaque(key), n)

    def check(self, keys):
        keys = [keys] if isinstance(keys, (str, bytes)) else list(keys)
        return self.raw.check([self.keys.opaque(k) for k in keys])

    def delete(self, key):
        return self.raw.delete(self.keys.opaque(key))

    def close(self):
        close = getattr(self.raw, "close", None)
        if close:
            close()


def _show(key):
    return key.decode(errors="replace") if isinstance(key, (bytes, bytearray)) else key


def _secs(timeout, raw):
    t = timeout if timeout is not None else getattr(raw, "timeout", None)
    return f"{t:g} s" if t is not None else "the timeout"


def main(argv=None):
    """``python -m erdmampi.jobauth [NBYTES]``: print a fresh job secret (hex)."""
    import argparse
    p = argparse.ArgumentParser(
        prog="python -m erdmampi.jobauth", allow_abbrev=False,
        description="Print a fresh job secret as hex, for erdmarun --secret-file or "
                    f"{SECRET_ENV}. Every site of a job uses the same secret; keep it as "
                    "private as an ssh key.",
        epilog="example: python -m erdmampi.jobauth > job.key && chmod 600 job.key")
    p.add_argument("nbytes", nargs="?", type=int, default=32,
                   help=f"random bytes in the secret (default 32; at least {MIN_SECRET_BYTES})")
    a = p.parse_args(sys.argv[1:] if argv is None else argv)
    if a.nbytes < MIN_SECRET_BYTES:
        p.error(f"a job secret needs at least {MIN_SECRET_BYTES} bytes, got {a.nbytes}")
    print(generate_secret(a.nbytes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
