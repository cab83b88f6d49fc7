"""Engine, sessions and migrations. Built by ``create_app``; nothing is created at import."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

log = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class Base(DeclarativeBase):
    """Declarative base of every table."""


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, a busy timeout and foreign keys."""
    parsed = make_url(url)
    kwargs: dict[str, object] = {"future": True}
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database
        if database and database != ":memory:" and not database.startswith("file:"):
            Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    else:
        kwargs["pool_pre_ping"] = True
        if parsed.get_backend_name() == "postgresql" and parsed.get_driver_name() == "psycopg":
            # psycopg hands bytes instead of text to a SQL_ASCII database (initdb's default
            # without a UTF-8 locale), which SQLAlchemy cannot read: ask for UTF-8 always
            kwargs["connect_args"] = {"client_encoding": "utf8"}
    engine = create_engine(url, **kwargs)  # type: ignore[arg-type]
    if parsed.get_backend_name() == "sqlite":

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    return engine


def get_for_update(session: Session, model: type[T], key: str) -> T | None:
    """``session.get(model, key, with_for_update=True)`` that locks on SQLite too. SQLite
    ignores FOR UPDATE and its driver begins a transaction only at the first write, so two
    requests could read the same row, and the second's write, once the first had committed,
    undid the first's (two hosts' hang evidence: one host lost). On SQLite a no-op UPDATE of
    the row comes first: the write transaction, and the database's one write lock, begin
    before the read."""
    if session.get_bind().dialect.name == "sqlite":
        table = model.__table__  # type: ignore[attr-defined]
        pk = table.primary_key.columns.values()[0]
        session.execute(update(table).where(pk == key).values({pk.name: pk}))
    return session.get(model, key, with_for_update=True)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, future=True)


@contextmanager
def session_scope(factory: Callable[[], Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on error."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(engine: Engine, revision: str = "base") -> None:
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def head_revision() -> str | None:
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    return script.get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def check_ready(engine: Engine) -> tuple[bool, str]:
    """Storage reachable and migrated to head: ``(ok, reason)``."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current = current_revision(engine)
    except Exception as exc:  # noqa: BLE001 - readiness reports, never raises
        return False, f"storage unreachable: {type(exc).__name__}: {exc}"
    head = head_revision()
    if current != head:
        return False, f"migrations not applied: database at {current}, code at {head}"
    return True, "ok"
