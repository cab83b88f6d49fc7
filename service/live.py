"""Scrape-time samples of live state for :class:`failslow.service.metrics.LiveCollector`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
from sqlalchemy import select

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


def open_by_kind(ctx: AppContext) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, kind, _ in _open_incidents(ctx):
        out[kind] = out.get(kind, 0) + 1
    return out


def job_samples(ctx: AppContext) -> Iterator[JobSample]:
    top_k = ctx.settings.detection.top_k
    incidents = _open_incidents(ctx)
    now = time.monotonic()
    for state in ctx.jobs.all():
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
                finite = np.flatnonzero(np.isfinite(score[: len(slot_rank)]))
                chosen |= set(finite[np.argsort(score[finite])[:top_k]].tolist())
            for slot in sorted(chosen):
                rank = slot_rank[slot]
                sc = float(score[slot]) if np.isfinite(score[slot]) else None
                lt = float(late[slot]) if np.isfinite(late[slot]) else None
                series.append((rank, hosts[rank] or "", sc, lt))
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
