"""atheris harness: STUN decoding (erdmampi.nat.stun).

``decode`` and every typed attribute reader may raise only StunError; a decoded
message encodes again (without MESSAGE-INTEGRITY/FINGERPRINT) to one that decodes
to the same method, class, transaction id and attributes.

    python fuzz/py/fuzz_stun.py -max_total_time=60 /tmp/new fuzz/corpus/stun
"""
import os
import sys

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

with atheris.instrument_imports():
    from erdmampi.nat import stun
    from erdmampi.nat.stun import ATTR, StunError

_TYPES = [v for k, v in vars(ATTR).items() if k.isupper()]


def _read_all(m):
    """Every reader a client or server applies to a message from the network."""
    for t in (_TYPES + [m.attrs[0][0]]) if m.attrs else _TYPES:
        for reader in (m.address, m.addresses, m.text, m.u32):
            try:
                reader(t)
            except StunError:
                pass
    for reader in (m.mapped_address, m.error):
        try:
            reader()
        except StunError:
            pass
    stun.check_integrity(m, b"key")
    stun.check_integrity(m, stun.long_term_key("user", "realm", "pass"))
    _ = (m.is_request, m.is_indication, m.is_response, m.response())


def TestOneInput(data):
    assert stun.is_stun(data) in (True, False)
    try:
        m = stun.decode(data)
    except StunError:
        return
    _read_all(m)
    body = [(t, v) for t, v in m.attrs if t not in (ATTR.MESSAGE_INTEGRITY, ATTR.FINGERPRINT)]
    try:
        again = stun.decode(stun.Message(m.method, m.cls, m.tid, list(body))
                            .encode(fingerprint=False))
    except StunError:
        return                                   # e.g. too long once padded again
    assert (again.method, again.cls, again.tid, again.attrs) == (m.method, m.cls, m.tid, body)


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
