"""OpenTelemetry out: a service fed a simulated slow GPU sends its metrics (the names and labels
of /metrics) and the events of the incident and its actions over OTLP/HTTP. No OpenTelemetry
Collector binary comes from PyPI or Debian here, so the receiver is a minimal OTLP/HTTP endpoint
that decodes the requests with the OTLP protobuf definitions (opentelemetry-proto), as a
collector's otlp receiver would."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from failslow.harness.simulator import Layout, Scenario
from failslow.harness.simulator.scenario import parse_fault
from failslow.service.app import create_app
from failslow.service.otel import OtelSettings
from failslow.service.settings import Settings

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (  # noqa: E402
    ExportLogsServiceRequest,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
)


class Receiver:
    """POST /v1/metrics and /v1/logs, protobuf bodies (gzip or not), kept decoded."""

    def __init__(self) -> None:
        self.metrics: list[Any] = []
        self.logs: list[Any] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                assert self.headers["Content-Type"] == "application/x-protobuf"
                if self.path == "/v1/metrics":
                    receiver.metrics.append(ExportMetricsServiceRequest.FromString(body))
                elif self.path == "/v1/logs":
                    receiver.logs.append(ExportLogsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def points(self, name: str) -> list[tuple[dict[str, str], float]]:
        out = []
        for req in self.metrics:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != name:
                            continue
                        data = m.gauge if m.HasField("gauge") else m.sum
                        for p in data.data_points:
                            labels = {a.key: a.value.string_value for a in p.attributes}
                            value = p.as_double if p.HasField("as_double") else p.as_int
                            out.append((labels, value))
        return out

    def events(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = []
        for req in self.logs:
            for rl in req.resource_logs:
                assert {a.key: a.value.string_value for a in rl.resource.attributes}[
                    "service.name"] == "failslow"  # fmt: skip
                for sl in rl.scope_logs:
                    for r in sl.log_records:
                        attrs = {a.key: a.value for a in r.attributes}
                        out.append((r.event_name, r.body.string_value, attrs))
        return out


def test_metrics_and_events_reach_an_otlp_receiver(tmp_path: Path) -> None:
    rx = Receiver()
    settings = Settings(database_url=f"sqlite:///{tmp_path}/o.db",
                        otel=OtelSettings(endpoint=rx.url, interval_s=0.5))  # fmt: skip
    sc = Scenario(job="otel-job", layout=Layout(tp=2, pp=2, dp=4, gpus_per_host=4), steps=120,
                  faults=(parse_fault("slow_gpu:rank=5,start=50,factor=2.0"),), seed=3)  # fmt: skip
    with TestClient(create_app(settings)) as client:
        for env in sc.envelopes(sc.simulation()):
            assert client.post("/v1/ingest", json=env).status_code == 200
        client.post("/v1/jobs/otel-job/evaluate")  # detection, then the policy: a notify
        client.post("/v1/jobs/otel-job/evaluate")
    # the service stopped: its exporter flushed a last reading and every event
    open_now = [v for labels, v in rx.points("failslow_incidents_open")
                if labels == {"training_job": "otel-job", "kind": "slow_gpu"}]  # fmt: skip
    assert open_now and open_now[-1] == 1
    slow = rx.points("failslow_job_slowdown_ratio")
    assert slow and slow[-1][0] == {"training_job": "otel-job"} and slow[-1][1] > 1.2
    assert rx.points("failslow_ingest_records_total")  # counters, as cumulative sums
    events = rx.events()
    opened = [e for e in events if e[0] == "failslow.incident.opened"]
    assert len(opened) == 1
    name, body, attrs = opened[0]
    assert "rank 5" in body and attrs["kind"].string_value == "slow_gpu"
    assert attrs["training_job"].string_value == "otel-job"
    assert [v.int_value for v in attrs["ranks"].array_value.values] == [5]
    acted = [(a["kind"].string_value, a["state"].string_value) for n, _, a in events
             if n == "failslow.action"]  # fmt: skip
    assert ("notify", "succeeded") in acted
