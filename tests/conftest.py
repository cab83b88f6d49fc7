"""Shared fixtures: isolated settings, a real app on a temporary SQLite database."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from failslow.service.app import create_app
from failslow.service.settings import DetectionSettings, Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never see the developer's FAILSLOW_* variables."""
    for key in list(os.environ):
        if key.startswith("FAILSLOW_"):
            monkeypatch.delenv(key)


# Tests that share one machine-wide resource run in one pytest-xdist worker, one after another
# (make test runs the rest in parallel): the fault lab's network namespaces, bridges, tc and
# cgroups; and PyTorch's suite, which keeps every core busy. (Tests whose timing assumes an idle
# machine are marked ``solo``: make test runs them alone, after the others.)
SERIAL_GROUPS = {
    "tests/harness/lab/": "heavy",
    "tests/compat/": "heavy",
}


def serial_group(nodeid: str) -> str | None:
    return next((g for prefix, g in SERIAL_GROUPS.items() if nodeid.startswith(prefix)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """One work unit per test, except the serial groups: each group is one unit (one worker,
    in order). xdist's own ``--dist loadgroup`` cannot do it under pytest 9.2, whose node ids
    it can no longer suffix with the group."""
    from xdist.scheduler import LoadScopeScheduling

    class SerialGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return serial_group(nodeid) or nodeid

    return SerialGroups(config, log)  # type: ignore[arg-type]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Tests marked ``both_databases`` run on SQLite and on a real PostgreSQL server."""
    if "db_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
        "both_databases"
    ):
        metafunc.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    from tests.infra import postgres as pg

    why = pg.unavailable()
    if why:
        pytest.skip(f"PostgreSQL tests skipped: {why}")
    with pg.server() as server:
        yield server


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if getattr(request, "param", "sqlite") == "postgresql":
        server = request.getfixturevalue("postgres")
        return str(server.create_database())  # type: ignore[attr-defined]
    return f"sqlite:///{tmp_path}/failslow.db"


@pytest.fixture
def settings(db_url: str) -> Settings:
    return Settings(database_url=db_url, detection=DetectionSettings(interval_s=0.05))


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c
