"""``create_app(settings)``: everything is built in the lifespan and kept on ``app.state.ctx``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from starlette.concurrency import run_in_threadpool

from failslow.service import __version__
from failslow.service.actions import service as actions_db
from failslow.service.actions.router import router as actions_router
from failslow.service.actions.scheduler import Mitigation
from failslow.service.auth import tenant_of
from failslow.service.bus.client import Bus
from failslow.service.context import AppContext
from failslow.service.control.reader import Controls
from failslow.service.control.router import router as control_router
from failslow.service.db import make_engine, make_sessionmaker, session_scope, upgrade
from failslow.service.detection.engine import DetectionEngine
from failslow.service.detection.stale import StaleCloser
from failslow.service.errors import install_handlers
from failslow.service.fleet.gauges import FleetCollector
from failslow.service.fleet.ledger import FleetLedger
from failslow.service.fleet.qualify_api import router as qualify_router
from failslow.service.fleet.router import router as fleet_router
from failslow.service.incidents.router import router as incidents_router
from failslow.service.ingest.bundle import router as ingest_bundle_router
from failslow.service.ingest.fastpath import FailslowApp
from failslow.service.ingest.router import router as ingest_router
from failslow.service.ingest.schemas import envelope_schema
from failslow.service.ingest.service import Committer
from failslow.service.ingest.v2 import TopologyIn
from failslow.service.ingest.v2 import router as ingest_v2_router
from failslow.service.jobs import service as jobs_db
from failslow.service.jobs.router import router as jobs_router
from failslow.service.lease import Lease, LeaseHeld
from failslow.service.live import job_samples, open_by_job
from failslow.service.metrics import LiveCollector, Metrics
from failslow.service.ops.router import router as ops_router
from failslow.service.plans.router import router as plans_router
from failslow.service.probes.manager import ProbeManager
from failslow.service.probes.router import router as probes_router
from failslow.service.replica.context import Owned
from failslow.service.replica.local import LocalSnapshots
from failslow.service.replica.ownership import Ownership
from failslow.service.settings import Settings
from failslow.service.stream.registry import JobRegistry
from failslow.service.stream.state import JobState
from failslow.service.ui.router import router as ui_router

log = logging.getLogger(__name__)


class FailureLog:
    """Log a loop's failure with its traceback once, then one line every ``every_s`` while it
    keeps failing (a database away for a minute is not 600 tracebacks), and its recovery."""

    def __init__(self, what: str, every_s: float = 30.0) -> None:
        self.what, self.every_s = what, every_s
        self.failures, self.last_logged = 0, -float("inf")

    def failed(self, exc: BaseException) -> None:
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1:
            log.error("%s failed", self.what, exc_info=exc)
        elif now - self.last_logged >= self.every_s:
            log.error("%s still failing (%d times): %s", self.what, self.failures, exc)
        else:
            return
        self.last_logged = now

    def succeeded(self) -> None:
        if self.failures:
            log.warning("%s works again after %d failures", self.what, self.failures)
            self.failures = 0


async def detection_loop(ctx: AppContext) -> None:
    """Run detection over jobs with new data every ``detection.interval_s``; never dies."""
    interval = ctx.settings.detection.interval_s
    failures = FailureLog("detection loop iteration")
    while True:
        if ctx.lease is not None and ctx.lease.lost:  # another service writes now
            await asyncio.sleep(interval)
            continue
        try:
            await run_in_threadpool(ctx.detection.run_due)
            await run_in_threadpool(ctx.mitigation.run_due)
            await run_in_threadpool(ctx.probes.run_due)
            await run_in_threadpool(ctx.stale.run_due)
            ctx.jobs.evict_idle()
            failures.succeeded()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            failures.failed(exc)
        await asyncio.sleep(interval)


async def fleet_loop(ctx: AppContext) -> None:
    """The fleet ledger's flushes, in a task of their own: a flush of a large job takes a
    second, which must not hold up detection's passes (docs/fleet.md); never dies."""
    failures = FailureLog("fleet ledger flush")
    every = min(ctx.settings.fleet.flush_interval_s, 5.0)  # run_due says when one is due
    while True:
        await asyncio.sleep(every)
        if ctx.lease is not None and ctx.lease.lost:
            continue
        try:
            await run_in_threadpool(ctx.fleet.run_due)
            failures.succeeded()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001
            failures.failed(exc)


async def snapshot_jobs(ctx: AppContext, *, every_s: float | None, force: bool = False) -> None:
    """Have the committer write the snapshot of every job that is due (all with ``force``):
    jobs that stopped sending still change as their last frames close. Once, or every
    ``every_s`` seconds."""
    snapshots = ctx.committer.snapshots
    while snapshots is not None:
        for state in ctx.jobs.all():
            if state.persisted and (force or snapshots.due(state)):
                if force:
                    snapshots.force(state.job)
                with contextlib.suppress(Exception):  # logged by the committer; retried later
                    await ctx.committer.committed(state)
        if every_s is None:
            return
        await asyncio.sleep(every_s)


async def keep_lease(lease: Lease) -> None:
    """Renew the database lease every third of its TTL until it is lost."""
    while True:
        await asyncio.sleep(lease.ttl_s / 3)
        try:
            if not await run_in_threadpool(lease.renew):
                return
        except Exception:  # noqa: BLE001 - the database is away: retry, the TTL is the bound
            log.exception("renewing the database lease failed")


async def join_bus(ctx: AppContext) -> Ownership:
    """Connect to NATS and take part in owning partitions (docs/replicas.md)."""
    bus = Bus(ctx.settings.bus)
    await bus.connect()
    ownership = Ownership(
        Owned(bus, ctx.settings.bus, ctx.sessions, ctx.jobs, ctx.detection, ctx.metrics,
              ctx.settings.state)  # fmt: skip
    )
    ctx.jobs.holds = ownership.owns  # only the jobs of owned partitions stay in memory here
    ctx.bus = bus
    ctx.ownership = ownership
    return ownership


def build_context(settings: Settings) -> AppContext:
    engine = make_engine(settings.database_url)
    if settings.migrate_on_start:
        upgrade(engine)
    sessions = make_sessionmaker(engine)
    single = settings.lease_ttl_s > 0 and not settings.bus.url  # with a bus, the bus decides
    lease = Lease(sessions, settings.lease_ttl_s) if single else None
    if lease is not None:
        try:
            lease.acquire()
        except LeaseHeld as exc:
            log.error("failslow cannot start: %s", exc)
            engine.dispose()
            raise
        lease.guard()  # every writing transaction checks it still holds the lease (fencing)
    metrics = Metrics()
    snapshots: LocalSnapshots | None = None  # without a bus: detector state survives restarts

    def load(job: str) -> JobState | None:
        with session_scope(sessions) as session:
            state = snapshots.load(session, job) if snapshots is not None else None
            return state or jobs_db.load_job(session, job=job, settings=settings.state)

    jobs = JobRegistry(
        settings=settings.state, load=load, tenant_of=lambda job: tenant_of(settings.auth, job)
    )
    controls = Controls(sessions, settings.detection)
    detection = DetectionEngine(
        settings=settings.detection,
        sessions=sessions,
        metrics=metrics,
        jobs=jobs,
        cleared_by=lambda session, incident: actions_db.fixes(session, incident=incident),
        tuning_of=controls.tuning,
    )
    stale = StaleCloser(settings=settings.detection, sessions=sessions, jobs=jobs,
                        metrics=metrics, forget=detection.forget)  # fmt: skip
    if not settings.bus.url and settings.state.snapshot_every_s > 0:
        snapshots = LocalSnapshots(
            detection=detection, settings=settings.state, every_s=settings.state.snapshot_every_s
        )

    def muted_of(job: str) -> str:
        st = controls.state(job)
        return st.why if st.muted or st.paused else ""

    mitigation = Mitigation(
        settings=settings.actions,
        sessions=sessions,
        metrics=metrics,
        jobs=jobs,
        detection=detection,
        muted_of=muted_of,
    )
    mitigation.recover()
    hint = mitigation.propose_hint if settings.actions.enabled else None  # drain hints
    probes = ProbeManager(settings=settings.probes, sessions=sessions, metrics=metrics)
    fleet = FleetLedger(settings=settings.fleet, sessions=sessions, jobs=detection.job_names,
                        take=detection.take_tally, watermark=jobs.watermark_of,
                        propose=hint, checked=probes.take_link_checks)  # fmt: skip
    if settings.fleet.enabled:
        metrics.sinks.append(fleet.sink)
        detection.on_forget = fleet.retire
        metrics.add(FleetCollector(sessions, top=settings.fleet.gauges_top,
                                   ttl_s=min(15.0, settings.fleet.flush_interval_s)))  # fmt: skip

    def evicted(job: str) -> None:  # what is held for a job leaves memory with it
        detection.forget(job)
        probes.forget(job)

    jobs.on_evict = evicted
    committer = Committer(
        sessions, settings.ingest.commit_interval_s, lease, snapshots,
        refused=metrics.refused_row, busy_interval_s=settings.ingest.commit_interval_busy_s,
    )  # fmt: skip
    if snapshots is not None:  # a job leaves memory only with its snapshot (stream/registry.py)
        jobs.save = committer.save
    ctx = AppContext(
        settings, engine, sessions, metrics, jobs, detection, mitigation, probes, committer,
        controls, stale, fleet, lease,
    )  # fmt: skip
    metrics.add(
        LiveCollector(jobs=lambda: job_samples(ctx), open_incidents=lambda: open_by_job(ctx))
    )
    return ctx


async def hand_over(ownership: Any, bus: Any, timeout_s: float) -> None:
    """Hand the partitions over with fresh snapshots, then drain the bus connection; each
    within ``timeout_s``, so that an unresponsive NATS server cannot hold a shutdown forever
    (the next owner replays from the stream what was not committed)."""
    for what, step in (("hand-over of the partitions", ownership.close),
                       ("drain of the bus connection", bus.close)):  # fmt: skip
        try:
            await asyncio.wait_for(step(), timeout_s)
        except TimeoutError:
            log.error("shutdown: the %s took over %g s; going on without it", what, timeout_s)
        except Exception:  # noqa: BLE001 - shutting down: say it and go on
            log.exception("shutdown: the %s failed", what)


async def stop_tasks(tasks: list[asyncio.Task[Any]], timeout_s: float) -> None:
    """Cancel the background tasks and wait for them, at most ``timeout_s`` in all: a task that
    does not end (one that swallowed its cancellation) is logged and left, so that it cannot
    hold the shutdown forever (a test's app once hung here for over ten minutes)."""
    for t in tasks:
        t.cancel()
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("shutdown: task %s had failed", t.get_name(), exc_info=t.exception())
    for t in pending:
        log.error("shutdown: task %s did not end within %g s of its cancellation; going on",
                  t.get_name(), timeout_s)  # fmt: skip


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        ctx = await run_in_threadpool(build_context, settings)
        app.state.ctx = ctx
        task = asyncio.create_task(detection_loop(ctx), name="failslow-detection")
        committer = asyncio.create_task(ctx.committer.run(), name="failslow-commit")
        tasks = [task, committer]
        if settings.fleet.enabled:
            tasks.append(asyncio.create_task(fleet_loop(ctx), name="failslow-fleet"))
        if ctx.lease is not None:
            tasks.append(asyncio.create_task(keep_lease(ctx.lease), name="failslow-lease"))
        if ctx.committer.snapshots is not None:
            snap = snapshot_jobs(ctx, every_s=settings.state.snapshot_every_s)
            tasks.append(asyncio.create_task(snap, name="failslow-snapshots"))
        otel = None
        if settings.otel.endpoint:
            from failslow.service.otel import OtelExporter

            otel = OtelExporter(settings.otel, ctx.metrics, version=__version__)
        ownership = await join_bus(ctx) if settings.bus.url else None
        if ownership is not None:
            tasks.append(asyncio.create_task(ownership.run(), name="failslow-ownership"))
        log.info("failslow %s ready (database %s)", __version__, ctx.engine.url.render_as_string())
        try:
            yield
        finally:
            if ctx.committer.snapshots is not None:  # a clean restart resumes exactly
                await snapshot_jobs(ctx, every_s=None, force=True)
            await stop_tasks(tasks, settings.bus.shutdown_timeout_s)
            if otel is not None:
                with contextlib.suppress(Exception):  # logged by the SDK; the stop goes on
                    await run_in_threadpool(otel.close)
            if ownership is not None:
                await hand_over(ownership, ctx.bus, settings.bus.shutdown_timeout_s)
            if ctx.lease is not None and not ctx.lease.lost:
                with contextlib.suppress(Exception):  # it expires anyway
                    await run_in_threadpool(ctx.lease.release)
            ctx.engine.dispose()

    app = FailslowApp(
        title="failslow",
        version=__version__,
        summary="Finds fail-slow GPUs, nodes, links and hangs in distributed training jobs.",
        lifespan=lifespan,
    )
    install_handlers(app)
    app.include_router(ingest_router)
    app.include_router(ingest_v2_router)
    app.include_router(ingest_bundle_router)
    app.include_router(jobs_router)
    app.include_router(incidents_router)
    app.include_router(actions_router)
    app.include_router(control_router)
    app.include_router(qualify_router)  # before fleet_router: its paths match /{kinds}/{part}
    app.include_router(fleet_router)
    app.include_router(plans_router)
    app.include_router(probes_router)
    app.include_router(ui_router)
    app.include_router(ops_router)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, summary=app.summary, routes=app.routes
        )
        # The ingest body is parsed by hand (per-record rejection), so describe it explicitly.
        envelope, parts = envelope_schema("#/components/schemas/{model}")
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        components.update(parts)
        components["Envelope"] = envelope
        topology = TopologyIn.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(topology.pop("$defs", {}))
        components["TopologyIn"] = topology
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
