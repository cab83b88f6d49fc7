"""Fixtures of the fleet tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.db import make_engine, make_sessionmaker, upgrade


@pytest.fixture
def sessions(db_url: str) -> Iterator[sessionmaker[Session]]:
    """A migrated database's sessions (SQLite, or PostgreSQL too where ``both_databases``)."""
    engine = make_engine(db_url)
    upgrade(engine)
    yield make_sessionmaker(engine)
    engine.dispose()
