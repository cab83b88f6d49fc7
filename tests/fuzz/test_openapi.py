"""Schemathesis against the service's own OpenAPI document (issue 17), over real HTTP: its
coverage, fuzzing and stateful phases (a dozen examples per operation, ~15 s) must find no 5xx
answer. ``POST /v2/ingest`` and ``POST /v2/ingest/bundle`` are left out (schemathesis cannot
write their binary bodies; malformed v2 bodies and bundles are tested in
tests/service/ingest/test_ingest_v2.py and test_ingest_bundle.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from failslow.service.settings import ActionsSettings, Settings
from tests.helpers import envelope
from tests.live import live_service

ST = Path(sys.executable).parent / "st"


@pytest.mark.skipif(not ST.exists(), reason="schemathesis is not installed (the dev extra has it)")
def test_no_operation_answers_a_server_error(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path}/fuzz.db",
                        actions=ActionsSettings(enabled=False))  # fmt: skip
    with live_service(settings) as url:
        assert httpx.post(f"{url}/v1/ingest", json=envelope(job="job-a")).status_code == 200
        run = subprocess.run(
            [str(ST), "run", f"{url}/openapi.json", "--checks", "not_a_server_error",
             "--max-examples", "12", "--exclude-path", "/v2/ingest",
             "--exclude-path", "/v2/ingest/bundle", "--seed", "1", "--no-color"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,  # its .schemathesis/ there
        )  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "generated" in run.stdout
