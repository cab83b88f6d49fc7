"""`failslow demo --fast`, the command behind `make demo`, runs its story and finds the GPU."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.procs import CLI, env_for
from tests.live import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_demo_fast(tmp_path: Path) -> None:
    run = subprocess.run(
        CLI + ["demo", "--fast", "--port", str(free_port()), "--workdir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=240,
        env=env_for(tmp_path / "unused.db"),
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert "INCIDENT slow_gpu opened: GPU 5 on node-001 (rank 13)" in out
    assert "OK: the injected slow GPU (rank 13) was found" in out
    assert "OK: the injected slow NIC (node-005) was found" in out
    assert "INCIDENT slow_link opened: The network link of node-005 is slow" in out
    assert "INCIDENT slow_gpu resolved" in out
    # the rebalance is undone once the GPU recovered (issue 16)
    assert "ACTED: rebalance job:demo-llm-64" in out, out[-3000:]
    assert "ACTED: restore equal shares job:demo-llm-64" in out, out[-3000:]
    assert (tmp_path / "demo" / "failslow.db").exists()
