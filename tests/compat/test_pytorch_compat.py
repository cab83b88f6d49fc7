"""PyTorch's own distributed tests pass with failslow in every rank as they pass without it
(a selection that runs in about a minute; the whole gloo suite: ``make compat``,
docs/pytorch-compat.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="PyTorch not installed (optional extra failslow[torch])")
if importlib.util.find_spec("expecttest") is None:  # torch.testing's own dependency
    pytest.skip("expecttest not installed (dev extra)", allow_module_level=True)

# Point-to-point (P2POp, batch_isend_irecv, tags), async and coalesced collectives, sparse
# all-reduce, DDP with and without comm hooks, monitored barrier, futures, the profiler
SELECTION = [
    "test_batch_isend_irecv_gloo",
    "test_batch_isend_irecv_gloo_tags",
    "test_send_recv_with_tag",
    "test_isend_torch_profiler",
    "test_all_reduce_sum_async",
    "test_all_reduce_coalesced_sum",
    "test_all_gather_coalesced_simple",
    "test_sparse_all_reduce_sum",
    "test_DistributedDataParallelCPU",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_monitored_barrier_gloo",
    "test_get_future",
]


@pytest.mark.e2e
@pytest.mark.slow
def test_pytorch_distributed_tests_pass_with_failslow_as_without(tmp_path: Path) -> None:
    from tests.compat.run_suite import main

    out = tmp_path / "compat.json"
    code = main(["--select", *SELECTION, "--jobs", "2", "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["broken_by_failslow"] == [], result
    assert result["plain"].get("passed", 0) == len(SELECTION), result  # the oracle itself works
    assert result["records_written_by_failslow"] > 0, result  # failslow really was in the ranks
    assert code == 0
