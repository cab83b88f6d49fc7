"""A row the database refuses for good never blocks the job: the commit is written again row
by row, the refused row is dropped (logged, counted) and everything else is stored (issue 17).

The refusal is real, made by the database itself: a trigger (SQLite) or a CHECK constraint
(PostgreSQL) on the ``hosts`` table refuses the host ``poison`` -- as a column too small or a
constraint added by a later schema would."""

from __future__ import annotations

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from failslow.service.db import make_engine
from failslow.service.settings import Settings
from tests.helpers import MS, T0, envelope, step

pytestmark = pytest.mark.both_databases

REFUSE = {
    "sqlite": "CREATE TRIGGER refuse_poison BEFORE INSERT ON hosts WHEN NEW.host = 'poison' "
    "BEGIN SELECT RAISE(ABORT, 'the poison host is refused'); END",
    "postgresql": "ALTER TABLE hosts ADD CONSTRAINT refuse_poison CHECK (host <> 'poison')",
}


def post(client: TestClient, host: str, first: int, n: int = 4):  # type: ignore[no-untyped-def]
    body = envelope(
        host=host,
        sent_ns=T0 + first * MS,
        ranks=[{"rank": 0 if host == "h0" else 1, "gpu": 0, "world_size": 2}],
        steps=[step(0 if host == "h0" else 1, s, T0 + s * MS, T0 + s * MS + MS // 2)
               for s in range(first, first + n)],  # fmt: skip
    )
    return client.post("/v1/ingest", content=orjson.dumps(body),
                       headers={"Content-Type": "application/json"})  # fmt: skip


def test_a_row_the_database_refuses_is_dropped_and_the_job_goes_on(
    client: TestClient, settings: Settings
) -> None:
    engine = make_engine(settings.database_url)
    with engine.begin() as c:
        c.execute(text(REFUSE[engine.dialect.name]))
    engine.dispose()
    assert post(client, "h0", 0).status_code == 200
    poisoned = post(client, "poison", 0)
    assert poisoned.status_code == 200, poisoned.text  # its records were applied
    for first in (4, 8, 12):  # the old code answered 503 from here on, for every host
        later = post(client, "h0", first)
        assert later.status_code == 200 and later.json()["accepted"] == 4, later.text
    ingest = client.get("/v1/jobs/job-a").json()["ingest"]
    assert ingest["h0"]["accepted"] == 16 and "poison" not in ingest
    metrics = client.get("/metrics").text
    assert 'failslow_storage_refused_rows_total{row="host"} 1.0' in metrics
    with engine.connect() as c:  # the poison host's other rows were stored
        ranks = dict(c.execute(text("SELECT rank, host FROM ranks WHERE job_id = 'job-a'")).all())
        hosts = set(c.scalars(text("SELECT host FROM hosts WHERE job_id = 'job-a'")))
    engine.dispose()
    assert ranks == {0: "h0", 1: "poison"} and hosts == {"h0"}
