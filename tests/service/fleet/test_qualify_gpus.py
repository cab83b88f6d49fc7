"""Qualification of GPU nodes: each GPU is judged against its own model's norm, a host is no-go
for one slow GPU (named), and the norm is kept per model (docs/fleet.md)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.fleet.models import QualNorm
from failslow.service.fleet.qualifications import Qualifier
from failslow.service.fleet.qualify import TaskKind

pytestmark = pytest.mark.both_databases  # the norm's model column: SQLite and PostgreSQL

H100, A100 = "cuda: NVIDIA H100 80GB HBM3", "cuda: NVIDIA A100-SXM4-80GB"


def gpus(host: str, model: str, secs: list[float]) -> dict[str, Any]:
    per = [{"index": i, "uuid": f"GPU-{host}-{i}", "device": model, "seconds": s}
           for i, s in enumerate(secs)]  # fmt: skip
    return {"seconds": max(secs), "device": model, "gpus": per}


def run(q: Qualifier, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    hosts = list(results)
    run_id = q.start(hosts, timeout_s=30, nbytes=1 << 20, iterations=5, standing={})
    given = [(h, t) for i, h in enumerate(hosts) for t in q.poll(h, f"10.0.0.{i}:7000")]
    given += [(h, t) for h in hosts for t in q.poll(h, None)]
    for h, t in given:
        body = results[h] if t["kind"] == TaskKind.COMPUTE else {"bps": 900e6}
        assert q.report(run_id, t["id"], body)
    view = q.view(run_id)
    assert view is not None and view["state"] == "done"
    return view


def test_one_slow_gpu_makes_its_host_no_go_and_is_named(sessions: sessionmaker[Session]) -> None:
    q = Qualifier(sessions)
    view = run(q, {"g0": gpus("g0", H100, [0.040] * 8),
                   "g1": gpus("g1", H100, [0.041] * 3 + [0.056] + [0.040] * 4),
                   "g2": gpus("g2", H100, [0.039] * 8)})  # fmt: skip
    assert view["no_go"] == ["g1"] and view["go"] == ["g0", "g2"]
    g1 = next(h for h in view["hosts"] if h["host"] == "g1")
    assert g1["reasons"] == [f"GPU 3 (GPU-g1-3) compute 0.056 s against the fleet norm ({H100}) "
                             "0.040 s (1.40x)"]  # fmt: skip
    assert g1["compute_s"] == 0.056 and len(g1["gpus"]) == 8
    with sessions() as s:  # the passing hosts' GPUs, one norm entry each, under their model
        rows = list(s.execute(select(QualNorm.kind, QualNorm.model)))
    assert rows.count((TaskKind.COMPUTE, H100)) == 16 and (TaskKind.LINK, "") in rows


def test_each_model_is_judged_against_its_own_norm(sessions: sessionmaker[Session]) -> None:
    q = Qualifier(sessions)
    run(q, {f"h{i}": gpus(f"h{i}", H100, [0.040] * 8) for i in range(4)})
    # an A100 host alone, 2x the H100s' time: not slow for an A100 (no A100 norm yet: its own)
    alone = run(q, {"a0": gpus("a0", A100, [0.080] * 8)})
    assert alone["go"] == ["a0"]
    # a mixed run: an H100 host with every GPU at 0.06 s is slow against the H100 norm kept
    # from the first run, though the A100s beside it take 0.08 s
    mixed = run(q, {"a1": gpus("a1", A100, [0.081] * 8), "h9": gpus("h9", H100, [0.060] * 8)})
    assert mixed["go"] == ["a1"] and mixed["no_go"] == ["h9"]
    h9 = next(h for h in mixed["hosts"] if h["host"] == "h9")["reasons"]
    assert len(h9) == 8 and all(f"against the fleet norm ({H100}) 0.040 s" in r for r in h9)


def test_a_cpu_node_and_an_agent_that_names_no_device(sessions: sessionmaker[Session]) -> None:
    q = Qualifier(sessions)
    cpu = "cpu: AMD EPYC 9654 96-Core Processor"
    view = run(q, {"c0": {"seconds": 0.20, "device": cpu}, "c1": {"seconds": 0.31, "device": cpu},
                   "c2": {"seconds": 0.21, "device": cpu}, "old": {"seconds": 0.9}})  # fmt: skip
    assert view["no_go"] == ["c1"] and "old" in view["go"]  # (an unnamed device: its own norm)
    c1 = next(h for h in view["hosts"] if h["host"] == "c1")["reasons"]
    assert c1 == [f"compute 0.310 s against the fleet norm ({cpu}) 0.210 s (1.48x)"]
