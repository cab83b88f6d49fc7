"""OpenTelemetry out (``FAILSLOW_OTEL__ENDPOINT``): the metrics of ``/metrics`` and the events
of incidents and actions, over OTLP/HTTP to a collector — for clusters whose observability
already runs through one.

Metrics keep ``/metrics``' names and labels (``failslow_job_slowdown_ratio`` with
``training_job``, ...): each is an observable instrument read from the same registry at every
export (gauges as gauges, counters as cumulative sums, a histogram's ``_count`` and ``_sum`` as
sums). Events are OTLP log records with an ``event_name`` (``failslow.incident.opened``,
``failslow.incident.resolved``, ``failslow.action``), the summary as body and the incident's or
action's fields as attributes. Needs the ``otel`` extra (``pip install 'failslow[otel]'``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from pydantic import BaseModel, Field

from failslow.service.metrics import Event, Metrics

log = logging.getLogger(__name__)


class OtelSettings(BaseModel):
    endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP base URL of a collector (http://otel-collector:4318): metrics go "
        "to <endpoint>/v1/metrics, events to <endpoint>/v1/logs. Unset: nothing is sent.",
    )
    interval_s: float = Field(default=15.0, gt=0, description="Seconds between metric exports.")
    headers: dict[str, str] = Field(
        default_factory=dict, description="Extra HTTP headers (JSON), e.g. an authorization."
    )
    service_name: str = Field(default="failslow", description="The resource's service.name.")


class _Snapshot:
    """The registry read at most once per export, shared by every instrument's callback."""

    def __init__(self, metrics: Metrics, max_age_s: float = 1.0) -> None:
        self.metrics, self.max_age_s = metrics, max_age_s
        self._at, self._samples = -1.0, {}  # type: ignore[var-annotated]
        self._lock = threading.Lock()

    def samples(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        with self._lock:
            if time.monotonic() - self._at > self.max_age_s:
                out: dict[str, list[tuple[dict[str, str], float]]] = {}
                for fam in self.metrics.registry.collect():
                    for s in fam.samples:
                        out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
                self._samples, self._at = out, time.monotonic()
            return self._samples


def _instruments(metrics: Metrics) -> list[tuple[str, str, str]]:
    """(sample name, instrument kind, description) of what /metrics exposes."""
    out = []
    for fam in metrics.registry.collect():
        if fam.type == "gauge":
            out.append((fam.name, "gauge", fam.documentation))
        elif fam.type == "counter":
            out.append((fam.name + "_total", "sum", fam.documentation))
        elif fam.type == "histogram":
            out += [(fam.name + "_count", "sum", fam.documentation + " (count)"),
                    (fam.name + "_sum", "sum", fam.documentation + " (sum)")]  # fmt: skip
    return out


class OtelExporter:
    def __init__(self, settings: OtelSettings, metrics: Metrics, *, version: str) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            from opentelemetry.metrics import CallbackOptions, Observation
            from opentelemetry.sdk._logs import LoggerProvider
            from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
            from opentelemetry.sdk.metrics import MeterProvider
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
            from opentelemetry.sdk.resources import Resource
        except ImportError as exc:
            raise ValueError(
                "FAILSLOW_OTEL__ENDPOINT needs the otel extra: pip install 'failslow[otel]'"
            ) from exc
        assert settings.endpoint
        base = settings.endpoint.rstrip("/")
        resource = Resource.create({"service.name": settings.service_name,
                                    "service.version": version})  # fmt: skip
        self.reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics", headers=settings.headers),
            export_interval_millis=settings.interval_s * 1000,
        )
        self.meters = MeterProvider(resource=resource, metric_readers=[self.reader])
        meter = self.meters.get_meter("failslow", version)
        snapshot = _Snapshot(metrics)

        def observe(name: str) -> Any:
            def callback(_options: CallbackOptions) -> list[Any]:
                return [Observation(v, labels) for labels, v in snapshot.samples().get(name, [])]

            return callback

        for name, kind, doc in _instruments(metrics):
            make = meter.create_observable_gauge if kind == "gauge" else (
                meter.create_observable_counter)  # fmt: skip
            make(name, callbacks=[observe(name)], description=doc)
        self.logs = LoggerProvider(resource=resource)
        self.logs.add_log_record_processor(BatchLogRecordProcessor(
            OTLPLogExporter(endpoint=f"{base}/v1/logs", headers=settings.headers)))  # fmt: skip
        self.logger = self.logs.get_logger("failslow", version)
        self.metrics = metrics
        metrics.sinks.append(self.event)

    def event(self, event: Event, attrs: dict[str, Any]) -> None:
        body = attrs.get("summary") or f"{event.value}: {attrs.get('kind')} {attrs.get('state')}"
        flat = {k: v for k, v in attrs.items() if k != "summary" and v is not None}
        self.logger.emit(event_name=event.value, body=str(body), attributes=flat,
                         timestamp=time.time_ns())  # fmt: skip

    def flush(self) -> None:
        self.reader.collect()  # a last reading, then both pipelines drained
        self.meters.force_flush()
        self.logs.force_flush()

    def close(self) -> None:
        if self.event in self.metrics.sinks:
            self.metrics.sinks.remove(self.event)
        try:
            self.flush()
        finally:
            self.meters.shutdown()
            self.logs.shutdown()
