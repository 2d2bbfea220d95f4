"""Whole erdmampi jobs across NATs: sites in network namespaces behind
nftables NAT routers (erdmampi.testing.natbed), a rendezvous server and coturn in
the 'public' namespace, one `erdmarun --rendezvous --job-id` per site.

Each rank runs tests/scripts/nat_job.py (Allreduce, Bcast, Alltoall, bcast with
checked results) and prints the route the engine uses to every peer.
"""
import json
import os
import re
import secrets
import subprocess
import sys
import time

import pytest

from erdmampi.testing.natbed import TURN_PASSWORD, TURN_USER, NatBed, natbed_available

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "nat_job.py")
ERDMARUN = [sys.executable, "-m", "erdmampi.launcher"]
RDV_PORT = 7411

pytestmark = pytest.mark.skipif(natbed_available(turn=True) is not None,
                                reason=str(natbed_available(turn=True)))


def _engine_has_nat():
    from erdmampi._engine import Engine
    return hasattr(Engine, "raw_send")


class Job:
    """A bed with a rendezvous server (and coturn) in the public namespace."""

    def __init__(self, bed, turn=True, tls_port=None):
        self.bed = bed
        self.turn = bed.start_turn(tls_port=tls_port) if turn else None
        self.rdv = f"198.18.0.2:{RDV_PORT}"
        serve = f"[::]:{RDV_PORT}" if bed.ipv6 else self.rdv   # both families
        self.secret_file = bed.tmpdir / "secret"
        self.secret_file.write_text(secrets.token_hex(16))
        self.secret_file.chmod(0o600)
        # a strict store: it creates a job space only for this secret's jobs
        p = bed.popen("pub", [*ERDMARUN, "--serve-rendezvous", serve, "--require-auth",
                              "--admit-file", str(self.secret_file)],
                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
        line = p.stdout.readline()
        assert str(RDV_PORT) in line, f"rendezvous server did not start: {line!r}"

    def env(self, **extra):
        env = dict(os.environ)
        env.pop("ERDMA_JOB_SECRET", None)
        env.update(PYTHONPATH=os.pathsep.join(p for p in sys.path if p), PYTHONUNBUFFERED="1",
                   ERDMA_CONNECT_TIMEOUT="40", ERDMA_TIMEOUT="20", OMP_NUM_THREADS="1")
        if self.turn is not None:
            h, port = self.turn
            env["ERDMA_STUN"] = ",".join(f"[{a}]:{b}" if ":" in a else f"{a}:{b}"
                                         for a, b in self.bed.stun_servers)
            env["ERDMA_TURN"] = f"{TURN_USER}:{TURN_PASSWORD}@{h}:{port}"
        else:
            env["ERDMA_NAT"] = "1"
        env.update(extra)
        return env

    def run(self, layout, n, args=(), timeout=120, env=None, expect_ok=True, script=SCRIPT):
        """layout: [(site, host_index, ranks there)], ranks numbered in layout order;
        env: one environment for all, or a list of one per layout entry;
        returns (output, exit codes, per-rank records)."""
        jobid = "nat" + secrets.token_hex(4)
        procs, first = [], 0
        for i, (site, j, k) in enumerate(layout):
            # a site without IPv4 reaches the rendezvous over IPv6
            v6_only = self.bed.kinds[site] == "v6_only"
            rdv = f"[fd00:198:18::2]:{RDV_PORT}" if v6_only else self.rdv
            argv = [*ERDMARUN, "--rendezvous", rdv, "--job-id", jobid, "-n", str(n),
                    "--ranks", f"{first}-{first + k - 1}", "--secret-file", str(self.secret_file),
                    "--tag-output", "--connect-timeout", "40", "--timeout", str(timeout),
                    sys.executable, script, *map(str, args)]
            e = dict((env[i] if isinstance(env, list) else env) or self.env())
            e["ERDMA_HOST"] = f"natbed-site{site}-{j}"  # one machine: tell sites apart
            procs.append(self.bed.popen((site, j), argv, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, env=e, cwd=ROOT))
            first += k
        outs, codes = [], []
        deadline = time.monotonic() + timeout + 30
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                pytest.fail(f"a site hung past {timeout}s:\n{out}")
            outs.append(out)
            codes.append(p.returncode)
        text = "\n".join(outs)
        recs = {}
        for m in re.finditer(r"NATJOB (\{.*\})", text):
            rec = json.loads(m.group(1))
            recs[rec["rank"]] = rec
        if expect_ok:
            assert codes == [0] * len(procs), f"exit codes {codes}:\n{text}\n{self.bed.turn_log()[-3000:]}"
            if script == SCRIPT:
                assert sorted(recs) == list(range(n)), text
        return text, codes, recs


def _routes(recs):
    return {(r, int(p)): how for r, rec in recs.items() for p, how in rec["routes"].items()}


def _assert_relayed(recs, a, b):
    """Ranks a and b reach each other through a TURN relay: both chose a relayed
    pair, and one of them (the one holding the allocation) tunnels through it."""
    ra, rb = recs[a], recs[b]
    assert ra["paths"][str(b)].startswith("relay"), ra
    assert rb["paths"][str(a)].startswith("relay"), rb
    assert "relay" in (ra["routes"][str(b)], rb["routes"][str(a)]), (ra, rb)


needs_nat_engine = pytest.mark.skipif(not _engine_has_nat(),
                                      reason="engine built without the NAT layer")


@needs_nat_engine
@pytest.mark.parametrize("kinds", [("full_cone", "full_cone"),
                                   ("port_restricted", "port_restricted"),
                                   ("none", "port_restricted")])
def test_cone_nats_connect_directly(kinds):
    with NatBed(list(kinds)) as bed:
        job = Job(bed)
        _, _, recs = job.run([(0, 0, 1), (1, 0, 1)], 2)
        assert set(_routes(recs).values()) == {"direct"}, recs
        for rec in recs.values():
            assert all(d.startswith("direct") for d in rec["paths"].values()), rec


@needs_nat_engine
@pytest.mark.parametrize("kinds", [("symmetric", "symmetric"),
                                   ("symmetric", "port_restricted")])
def test_symmetric_nat_goes_through_the_relay(kinds):
    with NatBed(list(kinds)) as bed:
        job = Job(bed)
        _, _, recs = job.run([(0, 0, 1), (1, 0, 1)], 2)
        _assert_relayed(recs, 0, 1)


# Every pair of site kinds (docs/nat.md, "Whole jobs: every pair of NAT kinds"):
# whether it connects directly or through the relay.  "none" is a public host;
# a udp_blocked site reaches coturn over TCP.
_KINDS = ["none", "full_cone", "port_restricted", "symmetric", "udp_blocked"]
_RELAYED = {("port_restricted", "symmetric"), ("symmetric", "symmetric")}
MATRIX = [(a, b) for i, a in enumerate(_KINDS) for b in _KINDS[i:]]


@needs_nat_engine
@pytest.mark.slow
@pytest.mark.parametrize("kinds", MATRIX, ids=["-".join(k) for k in MATRIX])
def test_every_pair_of_nat_kinds_runs_a_job(kinds):
    """A 2-rank job, one rank per site, runs its checked collectives; the pair
    is direct unless a symmetric NAT meets a filtering one, or a site blocks
    UDP (then it reaches its TURN server over TCP and the pair is relayed)."""
    with NatBed(list(kinds)) as bed:
        job = Job(bed)
        # ERDMA_VERBOSE: a failure shows each rank's candidates and paths
        envs = [job.env(ERDMA_TURN=_turn_uri(job), ERDMA_VERBOSE="1") if k == "udp_blocked"
                else job.env(ERDMA_VERBOSE="1") for k in kinds]
        _, _, recs = job.run([(0, 0, 1), (1, 0, 1)], 2, args=[2], env=envs)
    relayed = "udp_blocked" in kinds or kinds in _RELAYED
    if relayed:
        _assert_relayed(recs, 0, 1)
    else:
        assert set(_routes(recs).values()) == {"direct"}, recs
    print(f"NATPAIR {kinds[0]} {kinds[1]}: {recs[0]['paths']['1']} | {recs[1]['paths']['0']}; "
          f"routes {recs[0]['routes']['1']}/{recs[1]['routes']['0']}; bootstrap "
          f"{max(r['bootstrap_seconds'] or 0 for r in recs.values()):.2f} s")


@needs_nat_engine
@pytest.mark.slow
def test_ipv6_only_site_and_dual_stack_site():
    """An IPv6-only site, a dual-stack public host and an IPv4-only NATed
    site in one job: the dual-stack rank binds one socket for both families
    and reaches the IPv6-only rank over IPv6 and the NATed one over IPv4; the
    IPv6-only rank reaches the IPv4-only one through its TURN allocation (an
    IPv4 relayed address, reached over IPv6)."""
    with NatBed(["v6_only", "none", "full_cone"]) as bed:
        job = Job(bed)
        turn6 = f"{TURN_USER}:{TURN_PASSWORD}@[fd00:198:18::1]:{job.turn[1]}"
        envs = [job.env(ERDMA_TURN=turn6), job.env(), job.env()]
        text, _, recs = job.run([(0, 0, 1), (1, 0, 1), (2, 0, 1)], 3, env=envs)
    paths = {(r, int(p)): d for r, rec in recs.items() for p, d in rec["paths"].items()}
    routes = _routes(recs)
    v6, dual = bed.host(0).addr6, bed.host(1).addr6
    assert paths[(1, 0)].startswith("direct") and v6 in paths[(1, 0)], paths
    assert paths[(0, 1)].startswith("direct") and dual in paths[(0, 1)], paths
    assert paths[(1, 2)].startswith("direct") and paths[(2, 1)].startswith("direct"), paths
    assert ":" not in paths[(1, 2)].rsplit(" ", 1)[1].rsplit(":", 1)[0], paths  # over IPv4
    assert routes[(0, 1)] == routes[(1, 0)] == "direct", routes
    _assert_relayed(recs, 0, 2)


RETURN_SCRIPT = os.path.join(ROOT, "tests", "scripts", "nat_return.py")


@needs_nat_engine
@pytest.mark.slow
def test_pair_started_on_the_relay_moves_to_the_direct_path():
    """Two port-restricted sites whose routers drop UDP between them while the
    checks run (a punch that loses its race) start on the relay; once the
    path opens, both move to it within 30 s, with every Allreduce checked."""
    import threading
    with NatBed(["port_restricted", "port_restricted"]) as bed:
        job = Job(bed)
        other = bed.router_public[1]
        for sel in ("saddr", "daddr"):
            bed.run(("router", 0), ["nft", "add", "rule", "ip", "natbed", "cutoff",
                                    "ip", sel, other, "drop"])
        flags = bed.tmpdir / "flags"
        flags.mkdir()
        opened = []

        def opener():
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if all((flags / f"started-{r}").exists() for r in (0, 1)):
                    bed.run(("router", 0), ["nft", "flush", "chain", "ip", "natbed", "cutoff"])
                    opened.append(time.monotonic())
                    (flags / "opened").write_text("")
                    return
                time.sleep(0.1)
        t = threading.Thread(target=opener, daemon=True)
        t.start()
        text, _, _ = job.run([(0, 0, 1), (1, 0, 1)], 2, args=[flags, 30], timeout=150,
                             script=RETURN_SCRIPT)
        t.join(5)
    recs = {}
    for m in re.finditer(r"NATRET (\{.*\})", text):
        rec = json.loads(m.group(1))
        recs[rec["rank"]] = rec
    assert sorted(recs) == [0, 1] and opened, text
    for r, rec in recs.items():
        assert rec["paths"][str(1 - r)].startswith("relay"), rec    # the checks chose the relay
        assert rec["start_route"] == "relay", rec
        assert rec["end_route"] == "direct", rec
        assert rec["seconds_to_direct"] < 30, rec
        assert rec["to_direct"] == 1 and rec["to_relay"] == 0, rec


EXAMPLE = os.path.join(ROOT, "hpc_examples", "ddp_train.py")


@needs_nat_engine
@pytest.mark.slow
@pytest.mark.parametrize("kinds", [("port_restricted", "full_cone"), ("symmetric", "symmetric")])
def test_torch_ddp_example_across_two_nat_sites(kinds):
    """The DDP example, one rank per NATed site (directly, or through the
    relay), with init_method erdma://, trains to the same weights as two
    ranks on one host."""
    pytest.importorskip("torch")
    from harness import run_mpi
    args = ["--steps", "30", "--init-method", "erdma://"]
    local = run_mpi(2, EXAMPLE, args=args, timeout=120, env={"PYTHONWARNINGS": "ignore"})
    assert local.returncode == 0, local.stdout + local.stderr
    want = re.search(r"final_loss=(\S+) param_sum=(\S+)", local.stdout)
    assert want, local.stdout
    with NatBed(list(kinds)) as bed:
        job = Job(bed)
        text, _, _ = job.run([(0, 0, 1), (1, 0, 1)], 2, args=args, timeout=150, script=EXAMPLE,
                             env=job.env(PYTHONWARNINGS="ignore"))
    got = re.search(r"final_loss=(\S+) param_sum=(\S+)", text)
    assert got, text
    assert got.groups() == want.groups(), (got.groups(), want.groups())


@needs_nat_engine
def test_udp_blocked_fails_with_the_cause():
    with NatBed(["udp_blocked", "full_cone"]) as bed:
        job = Job(bed)
        t0 = time.monotonic()
        text, codes, _ = job.run([(0, 0, 1), (1, 0, 1)], 2, timeout=90, expect_ok=False)
        assert codes[0] != 0 and codes[1] != 0, text
        assert "UDP" in text and "blocked" in text, text
        assert "transport=tcp" in text and "turns:" in text, text   # the way out
        assert time.monotonic() - t0 < 90, "the failure must come within the timeouts"


def _turn_uri(job, scheme="turn", port=None, query="?transport=tcp"):
    h, p = job.turn
    return f"{scheme}:{TURN_USER}:{TURN_PASSWORD}@{h}:{port or p}{query}"


@needs_nat_engine
@pytest.mark.parametrize("kinds", [("udp_blocked", "full_cone"), ("udp_blocked", "udp_blocked")])
def test_udp_blocked_site_joins_through_turn_over_tcp(kinds):
    """A site that drops all UDP reaches coturn over TCP, gets a UDP relayed
    address, and its peer (a full cone site on plain UDP TURN, or another
    UDP-blocked site) reaches it there; QUIC runs through the relay."""
    with NatBed(list(kinds)) as bed:
        job = Job(bed)
        envs = [job.env(ERDMA_TURN=_turn_uri(job)) if kind == "udp_blocked" else job.env()
                for kind in kinds]
        text, _, recs = job.run([(0, 0, 1), (1, 0, 1)], 2, env=envs)
        _assert_relayed(recs, 0, 1)
        # the UDP-blocked rank sends nothing but through its TCP allocation
        assert recs[0]["routes"]["1"] == "relay", recs
        if kinds[1] == "udp_blocked":
            assert recs[1]["routes"]["0"] == "relay", recs


@needs_nat_engine
def test_udp_blocked_site_joins_through_turn_over_tls():
    """turns: -- TLS over TCP on port 443, the server's self-signed certificate
    verified against ERDMA_TURN_CA."""
    with NatBed(["udp_blocked", "full_cone"]) as bed:
        job = Job(bed, tls_port=443)
        cert, _ = bed.tls_cert()
        blocked = job.env(ERDMA_TURN=_turn_uri(job, "turns", 443, ""), ERDMA_TURN_CA=cert)
        _, _, recs = job.run([(0, 0, 1), (1, 0, 1)], 2, env=[blocked, job.env()])
        _assert_relayed(recs, 0, 1)
        assert recs[0]["routes"]["1"] == "relay", recs


@needs_nat_engine
@pytest.mark.slow
def test_eight_ranks_over_three_nat_sites():
    with NatBed(["full_cone", "port_restricted", "symmetric"], hosts=[1, 1, 1]) as bed:
        job = Job(bed)
        _, _, recs = job.run([(0, 0, 3), (1, 0, 3), (2, 0, 2)], 8, args=(3,), timeout=180)
        routes = _routes(recs)
        # ranks of one site share memory; across sites: direct between the cones
        # and from the symmetric site to the full cone (which takes anything),
        # through the relay between the symmetric and the port-restricted sites
        assert routes[(0, 1)] == "shm" and routes[(6, 7)] == "shm", routes
        assert routes[(0, 3)] == "direct" and routes[(3, 0)] == "direct", routes
        assert recs[6]["paths"]["0"].startswith("direct"), recs[6]
        for a in (6, 7):
            for b in (3, 4, 5):
                _assert_relayed(recs, a, b)
        secs = [rec["bootstrap_seconds"] for rec in recs.values()]
        print(f"8 ranks over 3 NAT sites: mesh formed in {max(secs):.2f} s")


@needs_nat_engine
def test_stranger_without_the_secret_cannot_join():
    with NatBed(["full_cone", "full_cone"]) as bed:
        job = Job(bed)
        env = job.env()
        jobid = "nat" + secrets.token_hex(4)
        wrong = bed.tmpdir / "wrong"
        wrong.write_text(secrets.token_hex(16))
        wrong.chmod(0o600)
        good = bed.popen((0, 0), [*ERDMARUN, "--rendezvous", job.rdv, "--job-id", jobid,
                                  "-n", "2", "--local-n", "1", "--secret-file", str(job.secret_file),
                                  "--connect-timeout", "15", sys.executable, SCRIPT],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         cwd=ROOT)
        bad = bed.popen((1, 0), [*ERDMARUN, "--rendezvous", job.rdv, "--job-id", jobid,
                                 "-n", "2", "--local-n", "1", "--secret-file", str(wrong),
                                 "--connect-timeout", "15", sys.executable, SCRIPT],
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                        cwd=ROOT)
        out_bad, _ = bad.communicate(timeout=60)
        out_good, _ = good.communicate(timeout=60)
        assert bad.returncode != 0 and good.returncode != 0
        assert "NATJOB" not in out_good + out_bad


def _start_sites(job, layout, n, args, env):
    """Like Job.run, but returns the running site processes."""
    jobid = "nat" + secrets.token_hex(4)
    procs, first = [], 0
    for site, j, k in layout:
        argv = [*ERDMARUN, "--rendezvous", job.rdv, "--job-id", jobid, "-n", str(n),
                "--ranks", f"{first}-{first + k - 1}", "--secret-file", str(job.secret_file),
                "--tag-output", "--connect-timeout", "40", "--timeout", "120",
                sys.executable, SCRIPT, *map(str, args)]
        e = dict(env)
        e["ERDMA_HOST"] = f"natbed-site{site}-{j}"
        procs.append(job.bed.popen((site, j), argv, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, env=e, cwd=ROOT))
        first += k
    return procs


def _cut_between(bed, site, other):
    """Drop traffic between a NATed site and another site's public address only:
    the direct path dies, the TURN server stays reachable."""
    pub = bed.public_address(other)
    for sel in ("saddr", "daddr"):
        bed.run(("router", site), ["nft", "add", "rule", "ip", "natbed", "cutoff",
                                   "ip", sel, pub, "drop"])


@needs_nat_engine
@pytest.mark.slow
def test_direct_path_cut_mid_job_moves_to_the_relay():
    with NatBed(["full_cone", "port_restricted"]) as bed:
        job = Job(bed)
        env = job.env(ERDMA_PATH_TIMEOUT="1.5", ERDMA_TIMEOUT="30")
        procs = _start_sites(job, [(0, 0, 1), (1, 0, 1)], 2, (14, 0.4), env)
        time.sleep(4.0)          # bootstrap (about 1 s) and a few iterations
        _cut_between(bed, 1, 0)
        outs = [p.communicate(timeout=150)[0] for p in procs]
        text = "\n".join(outs)
        assert [p.returncode for p in procs] == [0, 0], text
        recs = {json.loads(m.group(1))["rank"]: json.loads(m.group(1))
                for m in re.finditer(r"NATJOB (\{.*\})", text)}
        assert sorted(recs) == [0, 1], text
        assert recs[0]["paths"]["1"].startswith("direct"), recs   # chosen at start
        assert recs[0]["routes"]["1"] == "relay" and recs[1]["routes"]["0"] == "relay", recs


@needs_nat_engine
def test_path_cut_without_a_relay_fails_with_an_mpi_error():
    with NatBed(["none", "full_cone"]) as bed:
        job = Job(bed, turn=False)
        env = job.env(ERDMA_TIMEOUT="4", ERDMA_KEEPALIVE="1")
        procs = _start_sites(job, [(0, 0, 1), (1, 0, 1)], 2, (40, 0.25), env)
        time.sleep(3.0)
        t0 = time.monotonic()
        _cut_between(bed, 1, 0)
        outs = [p.communicate(timeout=90)[0] for p in procs]
        elapsed = time.monotonic() - t0
        text = "\n".join(outs)
        assert all(p.returncode != 0 for p in procs), text
        assert "NATJOB" not in text
        assert "MPI" in text or "peer" in text.lower(), text
        assert elapsed < 45, f"took {elapsed:.0f} s to fail"
