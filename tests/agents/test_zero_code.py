"""``failslow run -- COMMAND`` instruments every Python process of COMMAND with no change to the
script; ``failslow doctor`` says what a process here can and cannot see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from failslow.agents import wire

SCRIPT = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(4):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
dist.all_reduce(torch.ones(3))
dist.destroy_process_group()
"""


def _failslow() -> list[str]:
    return [sys.executable, "-m", "failslow.cli"]


def _records(spool: Path) -> list[list[object]]:
    items: list[list[object]] = []
    for f in sorted(spool.glob("*.jsonl")):
        items += wire.decode_payload(f.read_bytes())[1]
    return items


@pytest.mark.e2e
def test_run_instruments_an_unmodified_script(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch not installed")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    spool = tmp_path / "spool"
    spool.mkdir()
    cmd = [*_failslow(), "run", "--job", "zc", "--spool", str(spool), "--"]
    out = subprocess.run(
        [*cmd, sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "job zc" in out.stderr
    items = _records(spool)
    kinds = [m[0] for m in items]
    assert ["r", 0, None, 1] in items and ["m", "world", "world", [0]] in items
    assert kinds.count("s") == 4  # one step per optimizer.step(), the script marks none
    ops = [m[4] for m in items if m[0] == "c"]
    assert ops.count("allreduce") >= 5 and "broadcast" in ops  # DDP's buckets and start


def test_run_costs_nothing_where_torch_is_never_imported(tmp_path: Path) -> None:
    out = subprocess.run(
        [*_failslow(), "run", "--quiet", "--spool", str(tmp_path), "--", sys.executable, "-c",
         "import sys; print('torch' in sys.modules, 'failslow.agents.autoload' in sys.modules)"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]  # armed, torch not imported by us


def test_run_reports_a_missing_command() -> None:
    none = subprocess.run([*_failslow(), "run"], capture_output=True, text=True, check=False)
    assert none.returncode == 2 and "no command" in none.stderr
    bogus = subprocess.run(
        [*_failslow(), "run", "--", "no-such-command-xyz"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bogus.returncode == 127 and "not found" in bogus.stderr


def test_run_keeps_an_existing_pythonpath_and_sitecustomize(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['MINE'] = 'ran'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    code = f"import os, sys; print(os.environ.get('MINE'), sys.path.count({str(tmp_path)!r}))"
    out = subprocess.run(
        [*_failslow(), "run", "--quiet", "--", sys.executable, "-c", code],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ran", "1"]


def test_doctor_says_what_this_process_sees(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="PyTorch not installed")
    env = {**os.environ, "FAILSLOW_SOCKET": str(tmp_path / "absent.sock")}
    out = subprocess.run(
        [*_failslow(), "doctor", "-o", "json"], capture_output=True, text=True, timeout=120,
        check=False, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["agent"]["verdict"] == "warn" and "absent.sock" in checks["agent"]["detail"]
    assert checks["interception"]["verdict"] == "ok"
    for path in ("torch.distributed functions", "functional collectives", "DDP gradient buckets"):
        assert checks[path]["verdict"] == "ok", checks[path]
        assert int(checks[path]["detail"].split()[0]) >= 1
    assert checks["step markers"]["verdict"] == "ok"
    assert report["verdict"] == "warn"
