"""Qualification in the fault lab: three nodes, each in its own network namespace with its own
qualification worker (a real process), one node's link throttled with ``tc tbf``; `failslow
qualify` through a real service says no-go for that node, with the reason, and go for the
others. Skipped with the reason where the machine lacks root, namespaces or tc."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from failslow.cli import main
from failslow.harness.lab import system
from failslow.service.fleet.settings import FleetSettings
from failslow.service.settings import Settings
from tests.live import live_service

missing = system.preflight()
pytestmark = pytest.mark.skipif(bool(missing), reason="fault lab needs " + "; ".join(missing))


def test_a_throttled_nic_is_no_go_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the three "hosts" share this machine's cores, so their compute checks contend: the compute
    # rule is tested on given measurements (test_qualify.py); here the link is what is judged
    settings = Settings(database_url=f"sqlite:///{tmp_path}/q.db",
                        fleet=FleetSettings(qualify_compute_ratio=4.0))  # fmt: skip
    procs: list[subprocess.Popen[bytes]] = []
    with system.LabNetwork(3, prefix="fsq", net=81) as net, \
            live_service(settings, bind="0.0.0.0") as url:  # fmt: skip  # noqa: S104
        port = url.rsplit(":", 1)[1]
        try:
            for i in range(3):
                argv = [sys.executable, "-m", "failslow.agents.qualify", "--service",
                        f"http://{net.gateway}:{port}", "--host", f"labhost{i}", "--listen",
                        f"{net.ip(i)}:7100"]  # fmt: skip
                with open(tmp_path / f"worker{i}.log", "wb") as log:  # the child keeps its fd
                    procs.append(subprocess.Popen(net.exec(i, argv), stdout=log, stderr=log))
            net.throttle(1, rate="20mbit")  # 2.5 MB/s both ways; the bridge does hundreds
            rc = main(["qualify", "--hosts", "labhost0,labhost1,labhost2", "--timeout", "40",
                       "--bytes", str(2 << 20), "--url", url, "-o", "json"])  # fmt: skip
            out = json.loads(capsys.readouterr().out)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=10)
    logs = {i: (tmp_path / f"worker{i}.log").read_text()[-2000:] for i in range(3)}
    assert rc == 3 and out["state"] == "done", (out, logs)
    by = {h["host"]: h for h in out["hosts"]}
    assert out["no_go"] == ["labhost1"] and out["go"] == ["labhost0", "labhost2"], (out, logs)
    # the link is the reason; on a loaded 2-core machine its compute round may add a second one
    [reason] = [r for r in by["labhost1"]["reasons"] if r.startswith("link ")]
    assert "at best (to labhost0, labhost2)" in reason, by["labhost1"]["reasons"]
    assert by["labhost1"]["link_bps"] < 4e6 < by["labhost0"]["link_bps"] / 5
