"""NAT rebinding mid-job: a site's NAT gives its rank a new external port while
a transfer loop runs (the mapping expired or the router rebooted).

The router of the rebinding site gets a masquerade rule with another port
range and its UDP conntrack entries for the host are deleted, so the next
packet the rank sends leaves from a new external port.  The peer is public
(`none`), so nothing else in the path filters the new port; no TURN relay is
configured, so the job can only survive on the direct path.  Both QUIC roles
are covered: in one case the rank behind the rebinding NAT is rank 0, in the
other rank 1.
"""
import json
import re
import subprocess
import time

import pytest

from erdmampi.testing.natbed import NatBed
from test_nat_jobs import Job, _start_sites, needs_nat_engine, pytestmark  # noqa: F401

# Below the kernel's ephemeral range (32768-60999): masquerade keeps a
# rank's own source port when it can, so a range inside it could already
# hold the mapping from before the rebinding.
NEW_PORTS = (21000, 21999)


def _rebind(bed, site):
    """New external ports for the host of `site` from now on: the masquerade
    rule maps into NEW_PORTS and the existing UDP mappings are forgotten."""
    h = bed.host(site)
    rules = ("flush chain ip natbed nat_post\n"
             f'add rule ip natbed nat_post oifname "wan" meta l4proto udp masquerade to :{NEW_PORTS[0]}-{NEW_PORTS[1]}\n'
             f'add rule ip natbed nat_post oifname "wan" masquerade\n')
    bed.run(("router", site), ["nft", "-f", "-"], input=rules)
    for opt in ("--orig-src", "--reply-dst"):
        bed.run(("router", site), ["conntrack", "-D", "-p", "udp", opt, h.addr], check=False)


def _external_ports(bed, site):
    """The external (reply-direction destination) UDP ports of the host's mappings."""
    h = bed.host(site)
    out = bed.run(("router", site), ["conntrack", "-L", "-p", "udp", "--orig-src", h.addr],
                  check=False).stdout
    return {int(m.group(1)) for m in re.finditer(r"dst=\S+ sport=\d+ dport=(\d+)\s*(?:\[|mark|$)",
                                                  out, re.M)}, out


@needs_nat_engine
@pytest.mark.parametrize("kinds", [("port_restricted", "none"), ("none", "port_restricted")],
                         ids=["rank0-rebinds", "rank1-rebinds"])
def test_nat_rebinding_mid_job_keeps_the_direct_path(kinds):
    site = kinds.index("port_restricted")
    peer = 1 - site
    with NatBed(list(kinds)) as bed:
        job = Job(bed, turn=False)
        env = job.env(ERDMA_TIMEOUT="30", ERDMA_KEEPALIVE="1", ERDMA_VERBOSE="1")
        procs = _start_sites(job, [(0, 0, 1), (1, 0, 1)], 2, (40, 0.2), env)
        time.sleep(4.0)          # bootstrap (about 1 s) and some iterations
        before, _ = _external_ports(bed, site)
        assert before and not any(NEW_PORTS[0] <= p <= NEW_PORTS[1] for p in before), before
        t0 = time.monotonic()
        _rebind(bed, site)
        try:
            outs = [p.communicate(timeout=90)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        elapsed = time.monotonic() - t0
        text = "\n".join(outs)
        assert [p.returncode for p in procs] == [0, 0], text
        recs = {json.loads(m.group(1))["rank"]: json.loads(m.group(1))
                for m in re.finditer(r"NATJOB (\{.*\})", text)}
        assert sorted(recs) == [0, 1], text
        # no relay exists: the direct path carried everything before and after
        assert recs[0]["routes"]["1"] == "direct" and recs[1]["routes"]["0"] == "direct", recs
        # the new external port was used: the router mapped the rank into
        # NEW_PORTS, and the peer's engine saw its packets come from there
        after, table = _external_ports(bed, site)
        assert any(NEW_PORTS[0] <= p <= NEW_PORTS[1] for p in after), table
        moved = re.findall(rf"erdma\[{peer}\]: peer {site}: address changed from \S+ to "
                           rf"[\d.]+:(\d+)", text)
        assert moved and all(NEW_PORTS[0] <= int(p) <= NEW_PORTS[1] for p in moved), text
        # bounded: the rest of the loop (about 8 s of pauses) plus recovery
        assert elapsed < 60, f"took {elapsed:.0f} s after the rebinding"
