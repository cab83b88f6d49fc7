"""The fault lab's training job without the lab: 4 real gloo ranks on loopback (tensor-parallel
pairs x DDP), once without and once with failslow's instrumentation. The losses must be
bit-identical, and every tensor-parallel and data-parallel collective must reach the agent's
socket (here: an SDK spool directory read back)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="PyTorch not installed (optional extra failslow[torch])")

from failslow.agents import wire  # noqa: E402
from failslow.harness.lab.train import groups  # noqa: E402
from tests.live import free_port  # noqa: E402

STEPS = 6


def _run(tmp: Path, tag: str, instrument: bool, layout: tuple[str, ...] = ()) -> list[list[float]]:
    port = free_port()
    procs = []
    for r in range(4):
        argv = [
            sys.executable, "-m", "failslow.harness.lab.train", "--rank", str(r), "--world", "4",
            "--master", f"127.0.0.1:{port}", "--steps", str(STEPS), "--batch", "64",
            "--hidden", "256", "--progress", str(tmp / f"{tag}-{r}.jsonl"), *layout,
        ]  # fmt: skip
        if instrument:
            argv += ["--spool", str(tmp / "spool"), "--job", "lab-test"]
        else:
            argv += ["--no-instrument"]
        procs.append(subprocess.Popen(argv, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin"}))
    try:
        codes = [p.wait(timeout=120) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:  # where each rank is stuck (faulthandler on SIGUSR1, to stderr)
            if p.poll() is None:
                p.send_signal(signal.SIGUSR1)
        time.sleep(2)
        raise
    finally:
        for p in procs:  # a failed run leaves no rank behind to disturb later tests
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * 4
    return [
        [json.loads(line)["loss"] for line in (tmp / f"{tag}-{r}.jsonl").read_text().splitlines()]
        for r in range(4)
    ]


def test_groups_follow_megatron_order() -> None:
    assert groups(8, 2) == ([[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]])
    with pytest.raises(ValueError):
        groups(6, 4)
    # 2 stages of 2 data-parallel ranks (no tensor parallelism): data-parallel within a stage
    assert groups(4, 1, 2)[1] == [[0, 1], [2, 3]]
    assert groups(8, 2, 2) == ([[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2], [1, 3], [4, 6], [5, 7]])


def _completed(colls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The completed calls, each once. A call still in flight after the agent's report delay is
    also sent in flight first (the first collective connects gloo: on a loaded machine it took
    over a second, and rank 0's first tp0 all-reduce came twice); that record must be followed
    by its completion."""
    done = [c for c in colls if c["end_ns"] is not None]
    keys = {(c["comm"], c["rank"], c["seq"], c["op"]) for c in done}
    inflight = {(c["comm"], c["rank"], c["seq"], c["op"]) for c in colls if c["end_ns"] is None}
    assert inflight <= keys, sorted(inflight - keys)
    return done


@pytest.mark.e2e
def test_pipeline_lab_job_trains_bit_identically_and_reports_its_sends_and_receives(
    tmp_path: Path,
) -> None:
    """``--pp 2 --tp 1``: ranks 0, 1 are stage 0 and send their activations to 2, 3."""
    layout = ("--pp", "2", "--tp", "1")
    plain = _run(tmp_path, "plain", instrument=False, layout=layout)
    timed = _run(tmp_path, "timed", instrument=True, layout=layout)
    assert plain == timed
    assert plain[0] == [0.0] * STEPS and plain[2] != plain[3]  # the loss is the last stage's
    items = []
    for f in sorted((tmp_path / "spool").glob("*.jsonl")):
        items += wire.decode_payload(f.read_bytes())[1]
    colls = [wire.collective_dict(m) for m in items if m[0] == "c"]
    p2p = {(c["comm"], c["rank"], c["op"]) for c in colls if c["comm"].startswith("p2p")}
    assert p2p == {(f"p2p-{a}-{a + 2}", r, op) for a in (0, 1) for r in (a, a + 2)
                   for op in ("send", "recv")}  # fmt: skip
    sends = [c for c in _completed(colls) if c["comm"] == "p2p-0-2" and c["op"] == "send"]
    assert len(sends) == 2 * STEPS  # activations forward, gradients back
    assert {c["comm"] for c in colls if not c["comm"].startswith("p2p")} == {"dp0", "dp1"}


@pytest.mark.e2e
def test_instrumented_lab_job_trains_bit_identically_and_reports_every_collective(
    tmp_path: Path,
) -> None:
    plain = _run(tmp_path, "plain", instrument=False)
    timed = _run(tmp_path, "timed", instrument=True)
    assert plain == timed  # bit-identical, rank by rank, step by step
    assert plain[0] == plain[1] and plain[0] != plain[2]  # tp peers agree; replicas differ
    items = []
    for f in sorted((tmp_path / "spool").glob("*.jsonl")):
        items += wire.decode_payload(f.read_bytes())[1]
    colls = [wire.collective_dict(m) for m in items if m[0] == "c"]
    per = {(c["comm"], c["rank"]) for c in colls}
    assert per == {("tp0", 0), ("tp0", 1), ("tp1", 2), ("tp1", 3),
                   ("dp0", 0), ("dp0", 2), ("dp1", 1), ("dp1", 3)}  # fmt: skip
    tp = [c for c in _completed(colls) if c["comm"] == "tp0" and c["rank"] == 0]
    assert len(tp) == 2 * STEPS  # Megatron's g (forward) and f (backward) all-reduce per step
    steps = [m for m in items if m[0] == "s"]
    assert len(steps) == 4 * STEPS
