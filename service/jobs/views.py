"""Read models: job summaries and rank lists, merged from memory (live) and the database."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from failslow.detectors.vocab import SLOW_KINDS, IncidentKind
from failslow.service.incidents.models import Incident, IncidentState
from failslow.service.jobs import service as jobs_db
from failslow.service.jobs.models import Job
from failslow.service.jobs.schemas import JobDetail, JobSummary, RankOut
from failslow.service.stream.reading import DetectionReader, JobStateName, RankState
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.shape import host_vouch
from failslow.service.stream.state import JobState


def _clean(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x


def open_counts(session: Session, *, job: str | None = None) -> dict[str, dict[str, int]]:
    """Open incidents per job and kind."""
    q = select(Incident.job_id, Incident.kind, func.count()).where(
        Incident.state == IncidentState.OPEN
    )
    if job is not None:
        q = q.where(Incident.job_id == job)
    out: dict[str, dict[str, int]] = {}
    for job_id, kind, count in session.execute(q.group_by(Incident.job_id, Incident.kind)):
        out.setdefault(job_id, {})[kind] = count
    return out


def job_state_name(
    state: JobState | None, kinds: dict[str, int] | set[str]
) -> JobStateName:
    """healthy, degraded (an open slow incident), hung (an open hang) or stale (silent)."""
    hang = IncidentKind.HANG
    if hang in kinds and (not isinstance(kinds, dict) or kinds[hang]):
        return JobStateName.HUNG
    # not in memory: nothing received since this process started
    if state is None or state.is_stale(time.monotonic()):
        return JobStateName.STALE
    if any(k in kinds and (not isinstance(kinds, dict) or kinds[k]) for k in SLOW_KINDS):
        return JobStateName.DEGRADED
    return JobStateName.HEALTHY


def summary(
    row: Job,
    *,
    jobs: JobRegistry,
    detection: DetectionReader,
    kinds: dict[str, int],
) -> JobSummary:
    state = jobs.get(row.id)
    numbers = detection.numbers(row.id)
    view: dict[str, Any] = {}
    if numbers is not None and numbers.frames:
        view = {
            "step": numbers.step,
            "step_time_s": numbers.step_time_s,
            "baseline_step_time_s": numbers.baseline_step_time_s,
            "slowdown": numbers.slowdown,
        }
    live = state is not None
    return JobSummary(
        job=row.id,
        world_size=(
            state.topology.world_size if live and state.topology.world_size else row.world_size
        ),
        hosts=len(state.topology.hosts) if live else 0,
        state=job_state_name(state, kinds),
        step=view.get("step", row.last_step) if view else row.last_step,
        step_time_s=_clean(view.get("step_time_s", row.step_time_s) if view else row.step_time_s),
        baseline_step_time_s=_clean(
            view.get("baseline_step_time_s") if view else row.baseline_step_time_s
        ),
        slowdown=_clean(view.get("slowdown")) if view else None,
        open_incidents=sum(kinds.values()),
        first_seen_ns=(state.first_seen_ns or row.first_seen_ns) if live else row.first_seen_ns,
        last_seen_ns=state.watermark_ns if live else row.last_seen_ns,
        watermark_ns=_watermark(state, row),
    )


def _watermark(state: JobState | None, row: Job) -> int:
    """Event time up to which detection has consumed everything."""
    if state is None:
        return row.watermark_ns
    frames = state.frames
    if frames.frames:
        oldest_open = min(a.start_ns for a in frames.frames.values())
        return min(state.watermark_ns, oldest_open)
    return state.watermark_ns


def detail(
    session: Session,
    row: Job,
    *,
    jobs: JobRegistry,
    detection: DetectionReader,
    kinds: dict[str, int],
) -> JobDetail:
    base = summary(row, jobs=jobs, detection=detection, kinds=kinds)
    state = jobs.get(row.id)
    numbers = detection.numbers(row.id)
    hosts = jobs_db.host_counters(session, job=row.id)
    detector: dict[str, Any] = {}
    if state is not None:
        fb = state.frames
        with state.lock:  # what is staged is joined first: pending means incomplete
            state.drain_ready()
            join = state.join_stats()
            detector = {
                "frames_analysed": numbers.frames if numbers else 0,
                "mode": "steps" if fb.has_steps else ("time" if fb.time_mode else "undecided"),
                "open_frames": len(fb.frames),
                "pending_collectives": join.pending_groups,
                "staged_records": join.staged_records,
                "inflight_collectives": join.inflight,
                "expired_collectives": join.expired,
                "join_conflicts": join.conflicts,
                "join_duplicates": join.duplicates,
                "dropped_contributions": state.dropped_contributions(),
                "shards": state.shards.count if state.shards is not None else 0,
                "shard_restarts": state.shards.restarts if state.shards is not None else 0,
                "late_steps": fb.late_steps,
                "clock": clock_view(state),
                "completeness": completeness_view(state),
                "open_subjects": sorted(numbers.open_subjects) if numbers else [],
            }
    return JobDetail(
        **base.model_dump(),
        ranks=len(state.topology.ranks) if state else 0,
        comms=len(state.topology.comms) if state else 0,
        detector=detector,
        ingest={
            h.host: {
                "envelopes": h.envelopes,
                "accepted": h.records_accepted,
                "duplicates": h.records_duplicate,
                "rejected": h.records_rejected,
                "last_seen_ns": h.last_seen_ns,
            }
            for h in hosts
        },
    )


def clock_view(state: JobState) -> dict[str, Any]:
    """Hosts whose sent_ns runs ahead of the job's other hosts (a clock step, a forged
    envelope): how far, in seconds; their time does not move the job's (docs/event-time.md)."""
    names = {i: h for h, i in state.topology.host_ids.items()}
    return {
        "held_back_envelopes": state.clock.held_back,
        "hosts_ahead_s": {names.get(i, str(i)): round(ns / 1e9, 3)
                          for i, ns in sorted(state.clock.ahead_ns.items())},  # fmt: skip
    }


def completeness_view(state: JobState) -> dict[str, Any]:
    """What the job's hosts vouch for (docs/ingest-v1.md, "Completeness"), which decides how
    soon a stopped rank can be named: how many of its hosts vouch, the in-flight delay they
    announce, how far behind the job's time the oldest ``complete_ns`` is, and the in-flight and
    delivery delays measured from the records (where hosts do not vouch)."""
    vouch = host_vouch(state)
    measured, lag = state.inflight_delay.delay_s(), state.delivery_lag.lag_s()
    # the host whose complete_ns is furthest behind (a frozen process holds its host's)
    oldest = min(vouch, key=lambda h: vouch[h][0], default=None)
    return {
        "vouching_hosts": len(vouch),
        "hosts": len(state.topology.hosts),
        "inflight_after_s": max((a for _, a in vouch.values()), default=None),
        "oldest_complete": None if oldest is None else {
            "host": oldest,
            "lag_s": round(max(0, state.watermark_ns - vouch[oldest][0]) / 1e9, 3),
        },
        "measured_inflight_delay_s": None if measured is None else round(measured, 3),
        "measured_delivery_lag_s": None if lag is None else round(lag, 3),
    }


def ranks(
    state: JobState,
    *,
    detection: DetectionReader,
    incident_ranks: dict[int, str],
    states: frozenset[RankState] | None = None,
) -> list[RankOut]:
    """Every rank of the job, or those in ``states``."""
    with state.lock:
        slot_rank = list(state.topology.slot_rank)
        info = {r: (state.topology.ranks[r].host, state.topology.ranks[r].gpu) for r in slot_rank}
        now = time.monotonic()
        stale_hosts = {h for h in state.topology.hosts if state.host_stale(h, now)}
    scores = detection.rank_scores(state.job)
    score, late = scores if scores is not None else (np.zeros(0), np.zeros(0))
    out: list[RankOut] = []
    for slot, rank in enumerate(slot_rank):
        host, gpu = info[rank]
        s = float(score[slot]) if slot < score.size and np.isfinite(score[slot]) else None
        lt = float(late[slot]) if slot < late.size and np.isfinite(late[slot]) else None
        kind = incident_ranks.get(rank)
        if kind == IncidentKind.HANG:
            st = RankState.HUNG
        elif host is None or host in stale_hosts:
            st = RankState.STALE  # missing data is not failure
        elif kind is not None:
            st = RankState.SLOW
        else:
            st = RankState.OK
        if states is not None and st not in states:
            continue
        out.append(
            RankOut(
                rank=rank,
                host=host,
                gpu=gpu,
                state=st,
                score=round(s, 4) if s is not None else None,
                lateness_s=round(lt, 6) if lt is not None else None,
            )
        )
    out.sort(key=lambda r: r.rank)
    return out
