"""A PostgreSQL database created with SQL_ASCII (initdb's default where no UTF-8 locale exists,
as in a minimal Debian image) still works: the engine asks for UTF-8 text."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text

from failslow.service.db import make_engine, upgrade


def test_a_sql_ascii_database_works(postgres: object) -> None:
    server = postgres
    name = "t_ascii"
    with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres",  # type: ignore[attr-defined]
                         autocommit=True) as c:  # fmt: skip
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f"CREATE DATABASE \"{name}\" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
                  "TEMPLATE template0")  # fmt: skip
    engine = make_engine(server.url(name))  # type: ignore[attr-defined]
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW server_encoding")).scalar() == "SQL_ASCII"
            assert isinstance(conn.execute(text("SELECT version()")).scalar(), str)
        upgrade(engine)  # the migrations run on it
    finally:
        engine.dispose()


pytestmark = pytest.mark.slow
