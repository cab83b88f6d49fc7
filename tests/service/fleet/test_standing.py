"""A part's standing, move by move: flagged -> suspect and back, a hard hang -> failed, probation
counted in clean job time and jobs, an incident during probation starts the count anew."""

from __future__ import annotations

from failslow.detectors.fleet import Health, PartKind, PartState
from failslow.service.fleet.models import FleetMark, FleetPart
from failslow.service.fleet.settings import FleetSettings
from failslow.service.fleet.standing import move

S = FleetSettings(probation_s=600, probation_jobs=2)


def part(kind: PartKind = PartKind.HOST, state: PartState = PartState.HEALTHY) -> FleetPart:
    return FleetPart(part_id="n7", kind=kind, host="n7", label="", state=state, state_since_ns=0,
                     state_reason="", clean_s=0.0, clean_jobs=[])  # fmt: skip


def mark(kind: str, *, hard: bool, job: str = "j1") -> FleetMark:
    return FleetMark(incident_id="inc", part_id="n7", job_id=job, kind=kind, severity="major",
                     at_ns=10, lost_s=1.0, hard=hard, final=False)  # fmt: skip


def test_flagged_parts_become_suspect_and_come_back() -> None:
    p = part(PartKind.GPU)
    slow = Health(slowness=1.06, low=1.04, slow=True, reasons=["6% slower than its peers"])
    move(p, slow, [], S, now_ns=5, added_s=60, jobs_since=["j1"])
    assert p.state == PartState.SUSPECT and p.state_reason == "6% slower than its peers"
    move(p, Health(), [], S, now_ns=9, added_s=60, jobs_since=["j2"])
    assert p.state == PartState.HEALTHY and p.state_since_ns == 9


def test_a_hard_hang_fails_a_host_and_probation_needs_time_and_jobs() -> None:
    p = part()
    move(p, Health(), [mark("hang", hard=True)], S, now_ns=5, added_s=0, jobs_since=[])
    assert p.state == PartState.FAILED and "failed hard: a hang in job j1" in p.state_reason
    gpu = part(PartKind.GPU)  # a hang fails hosts, not the GPUs under them
    move(gpu, Health(), [mark("hang", hard=True)], S, now_ns=5, added_s=0, jobs_since=[])
    assert gpu.state == PartState.HEALTHY
    p.state, p.state_since_ns = PartState.PROBATION, 6  # returned by an operator
    move(p, Health(), [], S, now_ns=7, added_s=400, jobs_since=["j2"])
    assert p.state == PartState.PROBATION and p.clean_s == 400  # not long enough yet
    move(p, Health(), [mark("slow_node", hard=False)], S, now_ns=8, added_s=100,
         jobs_since=["j3"])  # fmt: skip
    assert p.state == PartState.PROBATION and p.clean_s == 0  # an incident: the count anew
    move(p, Health(), [], S, now_ns=9, added_s=700, jobs_since=["j4"])
    assert p.state == PartState.PROBATION  # long enough, but one job
    move(p, Health(), [], S, now_ns=10, added_s=10, jobs_since=["j5"])
    assert p.state == PartState.HEALTHY and "probation over" in p.state_reason
