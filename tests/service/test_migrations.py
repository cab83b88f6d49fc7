"""Alembic migrations: up, down, up again; and they match the SQLAlchemy models exactly."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from failslow.service.db import (
    check_ready,
    current_revision,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from failslow.service.models import Base

pytestmark = pytest.mark.both_databases  # storage and API: SQLite and PostgreSQL

TABLES = {
    "jobs",
    "hosts",
    "agent_streams",
    "ranks",
    "comms",
    "incidents",
    "rank_history",
    "job_history",
    "actions",
    "action_events",
    "plans",
    "job_workloads",
}


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    engine = make_engine(db_url)
    assert check_ready(engine)[0] is False
    upgrade(engine)
    assert set(inspect(engine).get_table_names()) >= TABLES
    assert current_revision(engine) == head_revision()
    assert check_ready(engine) == (True, "ok")
    downgrade(engine, "base")
    assert not TABLES & set(inspect(engine).get_table_names())
    assert current_revision(engine) is None
    upgrade(engine)
    assert current_revision(engine) == head_revision()
    downgrade(engine, "0001")  # one step: only the actions/plans tables go
    names = set(inspect(engine).get_table_names())
    assert "actions" not in names and "plans" not in names and "incidents" in names
    upgrade(engine)
    engine.dispose()


def test_models_and_migrations_agree(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    with engine.connect() as conn:
        diff = compare_metadata(
            MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
        )
    engine.dispose()
    assert diff == []


def test_cli_db_commands(db_url: str, capsys) -> None:  # type: ignore[no-untyped-def]
    from failslow.cli import main

    assert main(["db", "upgrade", "--database-url", db_url]) == 0
    assert f"database at {head_revision()}" in capsys.readouterr().out
    assert main(["db", "downgrade", "--database-url", db_url]) == 0
    assert "database at None" in capsys.readouterr().out
