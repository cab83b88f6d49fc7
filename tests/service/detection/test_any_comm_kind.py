"""Any communicator kind (issue 16): groups the detectors do not model -- Megatron's embedding
group joining the first and last pipeline stage (kind ``other``) and MoE expert-parallel groups
(``ep``) -- never veto a straggler that is late in its own tensor/data-parallel groups, and add
no false incident to a healthy job."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.service.app import create_app
from failslow.service.settings import Settings

# 16 ranks on 4 hosts: tp 2 x dp 4 x pp 2, an embedding group per (dp, tp) pair of the two
# stages, expert-parallel groups of 2 inside each data-parallel group
MEGATRON = Layout(tp=2, pp=2, dp=4, gpus_per_host=4, embedding=True, ep=2)


def incidents(tmp_path: Path, faults: tuple[Fault, ...], seed: int) -> list[dict]:  # type: ignore[type-arg]
    sc = Scenario(job="moe", layout=MEGATRON, steps=110, faults=faults, seed=seed)
    kinds = {c.kind for c in MEGATRON.comms}
    assert {"other", "ep", "tp", "dp", "pp"} <= kinds
    with TestClient(create_app(Settings(database_url=f"sqlite:///{tmp_path}/f.db"))) as client:
        for env in sc.envelopes(sc.simulation()):
            assert client.post("/v1/ingest", json=env).status_code == 200
        client.post("/v1/jobs/moe/flush")
        return client.get("/v1/jobs/moe/incidents").json()  # type: ignore[no-any-return]


@pytest.mark.parametrize("rank", [2, 9])  # first stage (tp 0, dp 1); last stage (tp 1, dp 0)
def test_a_straggler_in_embedding_and_expert_groups_is_found(tmp_path: Path, rank: int) -> None:
    assert MEGATRON.embedding_comm(rank) and MEGATRON.ep_comm(rank)
    found = incidents(tmp_path, (Fault("slow_gpu", 40, None, factor=1.5, ranks=(rank,)),), 5)
    assert [(i["kind"], i["ranks"]) for i in found] == [("slow_gpu", [rank])], found
    assert found[0]["onset_step"] in range(39, 42) and found[0]["detected_step"] <= 46


def test_a_healthy_job_with_those_groups_opens_nothing(tmp_path: Path) -> None:
    assert incidents(tmp_path, (), 6) == []
