"""``failslow doctor``: what a training process on this machine can and cannot show failslow.

Each check is a line with a verdict — ``ok``, ``warn`` (works, with a gap named) or ``fail``
(this source of data is blind) — and what it means. The PyTorch part does not trust the
presence of modules: it installs the instrumentation in this process, brings up a one-rank gloo
group in memory, makes one call of each kind (eager, functional, point-to-point-free DDP bucket,
compiled where the compiler runs) and says which of them were recorded. Called inside a training
process (``report(live=inst)``), it adds what that process's instrumentation has seen so far.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import platform
import socket
import sys
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Verdict(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    verdict: Verdict
    detail: str


def _agent_socket() -> Check:
    from failslow.agents.sdk import default_socket

    job = os.environ.get("FAILSLOW_JOB", "default")
    spool = os.environ.get("FAILSLOW_SPOOL_DIR")
    if spool:
        ok = os.path.isdir(spool) and os.access(spool, os.W_OK)
        return Check(
            "agent",
            Verdict.OK if ok else Verdict.FAIL,
            f"records go to files in {spool}" + ("" if ok else " (not a writable folder)"),
        )
    path = os.environ.get("FAILSLOW_SOCKET") or default_socket(job)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(path)
        return Check("agent", Verdict.OK, f"a node agent listens on {path} (job {job})")
    except OSError as exc:
        why = "nothing there" if exc.errno == errno.ENOENT else os.strerror(exc.errno or 0)
        return Check(
            "agent",
            Verdict.WARN,
            f"no node agent on {path} ({why}): records would wait in the process (bounded), "
            f"then be dropped; start `failslow agent --job {job}` on this node",
        )
    finally:
        sock.close()


def _torch_checks() -> list[Check]:
    if importlib.util.find_spec("torch") is None:
        return [
            Check(
                "pytorch",
                Verdict.FAIL,
                "PyTorch is not installed in this Python: training processes of this "
                "interpreter cannot be instrumented (pip install 'failslow[torch]')",
            )
        ]
    import torch
    import torch.distributed as dist

    checks = [Check("pytorch", Verdict.OK, f"torch {torch.__version__}")]
    if not dist.is_available():
        return [*checks, Check("distributed", Verdict.FAIL, "torch.distributed is not built in")]
    backends = [
        name
        for name, ok in (
            ("gloo", dist.is_gloo_available()),
            ("nccl", dist.is_nccl_available()),
            ("mpi", dist.is_mpi_available()),
        )
        if ok
    ]
    checks.append(Check("backends", Verdict.OK, ", ".join(backends) or "none"))
    if torch.cuda.is_available():
        checks.append(
            Check(
                "gpu timing",
                Verdict.OK,
                f"{torch.cuda.device_count()} CUDA device(s): calls on CUDA tensors are timed "
                "with CUDA events (arrival to completion on the GPU)",
            )
        )
    else:
        checks.append(
            Check("gpu timing", Verdict.OK, "no CUDA device: calls are timed on the wall clock")
        )
    fr = os.environ.get("TORCH_FR_BUFFER_SIZE") or os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    checks.append(
        Check(
            "flight recorder",
            Verdict.OK if fr else Verdict.WARN,
            f"on ({fr} entries): the node agent can read its dumps after a hang"
            if fr
            else "off (TORCH_FR_BUFFER_SIZE unset): hangs are placed from failslow's own "
            "in-flight records only",
        )
    )
    return checks + _self_test()


def _self_test() -> list[Check]:
    """Install the instrumentation here, on a one-rank gloo group, and see what it records."""
    import torch
    import torch.distributed as dist

    from failslow.agents.sdk import Recorder
    from failslow.agents.torch import Instrumentation

    if dist.is_initialized():
        return [Check("self-test", Verdict.WARN, "skipped: a process group exists already")]
    recorder = Recorder("doctor", socket_path=os.devnull, start=False)
    seen: list[tuple[str, str]] = []
    original = recorder.record_collective

    def capture(**kw: Any) -> None:
        seen.append((kw["comm"], kw["op"]))
        original(**kw)

    recorder.record_collective = capture  # type: ignore[method-assign]
    inst = Instrumentation(recorder, inflight_after_s=None, poll_s=None)
    checks: list[Check] = []
    try:
        inst.install()
        if not inst.installed:
            return [Check("interception", Verdict.FAIL, "another instrumentation is active")]
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        paths: dict[str, Any] = {}

        def eager() -> None:
            from torch.distributed import all_reduce  # a name bound before the call

            all_reduce(torch.ones(4))

        def functional() -> None:
            import torch.distributed._functional_collectives as funcol

            out = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
            getattr(out, "wait", lambda: out)()

        def ddp() -> None:
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            model(torch.ones(2, 4)).sum().backward()
            opt.step()

        paths = {"torch.distributed functions": eager, "functional collectives": functional}
        paths["DDP gradient buckets"] = ddp
        for label, run in paths.items():
            before = len(seen)
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - report it, do not stop the report
                checks.append(Check(label, Verdict.WARN, f"could not run here: {exc!r}"[:200]))
                continue
            inst.poll_events()
            got = len(seen) - before
            checks.append(
                Check(label, Verdict.OK if got else Verdict.FAIL, f"{got} call(s) recorded")
            )
        steps = inst.steps.auto_steps
        checks.append(
            Check(
                "step markers",
                Verdict.OK if steps else Verdict.WARN,
                f"optimizer.step() marks steps ({steps} seen)"
                if steps
                else "no global optimizer hook: mark steps with Instrumentation.step()",
            )
        )
        missing = inst.interception.missing
        checks.insert(
            0,
            Check(
                "interception",
                Verdict.WARN if missing else Verdict.OK,
                f"{len(inst.interception.operators)} c10d operators timed below the Python API"
                + (f"; not seen: {', '.join(missing)}" if missing else ""),
            ),
        )
    except Exception as exc:  # noqa: BLE001
        checks.append(Check("self-test", Verdict.FAIL, f"failed: {exc!r}"[:300]))
    finally:
        inst.uninstall()
        if dist.is_initialized():
            dist.destroy_process_group()
    return checks


def report(live: Any = None) -> dict[str, Any]:
    """Every check, and ``live.stats()`` when given a running :class:`Instrumentation`."""
    from failslow.agents import autoload

    checks = [
        Check("python", Verdict.OK, f"{platform.python_implementation()} {sys.version.split()[0]}")
    ]
    checks.append(_agent_socket())
    if live is None:
        checks += _torch_checks()
    checks.append(Check("zero-code", Verdict.OK, autoload.state()))
    out: dict[str, Any] = {"checks": [asdict(c) for c in checks]}
    if live is not None:
        out["instrumentation"] = live.stats()
    out["verdict"] = max(
        (c.verdict for c in checks), key=[Verdict.OK, Verdict.WARN, Verdict.FAIL].index
    )
    return out
