"""/metrics: names, explicit registries, bounded per-rank series, values that follow the data."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.service.app import create_app
from failslow.service.settings import DetectionSettings, Settings
from tests.helpers import MS, T0, coll, envelope, two_hosts


def scrape(client: TestClient) -> dict[str, list[tuple[dict[str, str], float]]]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(m: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    hits = [v for lab, v in m.get(name, []) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, m.get(name))
    return hits[0]


def test_two_apps_in_one_process_do_not_collide(tmp_path) -> None:  # type: ignore[no-untyped-def]
    a = create_app(Settings(database_url=f"sqlite:///{tmp_path}/a.db"))
    b = create_app(Settings(database_url=f"sqlite:///{tmp_path}/b.db"))
    with TestClient(a) as ca, TestClient(b) as cb:
        h0, _ = two_hosts()
        ca.post("/v1/ingest", json=envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS)]))
        assert value(scrape(ca), "failslow_ingest_records_total", kind="collective") == 1
        assert "failslow_ingest_records_total" not in scrape(cb)


def test_every_metric_is_prefixed(client: TestClient) -> None:
    assert all(name.startswith("failslow_") for name in scrape(client))


def test_ingest_counters(client: TestClient) -> None:
    h0, _ = two_hosts()
    env = envelope(**h0, collectives=[coll(0, 0, T0, T0 + MS), coll(0, 1, T0 + MS, T0)])
    client.post("/v1/ingest", json=env)
    client.post("/v1/ingest", json=env)
    client.post("/v1/ingest", content=b"nope", headers={"Content-Type": "application/json"})
    m = scrape(client)
    assert value(m, "failslow_ingest_records_total", kind="collective") == 1
    assert value(m, "failslow_ingest_duplicate_records_total") == 1
    assert value(m, "failslow_ingest_rejected_records_total", reason="end_before_start") == 2
    assert value(m, "failslow_ingest_requests_total", code="200") == 2
    assert value(m, "failslow_ingest_requests_total", code="400") == 1


def test_detection_metrics_and_bounded_rank_series(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/m.db", detection=DetectionSettings(top_k=3)
    )
    sc = Scenario(
        job="m",
        layout=Layout(tp=2, pp=2, dp=4, gpus_per_host=4),
        steps=80,
        faults=(Fault("slow_gpu", 40, factor=1.5, ranks=(9,)),),
        seed=2,
    )
    with TestClient(create_app(settings)) as client:
        for env in sc.envelopes():
            client.post("/v1/ingest", json=env)
        client.post("/v1/jobs/m/flush")
        m = scrape(client)
    assert value(m, "failslow_incidents_open", kind="slow_gpu") == 1
    assert value(m, "failslow_incidents_open", kind="hang") == 0
    assert value(m, "failslow_incidents_opened_total", kind="slow_gpu") == 1
    assert value(m, "failslow_detection_delay_seconds_count", kind="slow_gpu") == 1
    assert 0 < value(m, "failslow_detection_delay_seconds_sum", kind="slow_gpu") < 3
    assert value(m, "failslow_job_slowdown_ratio", training_job="m") > 1.2
    assert value(m, "failslow_job_state", training_job="m", state="degraded") == 1
    ranks = {lab["rank"] for lab, _ in m["failslow_rank_score_ratio"]}
    assert "9" in ranks and len(ranks) <= 3 + 1  # top-K plus incident ranks, never all 16
    assert value(m, "failslow_rank_score_ratio", training_job="m", rank="9") < 0.75
    assert value(m, "failslow_detection_frames_total") == 80
    assert value(m, "failslow_scrape_collector_success") == 1


def test_rank_series_join_dcgm_and_the_top_k_holds_still(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A healthy 64-rank job scraped 50 times: the exported ranks do not take turns (a healthy
    job's ranks all score ~1.0; they used to churn through 11 distinct ranks), and each series
    names its host and GPU index as DCGM exporter's series do."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path}/k.db", detection=DetectionSettings(top_k=5)
    )
    sc = Scenario(job="k", layout=Layout(tp=4, pp=2, dp=8, gpus_per_host=8), steps=120, seed=4)
    envs = list(sc.envelopes())
    seen: set[str] = set()
    with TestClient(create_app(settings)) as client:
        for i, env in enumerate(envs):
            client.post("/v1/ingest", json=env)
            if i >= len(envs) // 3 and i % max(1, len(envs) // 60) == 0:
                client.post("/v1/jobs/k/flush")
                m = scrape(client)
                labels = [lab for lab, _ in m.get("failslow_rank_score_ratio", [])]
                seen |= {lab["rank"] for lab in labels}
                for lab in labels:
                    assert lab["host"].startswith("node-") and lab["gpu"].isdigit()
    assert 5 <= len(seen) <= 7, sorted(seen)
