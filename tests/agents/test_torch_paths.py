"""Every way a PyTorch program communicates is recorded, step by step, as often as the backend
itself communicated (PyTorch's profiler counts gloo's own events: an independent count), and
nothing of ``torch.distributed`` is altered by the instrumentation."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch not installed (optional extra failslow[torch])"
)
mp = pytest.importorskip("torch.multiprocessing")

from tests.agents import torch_paths  # noqa: E402

# gloo reduce-scatters with an all-reduce (torch_paths.BACKEND_TO_OP)
AS_BACKEND = {"reducescatter": "allreduce"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    from tests.live import free_port

    tmp = tmp_path_factory.mktemp("paths")
    port = free_port()
    ctx = mp.get_context("spawn")
    names = list(torch_paths.SCENARIOS)
    procs = [
        ctx.Process(target=torch_paths.worker, args=(r, port, names, str(tmp / f"r{r}.json")))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    return [json.loads((tmp / f"r{r}.json").read_text()) for r in range(2)]


@pytest.mark.e2e
@pytest.mark.parametrize("scenario", list(torch_paths.SCENARIOS))
def test_each_path_recorded_as_often_as_the_backend_communicated(
    runs: list[dict[str, Any]], scenario: str
) -> None:
    for rank, run in enumerate(runs):
        steps = run[scenario]
        for i, step in enumerate(steps):
            ours: Counter[str] = Counter()
            for op, n in step["failslow"].items():
                ours[AS_BACKEND.get(op, op)] += n
            assert sum(ours.values()) > 0, (scenario, rank, i)
            assert dict(ours) == step["backend"], (scenario, rank, i, step)


@pytest.mark.e2e
def test_records_agree_across_ranks_and_nothing_is_lost(runs: list[dict[str, Any]]) -> None:
    by_key: dict[tuple[str, int], dict[int, list[Any]]] = {}
    for rank, run in enumerate(runs):
        stats = run["_stats"]
        assert stats["errors"] == 0 and stats["untimed"] == 0, stats
        assert stats["calls_seen"] == stats["recorded"] == len(run["_records"])
        for comm, seq, op, nbytes, start, end, peer in run["_records"]:
            assert end is not None and end >= start
            assert rank not in by_key.setdefault((comm, seq), {}), (comm, seq)
            by_key[(comm, seq)][rank] = [op, nbytes, peer]
    for (comm, seq), members in by_key.items():
        assert sorted(members) == [0, 1], (comm, seq, members)
        ops = {m[0] for m in members.values()}
        if comm.startswith("p2p-"):
            assert ops == {"send", "recv"}, (comm, seq, members)
            assert members[0][2] == 1 and members[1][2] == 0  # each names the other
            assert members[0][1] == members[1][1]  # the same message
        else:
            assert len(ops) == 1, (comm, seq, members)
    assert runs[0]["_comms"] == runs[1]["_comms"]
    assert runs[0]["_comms"]["p2p-0-1"] == ["p2p", [0, 1]]
    assert runs[0]["_comms"]["world"] == ["world", [0, 1]]


@pytest.mark.e2e
def test_optimizer_steps_mark_steps_when_the_script_marks_none(runs: list[dict[str, Any]]) -> None:
    with_optimizer = ["ddp", "fsdp2", "dtensor_tp", "pipelining", "compiled"]
    n = sum(torch_paths.STEPS for s in with_optimizer[:4] if s in torch_paths.SCENARIOS)
    for rank, run in enumerate(runs):
        # one optimizer per scenario, each freed before the next steps: each takes over
        assert run["_steps"] == [[rank, i] for i in range(n)], run["_steps"]
        assert run["_stats"]["auto_steps"] == n


def _identity_worker(rank: int, port: int, out: str) -> None:
    import inspect
    import os

    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    before = {
        name: getattr(dist, name)
        for name in ("all_reduce", "isend", "irecv", "send", "recv", "batch_isend_irecv", "P2POp")
    }
    signatures = {name: str(inspect.signature(f)) for name, f in before.items()}
    work_methods = {name: getattr(dist.Work, name) for name in ("wait", "is_completed")}

    from failslow.agents.torch import Instrumentation

    bogus = object()

    def error() -> str:
        try:
            dist.all_reduce(torch.ones(2), group=bogus)  # type: ignore[arg-type]
        except Exception as exc:  # noqa: BLE001
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    result: dict[str, Any] = {"error_plain": error()}
    inst = Instrumentation(torch_paths.Capture(), poll_s=None).install()  # type: ignore[arg-type]
    result["same_functions"] = all(getattr(dist, n) is f for n, f in before.items())
    result["c10d_functions"] = distributed_c10d.all_reduce is dist.all_reduce
    result["same_signatures"] = all(
        str(inspect.signature(getattr(dist, n))) == s for n, s in signatures.items()
    )
    # PyTorch checks the function's identity here; it raised with failslow's earlier wrappers
    op = dist.P2POp(dist.isend, torch.ones(2), 1 - rank)
    result["p2pop"] = op.op is dist.isend
    work = dist.all_reduce(torch.ones(2), async_op=True)
    result["work_type"] = type(work).__name__
    work.wait()
    result["error"] = error()  # errors of the training pass through unchanged
    # autograd through a functional collective is PyTorch's own
    import torch.distributed._functional_collectives as funcol

    x = torch.ones(3, requires_grad=True)
    y = funcol.all_reduce(x * 2, "sum", dist.group.WORLD)
    y = y.wait() if hasattr(y, "wait") else y
    result["forward"] = y.tolist()
    inst.uninstall()
    result["work_methods_restored"] = all(
        getattr(dist.Work, n) is f for n, f in work_methods.items()
    )
    result["stats_errors"] = inst.stats()["errors"]
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.e2e
def test_nothing_of_torch_distributed_is_replaced(tmp_path: Path) -> None:
    from tests.live import free_port

    port = free_port()
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_identity_worker, args=(r, port, str(tmp_path / f"{r}.json")))
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0
    for r in range(2):
        res = json.loads((tmp_path / f"{r}.json").read_text())
        assert res["same_functions"] and res["c10d_functions"] and res["same_signatures"], res
        assert res["p2pop"] and res["work_type"] == "Work", res
        assert res["error"] == res["error_plain"] != "no error"  # PyTorch's own, unchanged
        assert res["forward"] == [4.0, 4.0, 4.0]
        assert res["work_methods_restored"] and res["stats_errors"] == 0, res
