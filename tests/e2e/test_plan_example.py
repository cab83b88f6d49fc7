"""The closed loop with real processes: `failslow serve`, `failslow agent`, and
examples/train_with_plan.py (4 ranks, real barriers, rank 2 slowed 2x) that follows the plan."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.e2e.procs import CLI, env_for, spawn, start_service, stop
from tests.live import free_port, wait_for

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_example_job_is_rebalanced_and_speeds_up(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    db = tmp_path / "db.sqlite"
    env = env_for(db)
    env["FAILSLOW_ACTIONS__COSTS_S"] = json.dumps({"rebalance": 0.5, "restart": 600})
    svc = start_service(port, db, tmp_path / "service.log", env)
    sock = tmp_path / "agent.sock"
    agent = spawn(
        CLI
        + ["agent", "--service", url, "--job", "toy", "--host", "h0", "--socket", str(sock)]
        + ["--state-dir", str(tmp_path / "agent"), "--flush-interval", "0.2"],
        env,
        tmp_path / "agent.log",
    )
    try:
        assert wait_for(sock.exists)
        run = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "train_with_plan.py")]
            + ["--service", url, "--job", "toy", "--socket", str(sock), "--ranks", "4"]
            + ["--steps", "260", "--microbatches", "8", "--compute-s", "0.003"]
            + ["--slow-rank", "2", "--slow-from", "60", "--factor", "2", "--poll-every", "2"],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            cwd=ROOT,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        out = run.stdout
        got = re.search(r"plan v(\d+) shares \[([\d, ]+)\]", out)
        assert got, out
        shares = [int(x) for x in got.group(2).split(",")]
        assert sum(shares) == 32 and shares[2] == min(shares) < 8
        final = json.loads(out.strip().splitlines()[-1].split(":", 1)[1])
        assert final == shares
        times = [
            (int(s), float(t)) for s, t in re.findall(r"step (\d+): step time ([\d.]+) s", out)
        ]
        before = max(t for s, t in times if s <= 60)
        slow = dict(times)[80]  # steps 60-79: slowed, not yet rebalanced
        after = max(t for s, t in times if s >= 220)
        assert slow > before * 1.3  # the fault really slowed the job
        assert (slow - after) / (slow - before) >= 0.5, out  # and the plan won most of it back
        acts = httpx.get(f"{url}/v1/jobs/toy/actions").json()
        assert ("rebalance", "succeeded") in [(a["kind"], a["state"]) for a in acts]
    finally:
        stop(agent)
        stop(svc)
