"""docs/api.md is what scripts/api_docs.py makes of the service's OpenAPI document now: the API
reference cannot drift from the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_api_reference_is_up_to_date() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "api_docs.py"), "--check"],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr


def test_the_reference_names_every_endpoint() -> None:
    from failslow.service.app import create_app
    from failslow.service.settings import Settings

    doc = create_app(Settings(database_url="sqlite://")).openapi()
    text = (ROOT / "docs" / "api.md").read_text()
    for path, item in doc["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in text
