"""TURN over TCP and TLS: the ERDMA_TURN URI parser, and the datagram<->stream
shim (erdmampi.nat.turn_stream) against a real coturn on loopback that listens
on TCP and TLS only (--no-udp): allocation, ChannelData both ways with and
without padding, Send/Data indications, refused connections and certificates
named in the error."""
import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

from erdmampi.nat import NatError
from erdmampi.nat.agent import NatConfig, open_turn
from erdmampi.nat.paths import nat_config, parse_turn
from erdmampi.nat.port import SocketPort
from erdmampi.nat.turn_stream import TurnStreamShim, tls_context

USER, PASSWORD = "shimuser", "shim:pass"


# ---- the URI parser ------------------------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("u:p@h", ("h", 3478, "u", "p", "udp")),
    ("u:p:q@10.0.0.1:3479", ("10.0.0.1", 3479, "u", "p:q", "udp")),
    ("turn:u:p@h", ("h", 3478, "u", "p", "udp")),
    ("turn:u:p@h:80?transport=tcp", ("h", 80, "u", "p", "tcp")),
    ("TURN:u:p@h?transport=UDP", ("h", 3478, "u", "p", "udp")),
    ("turns:u:p@turn.example.org:443", ("turn.example.org", 443, "u", "p", "tls")),
    ("turns:u:p@h", ("h", 5349, "u", "p", "tls")),
    ("turns:u:p@h?transport=tcp", ("h", 5349, "u", "p", "tls")),
    ("turn:u:p@[2001:db8::1]:9?transport=tcp", ("2001:db8::1", 9, "u", "p", "tcp")),
    ("turn:u%40x:p%40w@h", ("h", 3478, "u@x", "p@w", "udp")),
    ("turn:secret@h:5", ("h", 5, "turn", "secret", "udp")),   # the old form, user "turn"
    ("  turn:u:p@h:1  ", ("h", 1, "u", "p", "udp")),
])
def test_turn_uri_forms(text, want):
    assert parse_turn(text) == want


@pytest.mark.parametrize("text,words", [
    ("turn:h:3478", "user and a password"),
    ("h:3478", "user and a password"),
    ("turns:u:p@h?transport=udp", "DTLS"),
    ("turn:u:p@h?transport=sctp", "want udp or tcp"),
    ("turn:u:p@h?foo=1", "unknown parameter"),
    ("turn:u:p@h?transport", "unknown parameter"),
    ("u:p@h?transport=tcp", "needs a turn: or turns: URI"),
    ("stun:h:3478", "want turn: or turns:"),
    ("turn://u:p@h", "no '//'"),
    ("turn:u:p@", "no host"),
    ("turn:u:p@h:0", "not host:port"),
    ("turn:u:p@h:70000", "not host:port"),
    ("turn:u:p@h:x", "bad port"),
])
def test_bad_turn_uris_name_the_problem(text, words):
    with pytest.raises(ValueError) as e:
        parse_turn(text)
    assert "ERDMA_TURN" in str(e.value) and words in str(e.value), str(e.value)


def test_nat_config_from_the_environment(tmp_path):
    cfg = nat_config({"ERDMA_TURN": "turns:u:p@h:443"})
    assert cfg.turn == ("h", 443, "u", "p") and cfg.turn_transport == "tls"
    assert cfg.turn_tls_verify and cfg.turn_tls_ca is None
    cfg = nat_config({"ERDMA_TURN": "u:p@h"})
    assert cfg.turn == ("h", 3478, "u", "p") and cfg.turn_transport == "udp"
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    cfg = nat_config({"ERDMA_TURN": "turns:u:p@h", "ERDMA_TURN_CA": str(ca),
                      "ERDMA_TURN_INSECURE": "1"})
    assert cfg.turn_tls_ca == str(ca) and not cfg.turn_tls_verify
    with pytest.raises(ValueError, match="ERDMA_TURN_CA"):
        nat_config({"ERDMA_TURN": "turns:u:p@h", "ERDMA_TURN_CA": str(tmp_path / "none")})
    with pytest.raises(ValueError, match="ERDMA_TURN_INSECURE"):
        nat_config({"ERDMA_TURN": "turns:u:p@h", "ERDMA_TURN_INSECURE": "maybe"})
    with pytest.raises(ValueError, match="turn_transport"):
        NatConfig.of({"turn": ("h", 1, "u", "p"), "turn_transport": "sctp"})


# ---- against coturn on loopback, TCP and TLS only ----------------------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def coturn():
    if shutil.which("turnserver") is None or shutil.which("openssl") is None:
        pytest.skip("turnserver or openssl not found (apt-get install -y coturn openssl)")
    d = tempfile.mkdtemp(prefix="erdma-turnstream-")
    cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    port, tls_port = _free_port(), _free_port()
    log = open(os.path.join(d, "turn.log"), "w")
    p = subprocess.Popen(
        ["turnserver", "-n", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
         f"--listening-port={port}", f"--tls-listening-port={tls_port}", "--no-udp",
         "--no-dtls", f"--cert={cert}", f"--pkey={key}", "--lt-cred-mech",
         f"--user={USER}:{PASSWORD}", "--realm=shim", "--no-cli", "--allow-loopback-peers",
         "--log-file=stdout", "--simple-log", f"--userdb={os.path.join(d, 'db')}",
         f"--pidfile={os.path.join(d, 'pid')}", "--min-port=50000", "--max-port=50999"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", tls_port), timeout=0.5).close()
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if p.poll() is not None or time.monotonic() > deadline:
                p.kill()
                pytest.skip(f"turnserver did not start: {open(log.name).read()[-1500:]}")
            time.sleep(0.1)
    yield {"port": port, "tls_port": tls_port, "cert": cert}
    p.terminate()
    try:
        p.wait(5)
    except subprocess.TimeoutExpired:
        p.kill()
    log.close()
    shutil.rmtree(d, ignore_errors=True)


def _relay_round_trip(turn, client_port):
    """Allocate, then data both ways between the relay and a plain UDP peer:
    Send/Data indications first, then ChannelData of odd lengths (padded on the
    stream, unpadded as datagrams)."""
    relayed = turn.allocate()
    assert relayed[0] == "127.0.0.1" and turn.mapped is not None
    with SocketPort("127.0.0.1", 0) as peer:
        paddr = peer.local_address()
        turn.create_permission([paddr])
        turn.send(b"via-send-indication", paddr)
        got = peer.recv(3.0)
        assert got is not None and got[0] == b"via-send-indication" and got[1] == relayed
        peer.send(b"via-data-indication", relayed)
        got = client_port.recv(3.0)
        assert got is not None and turn.handle(*got) == (b"via-data-indication", paddr)
        ch = turn.channel_bind(paddr)
        for n in (1, 2, 3, 4, 5, 1199, 1200):
            payload = bytes([n % 251]) * n
            turn.send(payload, paddr)
            got = peer.recv(3.0)
            assert got is not None and got[0] == payload, n
            peer.send(payload[::-1] + b"!", relayed)
            got = client_port.recv(3.0)
            assert got is not None
            data, src = got
            assert src == turn.server and len(data) == 4 + n + 1   # no stream padding
            assert turn.handle(data, src) == (payload[::-1] + b"!", paddr)
        assert ch >= 0x4000
    turn.refresh()


@pytest.mark.parametrize("transport", ["tcp", "tls"])
def test_allocation_and_data_over_a_stream(coturn, transport):
    port = coturn["tls_port"] if transport == "tls" else coturn["port"]
    cfg = NatConfig(turn=("127.0.0.1", port, USER, PASSWORD), turn_transport=transport,
                    turn_tls_ca=coturn["cert"], turn_timeout=3.0)
    with SocketPort("127.0.0.1", 0) as p:
        turn = open_turn(p, cfg)
        try:
            assert turn.transport == transport and turn.shim is not None
            assert turn.server == turn.shim.address
            _relay_round_trip(turn, p)
            assert turn.shim.client == p.local_address()
            # datagrams from another address than the client's are dropped
            with SocketPort("127.0.0.1", 0) as stranger:
                before = turn.shim.stats["dropped"]
                stranger.send(b"\x40\x00\x00\x01x", turn.server)
                t0 = time.monotonic()
                while turn.shim.stats["dropped"] == before and time.monotonic() - t0 < 2:
                    time.sleep(0.01)
                assert turn.shim.stats["dropped"] == before + 1
        finally:
            shim = turn.shim
            turn.close()
        assert turn.relayed is None and not shim.alive


def test_wrong_password_over_tcp_names_the_server(coturn):
    cfg = NatConfig(turn=("127.0.0.1", coturn["port"], USER, "wrong"), turn_transport="tcp")
    with SocketPort("127.0.0.1", 0) as p:
        turn = open_turn(p, cfg)
        try:
            with pytest.raises(NatError, match=r"\(tcp\) refused the credentials"):
                turn.allocate()
        finally:
            turn.close()


def test_refused_connection_and_bad_certificate_name_the_cause(coturn):
    with SocketPort("127.0.0.1", 0) as p:
        with pytest.raises(NatError, match="cannot connect.*TCP to the server blocked"):
            open_turn(p, NatConfig(turn=("127.0.0.1", _free_port(), USER, PASSWORD),
                                   turn_transport="tcp", turn_timeout=1.0))
        # TLS with the system CAs: the self-signed certificate fails verification
        with pytest.raises(NatError, match="certificate failed verification.*ERDMA_TURN_CA"):
            open_turn(p, NatConfig(turn=("127.0.0.1", coturn["tls_port"], USER, PASSWORD),
                                   turn_transport="tls", turn_timeout=3.0))
        # ... unless verification is off
        turn = open_turn(p, NatConfig(turn=("127.0.0.1", coturn["tls_port"], USER, PASSWORD),
                                      turn_transport="tls", turn_tls_verify=False))
        try:
            assert turn.allocate()
        finally:
            turn.close()


@pytest.mark.parametrize("server_sends,words", [
    (b"", "the server closed the connection"),
    (b"\xc0" + b"\0" * 19, "not STUN or ChannelData"),
])
def test_shim_reports_why_the_stream_ended(server_sends, words):
    """A TCP listener that closes the connection, or sends something that is
    neither STUN nor ChannelData: the shim stops and :attr:`error` says why."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        shim = TurnStreamShim(srv.getsockname(), "tcp")
        try:
            conn, _ = srv.accept()
            with conn:
                conn.sendall(server_sends)
                if not server_sends:
                    conn.shutdown(socket.SHUT_WR)
                t0 = time.monotonic()
                while shim.error is None and time.monotonic() - t0 < 5:
                    time.sleep(0.02)
            assert shim.error and words in shim.error, shim.error
            assert not shim.alive
        finally:
            shim.close()
