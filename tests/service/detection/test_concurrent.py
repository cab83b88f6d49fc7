"""A second fault while the first is open: found, and placed on its own component (issue 32).

Before: a slow NIC that began while a slow GPU was open went unseen (the GPU's host took half
the job's rings out of the frame, and the rest were all under the NIC: their own reference); a
slow cable while a slow node was open was never reported (its cost was measured against the
stretched step); two slow NICs share the rings between them and no single component fit.
"""

from __future__ import annotations

import pytest

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise
from tests.simrun import run

L64 = Layout(tp=4, pp=2, dp=8, gpus_per_host=8)  # 8 hosts: node-000..003 stage 0, 004..007 stage 1
L32PP = Layout(tp=1, pp=4, dp=8, gpus_per_host=4)  # 8 hosts, 2 per stage

FIRST = {
    "gpu": Fault("slow_gpu", 40, factor=1.5, ranks=(9,)),  # on node-001 in both layouts
    "node": Fault("slow_node", 40, factor=1.5, hosts=("node-001",)),
    "nic": Fault("slow_nic", 40, factor=3.0, hosts=("node-001",)),
    "pair": Fault("slow_link", 40, factor=3.0, hosts=("node-000", "node-004")),
}
SECOND = {
    "nic": (Fault("slow_nic", 80, factor=3.0, hosts=("node-005",)), "host:node-005"),
    "pair": (
        Fault("slow_link", 80, factor=3.0, hosts=("node-003", "node-007")),
        "link:node-003|node-007",
    ),
    "node": (Fault("slow_node", 80, factor=1.5, hosts=("node-006",)), "host:node-006"),
}
CASES = [("gpu", "nic"), ("gpu", "pair"), ("node", "pair"), ("nic", "nic"), ("pair", "nic"),
         ("nic", "pair"), ("nic", "node")]  # fmt: skip


@pytest.mark.parametrize(("first", "second"), CASES, ids=[f"{a}-then-{b}" for a, b in CASES])
def test_a_second_fault_is_placed_on_its_own_component(first: str, second: str) -> None:
    fault, subject = SECOND[second]
    r = run(Scenario(job="c", layout=L64, steps=110, noise=Noise(), faults=(FIRST[first], fault)))
    opened = [f for _, f in r.findings if f.status == "opened"]
    assert len(opened) == 2, [(f.kind, f.subject) for f in opened]
    assert opened[0].onset_index == 40 and opened[0].detected_index <= 44
    new = opened[1]
    assert str(new.subject) == subject
    assert new.onset_index == 80  # its own onset, not the first fault's
    assert new.detected_index <= 84


def test_two_nics_in_a_deep_pipeline() -> None:
    r = run(
        Scenario(
            job="c",
            layout=L32PP,
            steps=110,
            noise=Noise(),
            faults=(
                Fault("slow_nic", 40, factor=3.0, hosts=("node-001",)),
                Fault("slow_nic", 80, factor=3.0, hosts=("node-005",)),
            ),
        )
    )
    got = [(str(f.subject), f.onset_index) for _, f in r.findings if f.status == "opened"]
    assert got == [("host:node-001", 40), ("host:node-005", 80)]
