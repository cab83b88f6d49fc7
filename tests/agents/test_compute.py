"""The qualification's compute check on the node (agents/compute.py): the same work everywhere,
its fastest round, what it measured named; the GPU path's code on PyTorch's CPU device (no GPU
here: the CUDA-event timing itself runs only on a GPU machine, bench/torch_gpu.py's kind)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from failslow.agents import compute as c
from failslow.agents.compute import ComputeDevice, compute_check, cpu_model, cpu_seconds


def test_the_cpu_check_does_the_same_work_and_names_the_cpu() -> None:
    out = compute_check(2, ComputeDevice.CPU)
    assert 0 < out["seconds"] < 10
    assert out["device"] == f"cpu: {cpu_model()}" and "gpus" not in out


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
    assert cpu_model(info) == "AMD EPYC 9654 96-Core Processor"
    assert cpu_model(tmp_path / "absent")  # something, never an error


def test_the_check_reports_its_fastest_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's burst lengthens one round; the result is the fastest round, scaled."""
    rounds = iter([1.0, 10.0, 1.0, 1.0, 1.0])  # seconds per round of 2 multiplies
    clock = {"t": 0.0, "start": True}

    def fake() -> float:
        if not clock["start"]:
            clock["t"] += next(rounds)
        clock["start"] = not clock["start"]
        return clock["t"]

    monkeypatch.setattr(c, "time", SimpleNamespace(perf_counter=fake))
    assert cpu_seconds(10) == pytest.approx(5.0)  # 0.5 s per multiply x 10


def test_the_gpu_path_measures_every_device_and_reports_the_slowest() -> None:
    torch = pytest.importorskip("torch")
    out = c.torch_gpus(4, [torch.device("cpu"), torch.device("cpu")])
    assert [g["index"] for g in out["gpus"]] == [0, 1]
    assert all(g["seconds"] > 0 and g["device"].startswith("torch-cpu: ") for g in out["gpus"])
    assert out["seconds"] == max(g["seconds"] for g in out["gpus"])


def test_auto_without_a_gpu_checks_the_cpu_and_cuda_without_one_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: auto checks it")
    assert compute_check(2)["device"].startswith("cpu: ")
    with pytest.raises(ValueError, match="no CUDA device"):
        compute_check(2, ComputeDevice.CUDA)
