"""Qualification's compute check (agents/qualify.py): the same fixed work on every node, timed so
that a slow part shows and a neighbour's burst does not.

- **GPUs** (PyTorch with CUDA, where the node has both): on every visible GPU at once, a fixed
  loop of ``GPU_SIZE`` x ``GPU_SIZE`` bfloat16 matrix multiplies, timed with CUDA events (what
  the GPU spent, not what the launching thread waited). Every GPU is reported with its model and
  UUID; the host's ``seconds`` is its slowest GPU's (a synchronous job runs at its slowest
  GPU's pace). A GPU that throttles, runs at reduced clocks or has a bad HBM stack is slower
  than its model's norm and named.
- **CPU** (numpy, everywhere else): a fixed loop of ``SIZE`` x ``SIZE`` float32 multiplies.

Each backend runs its loop in ``ROUNDS`` rounds and keeps the fastest, scaled to the whole loop:
another process's burst lengthens some rounds, a slow part lengthens every one. ``device`` in a
result names what was measured (``cuda: <model>`` per GPU, ``cpu: <model>``): the service judges
each measurement against the norm of its own model only.

The node agent imports neither PyTorch nor numpy until a compute check runs (``auto`` looks for
GPUs only where ``torch`` is installed).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

SIZE = 512  # the CPU check's matrices
GPU_SIZE = 8192  # the GPU check's: ~1.1 TFLOP per multiply, ~2 ms on an H100
ROUNDS = 5


class ComputeDevice(StrEnum):
    """Where a node runs its compute check (``--qualify-compute``)."""

    AUTO = "auto"  # its GPUs where PyTorch sees CUDA devices, else its CPU
    CPU = "cpu"
    CUDA = "cuda"


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (its norm is that model's: CPU generations differ by 2x)."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _rounds(iterations: int) -> list[int]:
    rounds = max(1, min(ROUNDS, iterations))
    per = iterations // rounds
    return [per + (iterations % rounds if i == rounds - 1 else 0) for i in range(rounds)]


def cpu_seconds(iterations: int) -> float:
    """Seconds for ``iterations`` fixed matrix multiplies on the CPU: the fastest of up to
    ``ROUNDS`` rounds, per multiply, times ``iterations``."""
    import numpy as np  # (lazy: ``failslow agent``'s options name ComputeDevice)

    rng = np.random.default_rng(0)
    a = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    b = rng.standard_normal((SIZE, SIZE), dtype=np.float32)
    best = float("inf")
    for n in _rounds(iterations):
        t0 = time.perf_counter()
        for _ in range(n):
            a = np.tanh(a @ b)  # tanh keeps the values bounded: the same work each time
        best = min(best, (time.perf_counter() - t0) / n)
    return best * iterations


def _torch() -> Any:
    """PyTorch, with CUDA's devices in bus order: CUDA's own is fastest-first, the bus order is
    nvidia-smi's and the inventory's, so that an index means the same GPU everywhere (read when
    CUDA starts: set before it does)."""
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    import torch

    return torch


def torch_gpus(iterations: int, devices: list[Any] | None = None) -> dict[str, Any]:
    """The check on PyTorch devices (default: every visible CUDA device), all at once: per
    device, the fastest round's seconds per multiply times ``iterations``. Timed with CUDA
    events on CUDA devices; on a CPU device (a test of this code where no GPU is) with the wall
    clock, and with ``SIZE`` matrices."""
    torch = _torch()
    if devices is None:
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if not devices:
        raise ValueError("no CUDA device visible to PyTorch")
    work = []
    for d in devices:
        cuda = d.type == "cuda"
        size, dtype = (GPU_SIZE, torch.bfloat16) if cuda else (SIZE, torch.float32)
        g = torch.Generator(device=d).manual_seed(0)
        a = torch.randn(size, size, device=d, dtype=dtype, generator=g)
        b = torch.randn(size, size, device=d, dtype=dtype, generator=g)
        out = torch.empty_like(a)
        torch.matmul(a, b, out=out)  # warm-up: kernel selection and first-touch outside the clock
        work.append((d, a, b, out))
    for d, *_ in work:
        if d.type == "cuda":
            torch.cuda.synchronize(d)
    best = [float("inf")] * len(work)
    for n in _rounds(iterations):
        marks = []
        for d, a, b, out in work:  # launched on every GPU before waiting for any: they overlap
            if d.type == "cuda":
                with torch.cuda.device(d):
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                        enable_timing=True
                    )
                    start.record()
                    for _ in range(n):
                        torch.matmul(a, b, out=out)  # a fixed product, no growth: same work
                    end.record()
                marks.append((start, end))
            else:
                t0 = time.perf_counter()
                for _ in range(n):
                    torch.matmul(a, b, out=out)
                marks.append((t0, time.perf_counter()))
        for i, (start, end) in enumerate(marks):
            if isinstance(start, float):
                secs = end - start
            else:
                end.synchronize()
                secs = start.elapsed_time(end) / 1e3
            best[i] = min(best[i], secs / n)
    gpus = []
    for (d, *_), per in zip(work, best, strict=True):
        cuda = d.type == "cuda"
        props = torch.cuda.get_device_properties(d) if cuda else None
        uuid = getattr(props, "uuid", None) if props is not None else None
        gpus.append({
            "index": d.index if d.index is not None else len(gpus),
            "uuid": f"GPU-{uuid}" if uuid is not None else None,
            "device": f"cuda: {props.name}" if props is not None else f"torch-cpu: {cpu_model()}",
            "seconds": per * iterations,
        })  # fmt: skip
    slowest = max(gpus, key=lambda g: g["seconds"])
    return {"seconds": slowest["seconds"], "device": slowest["device"], "gpus": gpus}


def has_cuda() -> bool:
    """Whether PyTorch is installed and sees a CUDA device (imports it only when installed)."""
    if importlib.util.find_spec("torch") is None:
        return False
    torch = _torch()
    return bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)


def compute_check(iterations: int, device: ComputeDevice = ComputeDevice.AUTO) -> dict[str, Any]:
    """The result a node reports for a compute task: ``seconds``, ``device`` and, on GPUs, each
    GPU's (``gpus``). ``CUDA`` without a visible GPU is an error (said so), not a CPU check."""
    if device == ComputeDevice.CUDA or (device == ComputeDevice.AUTO and has_cuda()):
        return torch_gpus(iterations)
    return {"seconds": cpu_seconds(iterations), "device": f"cpu: {cpu_model()}"}


__all__ = ["ComputeDevice", "compute_check", "cpu_model", "cpu_seconds", "has_cuda", "torch_gpus"]
