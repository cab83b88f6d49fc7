"""Scrape-time samples of live state for :class:`failslow.service.metrics.LiveCollector`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
from sqlalchemy import select

from failslow.detectors.vocab import IncidentKind
from failslow.service.context import AppContext
from failslow.service.incidents.models import Incident, IncidentState
from failslow.service.jobs.views import job_state_name
from failslow.service.metrics import JobSample


def _open_incidents(ctx: AppContext) -> list[tuple[str, str, list[int]]]:
    with ctx.sessions() as s:
        rows = s.execute(
            select(Incident.job_id, Incident.kind, Incident.ranks).where(
                Incident.state == IncidentState.OPEN
            )
        ).all()
    return [(j, k, list(r)) for j, k, r in rows]


def open_by_job(ctx: AppContext) -> dict[tuple[str, str], int]:
    """Open incidents per (job, kind) of the jobs this replica owns (every job without a bus),
    every kind of a job in memory included at 0: with replicas on one database each job is
    counted by one of them, so that a sum over replicas is the fleet's."""
    holds = ctx.jobs.holds
    out: dict[tuple[str, str], int] = {}
    for state in ctx.jobs.all():
        if state.persisted:
            out.update({(state.job, str(k)): 0 for k in IncidentKind})
    for job, kind, _ in _open_incidents(ctx):
        if holds is None or holds(job):
            out[(job, kind)] = out.get((job, kind), 0) + 1
    return out


MARGIN = 0.03  # a rank takes another's place among the top-K only if 3% slower than it


def stable_top_k(memory: dict[str, set[int]], job: str, ranks: list[int], score: np.ndarray,
                 k: int) -> set[int]:  # fmt: skip
    """The slots of the ``k`` slowest ranks (lowest scores), with hysteresis: a rank shown
    before is replaced only by one slower than it by ``MARGIN`` (one whose score is unknown this
    time counts as typical), so that the ranks of a healthy job, all within noise of 1.0, do not
    take turns in and out of the series, while a rank that turns slow enters at once."""
    score = score[: len(ranks)]
    finite = np.flatnonzero(np.isfinite(score))
    if not finite.size:
        return set()
    typical = float(np.median(score[finite]))
    slot_of = {r: i for i, r in enumerate(ranks)}
    value = {r: float(score[i]) if np.isfinite(score[i]) else typical for r, i in slot_of.items()}
    slowest = [ranks[i] for i in finite[np.argsort(score[finite], kind="stable")][:k].tolist()]
    kept = {r for r in memory.get(job, set()) if r in slot_of}
    for r in slowest:
        if r in kept:
            continue
        if len(kept) < k:
            kept.add(r)
            continue
        fastest = max(kept, key=value.__getitem__)
        if value[r] < value[fastest] - MARGIN:
            kept.discard(fastest)
            kept.add(r)
    memory[job] = kept
    return {slot_of[r] for r in kept if np.isfinite(score[slot_of[r]])}


def job_samples(ctx: AppContext) -> Iterator[JobSample]:
    top_k = ctx.settings.detection.top_k
    incidents = _open_incidents(ctx)
    now = time.monotonic()
    held = ctx.jobs.all()
    for job in set(ctx.metrics.top_slots) - {s.job for s in held}:  # jobs gone from memory
        ctx.metrics.top_slots.pop(job, None)
    for state in held:
        if not state.persisted:
            continue
        mine = [(k, r) for j, k, r in incidents if j == state.job]
        kinds = {k for k, _ in mine}
        in_incident = {rank for _, ranks in mine for rank in ranks}
        numbers = ctx.detection.numbers(state.job)
        counted = numbers is not None and numbers.frames > 0
        with state.lock:
            slot_rank = list(state.topology.slot_rank)
            hosts = {r: state.topology.ranks[r].host for r in slot_rank}
            gpus = {r: state.topology.ranks[r].gpu for r in slot_rank}
            stale_hosts = sum(1 for h in state.topology.hosts if state.host_stale(h, now))
            n_hosts = len(state.topology.hosts)
            clock_ahead, clock_held = len(state.clock.ahead_ns), state.clock.held_back
            stats = state.join_stats()
            pending, inflight = stats.pending_groups, stats.inflight
        name = job_state_name(state, kinds)
        control = ctx.controls.state(state.job)
        series: list[tuple[int, str, float | None, float | None]] = []
        scores = ctx.detection.rank_scores(state.job) if slot_rank else None
        if scores is not None:
            score, late = scores
            chosen = {s for s, r in enumerate(slot_rank) if r in in_incident and s < score.size}
            if top_k and score.size:
                chosen |= stable_top_k(ctx.metrics.top_slots, state.job, slot_rank, score, top_k)
            for slot in sorted(chosen):
                rank = slot_rank[slot]
                sc = float(score[slot]) if np.isfinite(score[slot]) else None
                lt = float(late[slot]) if np.isfinite(late[slot]) else None
                gpu = "" if gpus[rank] is None else str(gpus[rank])
                series.append((rank, hosts[rank] or "", gpu, sc, lt))
        yield JobSample(
            job=state.job,
            state=name,
            step_time_s=numbers.step_time_s if counted else None,  # type: ignore[union-attr]
            baseline_step_time_s=numbers.baseline_step_time_s if counted else None,  # type: ignore[union-attr]
            slowdown=numbers.slowdown if counted else None,  # type: ignore[union-attr]
            ranks=len(slot_rank),
            hosts=n_hosts,
            stale_hosts=stale_hosts,
            clock_ahead_hosts=clock_ahead,
            clock_held_back=clock_held,
            inflight=inflight,
            pending=pending,
            watermark_s=state.watermark_ns / 1e9,
            rank_series=series,
            muted=control.muted,
            paused=control.paused,
        )
