"""Concurrent faults and chronic heterogeneity as eval cases (issue 32), scored on placement and
onset.

Concurrent: a first fault at step 60 (slow GPU, slow node, slow NIC, slow cable) and, while it is
open, a second at step 100 on other components (slow GPU, slow node, slow NIC, slow cable, hang)
in the 64-rank layout (tp4 pp2 dp8; node-000..003 run stage 0, node-004..007 stage 1). Both must
be found on their own components, each dated at its own onset (within 3 steps); the delay reported
is the second fault's. Quick runs take six pairs, full runs every one of the 20.

Chronic: three ranks 8%, 12% and 15% slower than the rest from the first step; at step 74 the
others get 10% faster while rank 3's own speed stays (its ratio to its peers jumps, as workers of
a published production trace do). Nothing must be reported with an onset after the job began on
those ranks (a change of the peers is not an onset of their fault), nor anything elsewhere; a
report on them, if any, is dated at their first frame. With an episode: one other rank runs 2x
slow for 14 steps from step 120, the slowest of the job, and must be found at its onset.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from failslow.harness.simulator import Fault, Layout

PREFIX = "pattern:"
L64 = Layout(tp=4, pp=2, dp=8, gpus_per_host=8)
L32DP = Layout(tp=1, pp=1, dp=32, gpus_per_host=8)
FIRST_AT, SECOND_AT = 60, 100
ONSET_TOLERANCE = 3  # steps

FIRST = {
    "gpu": Fault("slow_gpu", FIRST_AT, factor=1.5, ranks=(9,)),  # node-001
    "node": Fault("slow_node", FIRST_AT, factor=1.5, hosts=("node-001",)),
    "nic": Fault("slow_nic", FIRST_AT, factor=3.0, hosts=("node-001",)),
    "pair": Fault("slow_link", FIRST_AT, factor=3.0, hosts=("node-000", "node-004")),
}
SECOND = {
    "gpu": Fault("slow_gpu", SECOND_AT, factor=1.5, ranks=(44,)),  # node-005
    "node": Fault("slow_node", SECOND_AT, factor=1.5, hosts=("node-006",)),
    "nic": Fault("slow_nic", SECOND_AT, factor=3.0, hosts=("node-005",)),
    "pair": Fault("slow_link", SECOND_AT, factor=3.0, hosts=("node-003", "node-007")),
    "hang": Fault("hang", SECOND_AT, ranks=(52,)),  # node-006
}
QUICK_PAIRS = (("gpu", "nic"), ("node", "pair"), ("nic", "nic"), ("pair", "nic"),
               ("nic", "node"), ("gpu", "hang"))  # fmt: skip

CHRONIC_RANKS = (3, 9, 14)
CHRONIC = (
    Fault("slow_gpu", 0, factor=1.12, ranks=(3,)),
    Fault("slow_gpu", 0, factor=1.08, ranks=(9,)),
    Fault("slow_gpu", 0, factor=1.15, ranks=(14,)),
    Fault("job_slowdown", 74, factor=0.9),
    Fault("slow_gpu", 74, factor=1 / 0.9, ranks=(3,)),
)
EPISODE = Fault("slow_gpu", 120, 134, factor=2.0, ranks=(5,))


def cases(add: Callable[..., None], *, quick: bool, seeds: int) -> None:
    """Add the cases through the suite's ``add(family, name, layout, faults, **kw)``."""
    pairs = QUICK_PAIRS if quick else tuple((a, b) for a in FIRST for b in SECOND)
    for seed in range(seeds):
        for a, b in pairs:
            second = SECOND[b]
            steps = SECOND_AT + 30 if second.kind == "hang" else 160
            add(f"{PREFIX}concurrent:{a}+{b}", f"concurrent-{a}-then-{b}-64r", L64,
                (FIRST[a], second), factor=second.factor, steps=steps, seed=seed)  # fmt: skip
        add(f"{PREFIX}chronic", "chronic-32r", L32DP, CHRONIC, steps=200, seed=seed)
        add(f"{PREFIX}chronic", "chronic-episode-32r", L32DP, (*CHRONIC, EPISODE), factor=2.0,
            steps=200, seed=seed)  # fmt: skip


def is_chronic(family: str) -> bool:
    return family == f"{PREFIX}chronic"


def score_chronic(out: Any, labels: dict[str, Any], incidents: list[dict[str, Any]]) -> None:
    """Fill ``out`` (a ``scoring.Scored``) for a chronic case: a report on a chronic rank is
    right only if dated at its first frame (step <= 5, the warm-up); the episode, where there is
    one, must be found on its rank at its onset; anything else is false."""
    episode = [
        f for f in labels["faults"] if f["kind"] == "slow_gpu" and f.get("end_step") is not None
    ]
    false = 0
    found = None
    for inc in incidents:
        ranks = list(inc["ranks"])
        if inc["kind"] == "slow_gpu" and len(ranks) == 1 and ranks[0] in CHRONIC_RANKS:
            if inc["onset_step"] is None or inc["onset_step"] > 5:
                false += 1  # an invented onset
        elif episode and inc["kind"] == "slow_gpu" and ranks == list(episode[0]["ranks"]):
            start = episode[0]["start_step"]
            if inc["onset_step"] is not None and abs(inc["onset_step"] - start) <= ONSET_TOLERANCE:
                found = inc if found is None else found
            else:
                false += 1
        else:
            false += 1
    out.false_incidents = false
    if episode:
        out.detected = out.localized = found is not None
        if found is not None and found["detected_step"] is not None:
            out.delay_steps = found["detected_step"] - episode[0]["start_step"]
            out.delay_s = round((found["detected_ns"] - episode[0]["onset_ns"]) / 1e9, 3)
    else:
        out.detected = out.localized = false == 0
