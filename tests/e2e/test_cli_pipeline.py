"""Real processes: `failslow serve`, `failslow simulate`, `failslow replay`; and an independent
v1 client (plain HTTP, its own job model) that shares no code with failslow."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.procs import CLI, env_for, service
from tests.live import free_port

pytestmark = pytest.mark.e2e


def test_simulate_replay_detects_the_injected_gpu(tmp_path: Path) -> None:
    out = tmp_path / "job.jsonl"
    sim = subprocess.run(
        CLI
        + [
            "simulate",
            "--job",
            "cli-job",
            "--tp",
            "2",
            "--pp",
            "2",
            "--dp",
            "4",
            "--gpus-per-host",
            "4",
            "--steps",
            "100",
            "--seed",
            "5",
            "--fault",
            "slow_gpu:rank=11,start=45,factor=1.4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sim.returncode == 0, sim.stderr
    labels = json.loads((tmp_path / "job.jsonl.labels.json").read_text())
    records = sum(
        len(e["collectives"]) + len(e["steps"])
        for e in map(json.loads, out.read_text().splitlines())
    )
    port = free_port()
    with service(port, tmp_path / "db.sqlite", tmp_path / "service.log") as url:
        rep = subprocess.run(
            CLI + ["replay", str(out), "--service", url, "--quiet"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env_for(tmp_path / "unused.db"),
        )
        assert rep.returncode == 0, rep.stderr
        summary = json.loads(rep.stdout)
        assert (
            summary["accepted"] == records
            and summary["rejected"] == 0
            and summary["duplicates"] == 0
        )
        incidents = httpx.get(f"{url}/v1/jobs/cli-job/incidents").json()
    assert [(i["kind"], i["ranks"]) for i in incidents] == [("slow_gpu", [11])]
    onset = labels["faults"][0]["onset_ns"]
    assert onset < incidents[0]["detected_ns"] < onset + 5e9
    assert incidents[0]["onset_step"] == 45


# -- an independent client ------------------------------------------------------------------------
# A pure data-parallel job of 8 ranks on 2 hosts, written from the spec alone: per step each rank
# computes, then one allreduce that ends when the last rank arrives plus a transfer time. Clocks of
# the two hosts differ by 3 ms.

T0 = 1_800_000_000_000_000_000


def independent_job(
    job: str, slow_rank: int | None, onset_step: int, steps: int, seed: int
) -> tuple[list[dict[str, Any]], int | None]:
    rng = random.Random(seed)
    hosts = {0: "alpha", 1: "beta"}
    offset = {0: 0, 1: 3_000_000}
    speed = [rng.uniform(0.99, 1.01) for _ in range(8)]
    comm = {"comm": "world", "kind": "dp", "ranks": list(range(8))}
    t = 0.0
    onset_ns = None
    per_host: dict[int, dict[str, list[dict[str, Any]]]] = {
        0: {"c": [], "s": []},
        1: {"c": [], "s": []},
    }
    envelopes: list[dict[str, Any]] = []
    for step in range(steps):
        if step == onset_step and slow_rank is not None:
            onset_ns = T0 + int(t * 1e9)
        arrive = []
        for r in range(8):
            compute = 0.200 * speed[r] * rng.lognormvariate(0, 0.03)
            if slow_rank == r and step >= onset_step:
                compute *= 1.5
            arrive.append(t + compute)
        end = max(arrive) + 0.015 * rng.lognormvariate(0, 0.05)
        for r in range(8):
            h = r // 4
            ns = lambda x, h=h: T0 + int(x * 1e9) + offset[h]  # noqa: E731
            per_host[h]["c"].append(
                {
                    "rank": r,
                    "comm": "world",
                    "seq": step,
                    "op": "all_reduce",
                    "bytes": 1 << 26,
                    "start_ns": ns(arrive[r]),
                    "end_ns": ns(end),
                }
            )
            per_host[h]["s"].append({"rank": r, "step": step, "start_ns": ns(t), "end_ns": ns(end)})
        t = end
        if step % 4 == 3 or step == steps - 1:  # each host sends every 4 steps
            for h in (1, 0):  # out of order on purpose
                envelopes.append(
                    {
                        "job": job,
                        "host": hosts[h],
                        "sent_ns": T0 + int(t * 1e9) + offset[h],
                        "ranks": [
                            {"rank": r, "gpu": r % 4, "world_size": 8}
                            for r in range(4 * h, 4 * h + 4)
                        ],
                        "comms": [comm],
                        "collectives": list(reversed(per_host[h]["c"])),
                        "steps": per_host[h]["s"],
                    }
                )
                per_host[h] = {"c": [], "s": []}
    return envelopes, onset_ns


@pytest.mark.parametrize("slow_rank", [None, 6], ids=["healthy", "slow-rank-6"])
def test_independent_v1_client(tmp_path: Path, slow_rank: int | None) -> None:
    job = f"indep-{slow_rank}"
    envelopes, onset_ns = independent_job(job, slow_rank, onset_step=60, steps=150, seed=11)
    port = free_port()
    with (
        service(port, tmp_path / "db.sqlite", tmp_path / "service.log") as url,
        httpx.Client() as http,
    ):
        for env in envelopes:
            r = http.post(f"{url}/v1/ingest", json=env)
            assert r.status_code == 200 and r.json()["rejected"] == []
        assert http.post(f"{url}/v1/jobs/{job}/flush").status_code == 200
        incidents = http.get(f"{url}/v1/jobs/{job}/incidents").json()
        ranks = http.get(f"{url}/v1/jobs/{job}/ranks").json()
    if slow_rank is None:
        assert incidents == []
        assert {r["state"] for r in ranks} == {"ok"} or {r["state"] for r in ranks} == {"stale"}
        return
    assert [(i["kind"], i["ranks"], i["hosts"]) for i in incidents] == [("slow_gpu", [6], ["beta"])]
    assert onset_ns is not None and incidents[0]["detected_ns"] > onset_ns
    assert incidents[0]["onset_step"] == 60
    assert incidents[0]["subject_slowdown"] == pytest.approx(1.5, rel=0.05)
