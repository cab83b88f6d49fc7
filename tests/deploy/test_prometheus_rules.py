"""deploy/prometheus: the rules pass ``promtool check rules`` and their unit tests
(``promtool test rules``), and every failslow metric they use is one the service exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install prometheus)"
)


@needs_promtool
def test_rules_are_valid() -> None:
    p = subprocess.run(
        [str(PROMTOOL), "check", "rules", "failslow-rules.yml"],
        cwd=DIR, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    p = subprocess.run(
        [str(PROMTOOL), "test", "rules", "failslow-rules.test.yml"],
        cwd=DIR, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr


def test_rules_use_only_metrics_the_service_exports(client: TestClient) -> None:
    used = set(re.findall(r"\bfailslow_[a-z_]+", (DIR / "failslow-rules.yml").read_text()))
    exported = client.get("/metrics").text
    families = set(re.findall(r"^# TYPE (failslow_[a-z_]+) ", exported, flags=re.M))
    # histograms and counters appear with suffixes in PromQL
    names = families | {f + s for f in families for s in ("_bucket", "_sum", "_count", "_total")}
    assert used and used <= names, used - names
