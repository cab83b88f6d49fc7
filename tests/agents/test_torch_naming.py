"""Process groups get ids and kinds without help: DeviceMesh's dimension names, Megatron's
groups, the default group; ids are short, identical on every member and distinct per group."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch not installed (optional extra failslow[torch])"
)
dist = pytest.importorskip("torch.distributed")

from failslow.agents.torch.naming import (  # noqa: E402
    Naming,
    comm_id,
    kind_of_name,
    members_form,
)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("mesh_dp", "dp"),
        ("mesh_dp_shard", "dp"),
        ("mesh_dp_replicate", "dp"),
        ("mesh_fsdp", "dp"),
        ("mesh_tp", "tp"),
        ("mesh_pp", "pp"),
        ("mesh_cp", "cp"),
        ("mesh_ep", "ep"),
        ("TENSOR_MODEL_PARALLEL_GROUP", "tp"),
        ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
        ("DATA_PARALLEL_GROUP_WITH_CP", "dp"),
        ("CONTEXT_PARALLEL_GROUP", "cp"),
        ("EXPERT_MODEL_PARALLEL_GROUP", "ep"),
        ("EXPERT_TENSOR_PARALLEL_GROUP", "tp"),
        ("mesh_batch", None),
        ("EMBEDDING_GROUP", None),
    ],
)
def test_kinds_from_mesh_dimensions_and_megatron_descriptions(name: str, kind: str | None) -> None:
    assert kind_of_name(name) == kind


def test_ids_are_short_stable_and_valid() -> None:
    import re

    assert comm_id("tp", [4, 5]) == "tp-4-5"
    assert comm_id("dp", list(range(0, 64, 8))) == "dp-0..56s8"
    assert comm_id("dp", list(range(16))) == "dp-0..15"
    odd = comm_id("ep", [0, 3, 4, 9, 11])
    assert odd.startswith("ep-0..11n5-") and odd == comm_id("ep", [0, 3, 4, 9, 11])
    assert odd != comm_id("ep", [0, 3, 5, 9, 11])
    assert comm_id("tp", [4, 5], 1) == "tp-4-5+1"
    big = members_form(list(range(0, 200_000, 3)) + [200_001])
    rule = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}$")  # the API's identifier rule
    for c in (odd, comm_id("dp", list(range(0, 64, 8))), f"other-{big}", comm_id("tp", [1], 3)):
        assert rule.match(c), c


@pytest.fixture
def one_rank() -> Any:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_groups_named_from_their_description_megatron_and_by_hand(one_rank: None) -> None:
    announced: list[tuple[str, str, list[int]]] = []
    naming = Naming(lambda c, k, r: announced.append((c, str(k), r)))
    assert naming.of(dist.group.WORLD).comm == "world"
    tp = dist.new_group([0], group_desc="mesh_tp")
    tp_again = dist.new_group([0], group_desc="mesh_tp")  # the same members twice
    plain = dist.new_group([0])
    assert (naming.of(tp).comm, naming.of(tp).kind) == ("tp-0", "tp")
    assert naming.of(tp_again).comm == "tp-0+1"
    assert (naming.of(plain).comm, naming.of(plain).kind) == ("other-0", "other")
    module = types.ModuleType("megatron.core.parallel_state")
    dp = dist.new_group([0])
    module._DATA_PARALLEL_GROUP = dp  # type: ignore[attr-defined]
    sys.modules["megatron.core.parallel_state"] = module
    try:
        assert (naming.of(dp).comm, naming.of(dp).kind) == ("dp-0", "dp")
    finally:
        del sys.modules["megatron.core.parallel_state"]
    naming.register(plain, "embedding", "other")
    assert naming.of(plain).comm == "embedding"
    # each announced once, and again only when renamed
    assert [c for c, _, _ in announced] == [
        "world",
        "tp-0",
        "tp-0+1",
        "other-0",
        "dp-0",
        "embedding",
    ]
