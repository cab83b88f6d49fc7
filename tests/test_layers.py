"""The layer contracts of pyproject.toml ([tool.importlinter]) hold, and they catch a back-import:
the same check on a copy of the tree with one import added against the arrows fails, naming it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"cli": "cli", "service": "service", "agents": "agents", "relay": "relay",
           "detectors": "detectors", "harness": "harness", "migrations": "migrations",
           "wire": "wire"}  # fmt: skip
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
        "sys.exit(c.main(sys.argv[1:], standalone_mode=False))"]  # fmt: skip


def lint(tree: Path | None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the real tree, or over a copy in ``tree`` (found first on the path:
    ``failslow`` is a namespace package, so the copy's portion shadows the installed one)."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [*LINT, "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=tree or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name, folder in FOLDERS.items():
        shutil.copytree(
            ROOT / folder,
            tmp_path / "failslow" / name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
    return tmp_path


def test_the_contracts_hold() -> None:
    out = lint(None)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 broken" in out.stdout


def test_the_copy_is_what_is_checked(tree: Path) -> None:
    out = lint(tree)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Analyzed" in out.stdout


@pytest.mark.parametrize(
    "module,line,broken",
    [
        # the event-time core must not reach up into ingest
        (
            "service/stream/state.py",
            "import failslow.service.ingest.envelope",
            "failslow.service.ingest",
        ),
        # detectors import nothing of the project
        ("detectors/robust.py", "import failslow.service.ids", "failslow.detectors.robust"),
        # the agents never import the service
        ("agents/spool.py", "import failslow.service.db", "failslow.agents.spool"),
        # the core knows no SQL
        ("service/stream/topology.py", "import sqlalchemy", "sqlalchemy"),
        # the relay speaks the wire, not the service's code or its framework
        ("relay/batcher.py", "import failslow.service.errors", "failslow.relay.batcher"),
        ("relay/app.py", "import fastapi", "fastapi"),
    ],  # fmt: skip
)
def test_a_back_import_breaks_a_contract(tree: Path, module: str, line: str, broken: str) -> None:
    path = tree / "failslow" / module
    path.write_text(path.read_text() + f"\n{line}  # a deliberate back-import\n")
    out = lint(tree)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "BROKEN" in out.stdout and broken in out.stdout
