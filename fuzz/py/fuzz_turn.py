"""atheris harness: TURN framing and a TURN client's handling of what a server (or
anyone spoofing it) sends (erdmampi.nat.turn).

* ChannelData: ``channel_unwrap`` raises only TurnError, and what it returns wraps
  back to the start of the frame.
* ``TurnClient.handle`` (relayed data from the server's address) never raises.
* Transactions: ``allocate``, ``create_permission``, ``channel_bind``, ``refresh``,
  ``maintain`` and ``close`` against a server whose answers come from the input
  (raw datagrams, or well-framed STUN responses with hostile attributes and, when
  the client has a key, a valid MESSAGE-INTEGRITY); the client may raise only
  TurnError.

    python fuzz/py/fuzz_turn.py -max_total_time=60 /tmp/new fuzz/corpus/turn
"""
import os
import sys

import atheris

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

with atheris.instrument_imports():
    from erdmampi.nat import stun, turn
    from erdmampi.nat.stun import ATTR, Message, StunError
    from erdmampi.nat.turn import TurnClient, TurnError

SERVER = ("198.18.0.1", 3478)
PEER = ("198.18.0.9", 7000)
_ATTRS = [ATTR.ERROR_CODE, ATTR.REALM, ATTR.NONCE, ATTR.XOR_RELAYED_ADDRESS,
          ATTR.XOR_MAPPED_ADDRESS, ATTR.LIFETIME, ATTR.XOR_PEER_ADDRESS, ATTR.DATA,
          ATTR.SOFTWARE, ATTR.CHANNEL_NUMBER, ATTR.MESSAGE_INTEGRITY, ATTR.FINGERPRINT]


class _Exhausted(Exception):
    """The input has no more answers (a harness artifact, not a finding)."""


class _Port:
    """The client's datagram port; what the 'server' answers comes from the input."""

    def __init__(self, fdp, client):
        self.fdp, self.client, self.last, self.answers = fdp, client, None, 0

    def local_address(self):
        return ("198.18.0.2", 4000)

    def send(self, data, addr):
        self.last = stun.decode(data) if stun.is_stun(data) else self.last

    def recv(self, timeout):
        fdp = self.fdp
        if self.answers >= 6 or fdp.remaining_bytes() == 0 or self.last is None:
            raise _Exhausted
        self.answers += 1
        src = SERVER if fdp.ConsumeIntInRange(0, 7) else PEER
        if fdp.ConsumeIntInRange(0, 3) == 0:                  # raw bytes, our tid in place
            raw = bytearray(fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200)))
            if len(raw) >= 20:
                raw[8:20] = self.last.tid
            return bytes(raw), src
        cls = fdp.PickValueInList([stun.SUCCESS, stun.ERROR, stun.ERROR, stun.INDICATION])
        m = Message(self.last.method, cls, self.last.tid)
        for _ in range(fdp.ConsumeIntInRange(0, 5)):
            t = fdp.PickValueInList(_ATTRS)
            how = fdp.ConsumeIntInRange(0, 2)
            if how == 0:
                m.add(t, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 24)))
            elif t == ATTR.ERROR_CODE:
                m.add_error(fdp.PickValueInList([401, 438, 437, 403, 486, 300, 699]),
                            fdp.ConsumeUnicodeNoSurrogates(8))
            elif t in (ATTR.REALM, ATTR.NONCE, ATTR.SOFTWARE):
                m.add_text(t, fdp.ConsumeUnicodeNoSurrogates(12))
            elif t in (ATTR.XOR_RELAYED_ADDRESS, ATTR.XOR_MAPPED_ADDRESS, ATTR.XOR_PEER_ADDRESS):
                m.add_address(t, (fdp.PickValueInList(["198.18.0.7", "::1", "0.0.0.0"]),
                                  fdp.ConsumeIntInRange(0, 65535)))
            else:
                m.add_u32(t, fdp.ConsumeInt(4) & 0xFFFFFFFF)
        key = self.client._key if fdp.ConsumeBool() else None
        return m.encode(key=key, fingerprint=fdp.ConsumeBool()), src


def _channel(fdp):
    data = fdp.ConsumeBytes(fdp.remaining_bytes())
    assert turn.is_channel_data(data) in (True, False)
    try:
        ch, payload = turn.channel_unwrap(data)
    except TurnError:
        return
    assert turn.CHANNEL_MIN <= ch <= turn.CHANNEL_MAX
    assert data.startswith(turn.channel_wrap(ch, payload))


def _handle(fdp):
    c = TurnClient(None, SERVER, "user", "pass")
    c.channels[PEER] = 0x4000
    c.peer_of_channel[0x4000] = PEER
    src = SERVER if fdp.ConsumeBool() else PEER
    got = c.handle(fdp.ConsumeBytes(fdp.remaining_bytes()), src)
    assert got is None or (isinstance(got[0], bytes) and len(got[1]) == 2)


def _transactions(fdp):
    c = TurnClient(None, SERVER, "user", "pass", rto=0.001, timeout=5.0)
    c.port = _Port(fdp, c)
    try:
        c.allocate()
        c.create_permission([PEER])
        c.channel_bind(PEER)
        c.refresh()
        c.maintain(now=c.expires_at + 1e6)
        c.close()
    except (TurnError, _Exhausted):
        pass
    except StunError as e:
        raise AssertionError(f"the TURN client let a StunError out: {e}") from e
    assert len(c.backlog) <= 6


def TestOneInput(data):
    fdp = atheris.FuzzedDataProvider(data)
    mode = fdp.ConsumeIntInRange(0, 2)
    (_channel, _handle, _transactions)[mode](fdp)


def main():
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
