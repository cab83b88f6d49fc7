"""Prometheus metrics on an explicit registry (one per app; never the global one).

Event metrics (counters, histograms) are updated where things happen; live state (jobs, ranks,
open incidents) is read at scrape time by :class:`LiveCollector`, so it is never stale and costs
nothing between scrapes. Per-rank series are bounded: only ranks in an open incident or in the
top-K slowest of their job carry a ``rank`` label.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from failslow.service.stream.reading import JobStateName

log = logging.getLogger(__name__)

DELAY_BUCKETS = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600)


class Event(StrEnum):
    """What is told to event sinks (OpenTelemetry logs: service/otel.py) as it happens."""

    INCIDENT_OPENED = "failslow.incident.opened"
    INCIDENT_RESOLVED = "failslow.incident.resolved"
    ACTION = "failslow.action"  # an action changed state


EventSink = Callable[[Event, dict[str, Any]], None]

# The label of the training job. Not ``job``: that is Prometheus' own target label, which a scrape
# without honor_labels (kube-prometheus' default) would rename to exported_job.
JOB = "training_job"


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._request_codes: dict[int, Any] = {}
        self.top_slots: dict[str, set[int]] = {}  # per job: the top-K ranks exported (live.py)
        self.sinks: list[EventSink] = []  # where events go besides the log (service/otel.py)
        self._encodings: dict[str, Any] = {}
        self._kinds: dict[str, Any] = {}
        self.records = Counter(
            "failslow_ingest_records_total", "Telemetry records accepted.", ["kind"], registry=r
        )
        self.rejected = Counter(
            "failslow_ingest_rejected_records_total",
            "Records rejected inside valid envelopes, by reason.",
            ["reason"],
            registry=r,
        )
        self.duplicates = Counter(
            "failslow_ingest_duplicate_records_total", "Re-sent records ignored.", registry=r
        )
        self.refused_rows = Counter(
            "failslow_storage_refused_rows_total",
            "Rows of ingest accounting the database refused for good (dropped and logged, so "
            "that the job's later envelopes are stored), by what the row held.",
            ["row"],
            registry=r,
        )
        self.requests = Counter(
            "failslow_ingest_requests_total",
            "Ingest requests by HTTP status.",
            ["code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "failslow_ingest_request_duration_seconds", "Ingest request handling time.", registry=r
        )
        self.bytes = Counter(
            "failslow_ingest_received_bytes_total",
            "Ingest body bytes as received, by content encoding.",
            ["encoding"],
            registry=r,
        )
        self.detection_seconds = Histogram(
            "failslow_detection_duration_seconds",
            "Time of one detection pass over one job.",
            registry=r,
        )
        self.detection_runs = Counter(
            "failslow_detection_runs_total", "Detection passes by outcome.", ["outcome"], registry=r
        )
        self.frames = Counter(
            "failslow_detection_frames_total", "Frames (steps) analysed.", registry=r
        )
        self.frames_skipped = Counter(
            "failslow_frames_skipped_total",
            "Frames never analysed: past detection.max_backlog_rank_frames of one job.", registry=r,
        )  # fmt: skip
        self.frames_paused = Counter(
            "failslow_frames_paused_total",
            "Frames consumed but not analysed: their job's detection was paused by an operator "
            "or a maintenance window.", registry=r,
        )  # fmt: skip
        self.incidents_closed_stale = Counter(
            "failslow_incidents_closed_stale_total",
            "Incidents closed because their job stopped reporting.", ["kind"], registry=r,
        )  # fmt: skip
        self.delay = Histogram(
            "failslow_detection_delay_seconds",
            "Event-time delay from onset to detection of opened incidents.",
            ["kind"],
            buckets=DELAY_BUCKETS,
            registry=r,
        )
        self.opened = Counter(
            "failslow_incidents_opened_total", "Incidents opened.", ["kind"], registry=r
        )
        self.resolved = Counter(
            "failslow_incidents_resolved_total", "Incidents resolved.", ["kind"], registry=r
        )

        self.bus_failed = Counter(
            "failslow_bus_failed_total",
            "Envelopes of a partition this replica owns that failed to apply (logged).",
            registry=r,
        )
        self.bus_expired = Counter(
            "failslow_bus_expired_total",
            "Stream sequences an owner resuming a partition needed but the stream had already "
            "dropped (max_age_s): an upper bound of the envelopes lost, every partition's "
            "messages in that range counted.",
            registry=r,
        )
        self.bus_partitions = Gauge(
            "failslow_bus_partitions_owned", "Partitions of the stream this replica owns.",
            registry=r,
        )  # fmt: skip

        self.actions = Counter(
            "failslow_actions_total",
            "Action state changes, by action kind and the state reached.",
            ["kind", "state"],
            registry=r,
        )
        self.actuator_seconds = Histogram(
            "failslow_actuator_duration_seconds",
            "Time of one actuator call.",
            ["actuator"],
            registry=r,
        )
        self.plans = Counter(
            "failslow_plans_published_total", "Plan versions published.", registry=r
        )
        self.probes = Counter(
            "failslow_probes_total",
            "Active link probe tasks finished, by outcome (done, failed).",
            ["outcome"],
            registry=r,
        )

    # ingest counts once per envelope: the labelled children are looked up once, not per call
    def request_done(self, code: int, seconds: float) -> None:
        """Count an ingest request by its status and time it."""
        child = self._request_codes.get(code)
        if child is None:
            child = self._request_codes[code] = self.requests.labels(str(code))
        child.inc()
        self.request_seconds.observe(seconds)

    def received(self, encoding: str, size: int) -> None:
        """Count ingest body bytes as received (``identity`` or ``gzip``)."""
        child = self._encodings.get(encoding)
        if child is None:
            child = self._encodings[encoding] = self.bytes.labels(encoding)
        child.inc(size)

    def record_count(self, kind: str, count: int) -> None:
        """Count accepted records of one kind."""
        child = self._kinds.get(kind)
        if child is None:
            child = self._kinds[kind] = self.records.labels(kind)
        child.inc(count)

    def refused_row(self, row: str) -> None:
        """Count a row of ingest accounting the database refused for good (``salvage.Row``)."""
        self.refused_rows.labels(str(row)).inc()

    def action(self, kind: str, state: str, **attrs: Any) -> None:
        """An action reached ``state``: counted (failslow_actions_total) and told to the sinks."""
        self.actions.labels(kind, state).inc()
        if self.sinks:
            self.emit(Event.ACTION, {"kind": kind, "state": state, **attrs})

    def emit(self, event: Event, attrs: dict[str, Any]) -> None:
        """Tell every sink; a failing sink is logged, never raised into the caller."""
        for sink in self.sinks:
            try:
                sink(event, attrs)
            except Exception:  # noqa: BLE001 - telemetry of telemetry must not break detection
                log.exception("event sink failed for %s", event)

    def add(self, collector: Collector) -> None:
        self.registry.register(collector)


@dataclass(frozen=True, slots=True)
class JobSample:
    job: str
    state: str
    step_time_s: float | None
    baseline_step_time_s: float | None
    slowdown: float | None
    ranks: int
    hosts: int
    stale_hosts: int
    clock_ahead_hosts: int  # hosts whose sent_ns runs ahead of the job's (held back)
    clock_held_back: int  # envelopes whose time was held back, since the job came into memory
    inflight: int
    pending: int
    watermark_s: float
    # rank, host, gpu (its index on the host, as DCGM exporter's `gpu` label; "" unknown), score,
    # lateness
    rank_series: list[tuple[int, str, str, float | None, float | None]]
    muted: bool = False  # by an operator or a maintenance window: nothing acted on or notified
    paused: bool = False  # detection paused (by hand or by a maintenance window)


class LiveCollector(Collector):
    """Reads live state at scrape time through the two callables it is given."""

    def __init__(
        self,
        *,
        jobs: Callable[[], Iterable[JobSample]],
        open_incidents: Callable[[], dict[tuple[str, str], int]],
    ) -> None:
        self._jobs = jobs
        self._open = open_incidents

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # dynamic: nothing to pre-register

    def collect(self) -> Iterator[GaugeMetricFamily]:
        started = time.perf_counter()
        ok = 1.0
        step = GaugeMetricFamily(
            "failslow_job_step_time_seconds", "Recent job step time.", labels=[JOB]
        )
        base = GaugeMetricFamily(
            "failslow_job_baseline_step_time_seconds",
            "Healthy step time before any incident.",
            labels=[JOB],
        )
        slow = GaugeMetricFamily(
            "failslow_job_slowdown_ratio", "Step time now / baseline.", labels=[JOB]
        )
        state = GaugeMetricFamily(
            "failslow_job_state", "1 for the job's current state.", labels=[JOB, "state"]
        )
        ranks = GaugeMetricFamily("failslow_job_ranks", "Ranks known.", labels=[JOB])
        hosts = GaugeMetricFamily("failslow_job_hosts", "Hosts known.", labels=[JOB])
        stale = GaugeMetricFamily(
            "failslow_job_stale_hosts", "Hosts without recent envelopes.", labels=[JOB]
        )
        muted = GaugeMetricFamily(
            "failslow_job_muted",
            "1 while the job is muted (by hand or a maintenance window): detected, neither "
            "acted on nor notified.",
            labels=[JOB],
        )
        paused = GaugeMetricFamily(
            "failslow_job_detection_paused",
            "1 while the job's detection is paused (by hand or a maintenance window).",
            labels=[JOB],
        )
        ahead = GaugeMetricFamily(
            "failslow_job_clock_ahead_hosts",
            "Hosts whose clock runs ahead of the job's other hosts (their time is held back).",
            labels=[JOB],
        )
        held = CounterMetricFamily(
            "failslow_job_clock_held_back_envelopes",
            "Envelopes whose sent_ns ran ahead of the job's hosts and did not move its time.",
            labels=[JOB],
        )
        inflight = GaugeMetricFamily(
            "failslow_job_inflight_collectives",
            "Collectives with a member still inside.",
            labels=[JOB],
        )
        pending = GaugeMetricFamily(
            "failslow_job_pending_collectives", "Collectives being assembled.", labels=[JOB]
        )
        wm = GaugeMetricFamily(
            "failslow_job_watermark_seconds", "Event-time watermark.", labels=[JOB]
        )
        score = GaugeMetricFamily(
            "failslow_rank_score_ratio",
            "Rank speed relative to peers (1 = typical); incident ranks and top-K slowest only.",
            labels=[JOB, "rank", "host", "gpu"],
        )
        lateness = GaugeMetricFamily(
            "failslow_rank_lateness_seconds",
            "Time peers waited for the rank per step; incident ranks and top-K slowest only.",
            labels=[JOB, "rank", "host", "gpu"],
        )
        jobs_by_state: dict[str, int] = dict.fromkeys(JobStateName, 0)
        open_by_job: dict[tuple[str, str], int] = {}
        try:
            for s in self._jobs():
                if s.step_time_s is not None:
                    step.add_metric([s.job], s.step_time_s)
                if s.baseline_step_time_s is not None:
                    base.add_metric([s.job], s.baseline_step_time_s)
                if s.slowdown is not None:
                    slow.add_metric([s.job], s.slowdown)
                for name in jobs_by_state:
                    state.add_metric([s.job, name], 1.0 if s.state == name else 0.0)
                jobs_by_state[s.state] = jobs_by_state.get(s.state, 0) + 1
                ranks.add_metric([s.job], s.ranks)
                hosts.add_metric([s.job], s.hosts)
                stale.add_metric([s.job], s.stale_hosts)
                muted.add_metric([s.job], float(s.muted))
                paused.add_metric([s.job], float(s.paused))
                ahead.add_metric([s.job], s.clock_ahead_hosts)
                held.add_metric([s.job], s.clock_held_back)
                inflight.add_metric([s.job], s.inflight)
                pending.add_metric([s.job], s.pending)
                wm.add_metric([s.job], s.watermark_s)
                for rank, host, gpu, sc, lt in s.rank_series:
                    if sc is not None:
                        score.add_metric([s.job, str(rank), host, gpu], sc)
                    if lt is not None:
                        lateness.add_metric([s.job, str(rank), host, gpu], lt)
            open_by_job.update(self._open())
        except Exception:  # noqa: BLE001 - a scrape must not fail because of one job
            log.exception("live metrics collection failed")
            ok = 0.0
        jobs = GaugeMetricFamily("failslow_jobs", "Jobs in memory by state.", labels=["state"])
        for name, count in jobs_by_state.items():
            jobs.add_metric([name], count)
        incidents = GaugeMetricFamily(
            "failslow_incidents_open",
            "Open incidents by job and kind, of the jobs this replica owns (with replicas, each "
            "job's from one of them: sum them for the fleet).",
            labels=[JOB, "kind"],
        )
        for (job, kind), count in sorted(open_by_job.items()):
            incidents.add_metric([job, kind], count)
        yield from (
            step,
            base,
            slow,
            state,
            ranks,
            hosts,
            stale,
            muted,
            paused,
            ahead,
            held,
            inflight,
            pending,
            wm,
            score,
            lateness,
        )
        yield jobs
        yield incidents
        dur = GaugeMetricFamily(
            "failslow_scrape_collector_duration_seconds", "Time to collect live metrics."
        )
        dur.add_metric([], time.perf_counter() - started)
        yield dur
        success = GaugeMetricFamily(
            "failslow_scrape_collector_success", "1 if live collection worked."
        )
        success.add_metric([], ok)
        yield success
