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
    "rank_history_buckets",
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


def test_rank_history_rows_move_into_columns_and_back(db_url: str) -> None:
    """0007 moves per-rank rows into one row of columns per bucket; its downgrade moves them
    back, values (float32-rounded) and missing values (NULL) included."""
    import math

    from sqlalchemy import text

    from failslow.service.jobs.history import decode

    engine = make_engine(db_url)
    upgrade(engine, "0006")
    rows = [  # (rank, bucket, steps, score): bucket 0 has ranks 0-2, bucket 10 ranks 1-2
        (0, 0, 10, 0.5), (1, 0, 10, None), (2, 0, 9, 1.25), (1, 10, 10, 0.75), (2, 10, 4, 1.0),
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO jobs (id, first_seen_ns, last_seen_ns, watermark_ns) "
                          "VALUES ('j', 0, 0, 0)"))  # fmt: skip
        for rank, bucket, steps, score in rows:
            conn.execute(
                text("INSERT INTO rank_history (job_id, rank, bucket, steps, end_ns, step_time_s, "
                     "compute_s, comm_s, lateness_s, score) VALUES ('j', :r, :b, :s, :e, 1.5, "
                     "NULL, 0.25, 0.125, :score)"),
                {"r": rank, "b": bucket, "s": steps, "e": 100 + bucket, "score": score},
            )  # fmt: skip
    upgrade(engine)
    with engine.connect() as conn:
        got = conn.execute(text("SELECT bucket, end_ns, ranks, data FROM rank_history_buckets "
                                "ORDER BY bucket")).all()  # fmt: skip
    assert [(b, e, n) for b, e, n, _ in got] == [(0, 100, 3), (10, 110, 2)]
    first = decode(got[0][3])
    assert first.rank.tolist() == [0, 1, 2] and first.steps.tolist() == [10, 10, 9]
    assert first.values["score"][0] == 0.5 and math.isnan(first.values["score"][1])
    assert math.isnan(first.values["compute_s"][2]) and first.values["lateness_s"][2] == 0.125
    downgrade(engine, "0006")
    with engine.connect() as conn:
        back = conn.execute(text("SELECT rank, bucket, steps, score, compute_s, comm_s "
                                 "FROM rank_history ORDER BY bucket, rank")).all()  # fmt: skip
    assert [tuple(r[:4]) for r in back] == rows
    assert all(r.compute_s is None and r.comm_s == 0.25 for r in back)
    engine.dispose()
