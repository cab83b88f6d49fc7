"""Judging the fleet's parts: health from the ledger (:mod:`failslow.detectors.fleet`), and each
part's standing.

Standing moves so:

- ``healthy`` -> ``suspect`` when the pooled evidence flags it (slow, or a repeat offender);
  back to ``healthy`` when it no longer does.
- any -> ``failed`` when a hang names the host (``fleet.fail_on_hang``), or an operator drains
  it: out until an operator returns it.
- ``failed`` or ``suspect`` -> ``probation`` when an operator returns it from repair; it leaves
  probation when it has run ``probation_s`` of job time in ``probation_jobs`` jobs with no
  incident naming it (a hard one sends it back to ``failed``; any other starts the count anew).

Times are the fleet's event time (the newest reading or incident the ledger holds), so that a
replayed or simulated fleet moves the same as a live one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import fields

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from failslow.detectors.fleet import (
    Health,
    IncidentMark,
    JobReading,
    PartKind,
    PartState,
    decay,
    fleet_rate,
    health,
    speed_cost,
    taus_of,
)
from failslow.service.fleet.models import FleetMark, FleetPart, FleetReading, in_chunks
from failslow.service.fleet.settings import FleetSettings
from failslow.service.ids import rfc3339

HEALTHY, SUSPECT, FAILED, PROBATION = (PartState.HEALTHY, PartState.SUSPECT, PartState.FAILED,
                                       PartState.PROBATION)  # fmt: skip
MAX_CLEAN_JOBS = 20


def fleet_now_ns(s: Session) -> int:
    """The fleet's event time: the newest reading or incident mark the ledger holds."""
    a = s.scalar(select(func.max(FleetReading.last_ns))) or 0
    b = s.scalar(select(func.max(FleetMark.at_ns))) or 0
    return int(max(a, b))


def judge(s: Session, settings: FleetSettings, *, touched: dict[str, float],
          fresh: dict[str, list[FleetMark]], full: bool = False) -> None:  # fmt: skip
    """Judge the parts that changed (``touched``: observed seconds added per part now;
    ``fresh``: marks made now, per part), against their kind's spread and incident rate; with
    ``full``, every part (the fleet's spread and rate move for all: the ledger asks for it
    every ``FULL_EVERY`` flushes)."""
    ids = sorted(set(touched) | set(fresh))
    if not ids and not full:
        return
    if full:
        kinds = set(s.scalars(select(FleetPart.kind).distinct()))
    else:
        kinds = set()
        for chunk in in_chunks(ids):
            kinds |= set(s.scalars(select(FleetPart.kind).distinct()
                                   .where(FleetPart.part_id.in_(chunk))))  # fmt: skip
    now_ns = fleet_now_ns(s)
    for kind in sorted(kinds):
        judge_kind(s, settings, PartKind(kind), now_ns=now_ns, touched=touched, fresh=fresh,
                   only=None if full else set(ids))  # fmt: skip


FULL_EVERY = 20  # flushes between judgements of every part (10 min at the default interval)


def judge_kind(s: Session, settings: FleetSettings, kind: PartKind, *, now_ns: int,
               touched: dict[str, float], fresh: dict[str, list[FleetMark]],
               only: set[str] | None = None) -> None:  # fmt: skip
    model = settings.link_model() if kind == PartKind.NIC else settings.model()
    q = select(FleetPart).where(FleetPart.kind == kind)
    parts = [p for p in s.scalars(q) if only is None or p.part_id in only]
    judged = {p.part_id for p in parts}
    readings: dict[str, list[tuple[JobReading, str, int]]] = defaultdict(list)
    cols = (FleetReading.part_id, FleetReading.n, FleetReading.mean, FleetReading.var,
            FleetReading.observed_s, FleetReading.lost_s, FleetReading.job_id,
            FleetReading.last_ns)  # fmt: skip
    every = select(*cols).join(FleetPart, FleetPart.part_id == FleetReading.part_id)
    for pid, n, mean, var, obs, lost, job, last in s.execute(every.where(FleetPart.kind == kind)):
        readings[pid].append((JobReading(n, mean, var, obs, lost), job, last))
    marks: dict[str, list[FleetMark]] = defaultdict(list)
    q2 = select(FleetMark).join(FleetPart, FleetPart.part_id == FleetMark.part_id)
    n_marks = 0
    for m in s.scalars(q2.where(FleetPart.kind == kind)):
        n_marks += 1
        if m.part_id in judged:
            marks[m.part_id].append(m)
    tau, passive_tau = taus_of([r for rows in readings.values() for r, _, _ in rows], model)
    observed = sum(r.observed_s for rows in readings.values() for r, _, _ in rows)
    rate = fleet_rate(n_marks, observed)
    now_s = now_ns / 1e9
    for part in parts:
        mine = marks.get(part.part_id, [])
        seen = [r for r, _, _ in readings.get(part.part_id, [])]
        h = health(
            seen,
            [IncidentMark(m.job_id, m.at_ns / 1e9, m.lost_s, m.hard) for m in mine],
            now_s=now_s, tau=tau, fleet_rate_per_h=rate, model=model, passive_tau=passive_tau,
        )  # fmt: skip
        # the job time its slowness surely cost: at the interval's lower end (0 unless the
        # evidence says slower than its peers), so that exposure alone ranks nothing
        surely = speed_cost(h, seen, model, h.low)
        part.cost_s = round(part.lost_s_total + surely, 3)
        part.flagged = h.flagged
        part.health = health_dict(h, tau=tau, fleet_rate=rate,
                                  passive_tau=passive_tau if model.link else None)  # fmt: skip
        jobs_since = [
            j for _, j, last in readings.get(part.part_id, []) if last > part.state_since_ns
        ]
        move(part, h, fresh.get(part.part_id, []), settings, now_ns=now_ns,
             added_s=touched.get(part.part_id, 0.0), jobs_since=jobs_since)  # fmt: skip
        stale = [m for m in mine if m.final and decay(now_s - m.at_ns / 1e9, model) < 0.01]
        if stale:
            s.execute(delete(FleetMark).where(FleetMark.part_id == part.part_id,
                      FleetMark.incident_id.in_([m.incident_id for m in stale])))  # fmt: skip


def move(part: FleetPart, h: Health, since: list[FleetMark], settings: FleetSettings, *,
         now_ns: int, added_s: float, jobs_since: list[str]) -> None:  # fmt: skip
    """The part's standing after this judgement; ``since``: the incidents that named it since
    the last one."""
    hard = [m for m in since if m.hard]
    if hard and settings.fail_on_hang and part.state != FAILED and part.kind == PartKind.HOST:
        m = hard[0]
        set_state(part, FAILED, now_ns, f"failed hard: a {m.kind} in job {m.job_id} at "
                  f"{rfc3339(m.at_ns)}; out until returned from repair")  # fmt: skip
        return
    if part.state == PROBATION:
        if since:
            last = since[-1]
            why = f"an incident ({last.kind} in job {last.job_id}) during probation"
            set_state(part, PROBATION, now_ns, f"{why}: the clean run starts anew")
            return
        part.clean_s = round(part.clean_s + added_s, 3)
        part.clean_jobs = sorted(set(part.clean_jobs) | set(jobs_since))[-MAX_CLEAN_JOBS:]
        if part.clean_s >= settings.probation_s and len(part.clean_jobs) >= settings.probation_jobs:
            set_state(part, HEALTHY, now_ns, f"ran clean for {part.clean_s:.0f} s in "
                      f"{len(part.clean_jobs)} jobs after its return: probation over")  # fmt: skip
        return
    if part.state == HEALTHY and h.flagged:
        set_state(part, SUSPECT, now_ns, "; ".join(h.reasons))
    elif part.state == SUSPECT and not h.flagged:
        set_state(part, HEALTHY, now_ns, "the evidence no longer flags it")
    elif part.state == SUSPECT:
        part.state_reason = "; ".join(h.reasons)


def set_state(part: FleetPart, state: PartState, now_ns: int, reason: str) -> None:
    part.state, part.state_reason = state, reason
    part.state_since_ns = max(now_ns, part.state_since_ns)
    part.clean_s, part.clean_jobs = 0.0, []


def health_dict(h: Health, *, tau: float, fleet_rate: float,
                passive_tau: float | None = None) -> dict[str, object]:  # fmt: skip
    """A part's health as stored (``passive_tau``: a NIC's, the spread of jobs' passive link
    readings)."""
    d = {f.name: getattr(h, f.name) for f in fields(h)}
    d["reasons"] = list(h.reasons)
    d.update(score=h.score, flagged=h.flagged, tau=tau, fleet_rate_per_h=fleet_rate)
    if passive_tau is not None:
        d["passive_tau"] = passive_tau
    return {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v)
            for k, v in d.items()}  # fmt: skip
