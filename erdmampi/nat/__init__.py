"""NAT traversal, sans-I/O where it can be: STUN messages (:mod:`.stun`), a TURN
client (:mod:`.turn`), ICE-style candidate gathering and connectivity checks
(:mod:`.ice`), the datagram port they talk through (:mod:`.port`) and the
all-ranks helper :func:`.agent.establish`.  See docs/nat.md."""


class NatError(RuntimeError):
    """No working path (or a NAT protocol failure); the message names the cause."""


__all__ = ["NatError"]
