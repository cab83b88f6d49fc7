"""When the database refuses an ingest commit for good, write what it will take, row by row.

The group commit (:mod:`.service`) writes the accounting of many envelopes of many jobs in one
transaction. A transient failure (the database is away, a lock, a lost connection) is answered
503 and retried with everything. A permanent one (a constraint, a value the column cannot hold:
``IntegrityError``, ``DataError``, ...) would fail again on every retry, and since what failed
goes back into the job, it would block every later envelope of that job (issue 17). Instead,
each job's part of the commit is written in a savepoint and, when refused, again one row
per savepoint: each row the database refuses is dropped,
logged with the reason and counted (``failslow_storage_refused_rows_total{row}``), and the rest
is stored; the envelopes are answered as usual, since their records were applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from enum import StrEnum

from sqlalchemy.exc import (
    DisconnectionError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from failslow.service.jobs.service import Uncommitted, commit_ingest

log = logging.getLogger(__name__)


class Row(StrEnum):
    """What one refused row held."""

    HOST = "host"  # a host's counters
    STREAM = "stream"  # an agent's stream position
    RANK = "rank"
    COMM = "comm"
    REGISTRATION = "registration"
    SNAPSHOT = "snapshot"
    JOB = "job"


def transient(exc: BaseException) -> bool:
    """Whether retrying the same write later may succeed (the database, not the data)."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)):
        return True
    return bool(getattr(exc, "connection_invalidated", False))


def rows(u: Uncommitted) -> Iterator[tuple[Row, str, Uncommitted]]:
    """``u`` cut into one-row pieces (each also writes the job's own row), with what they are."""
    bare = replace(u, deltas={}, streams={}, ranks={}, comms={}, registrations={})
    yield Row.JOB, u.job, bare
    for host, d in u.deltas.items():
        yield Row.HOST, host, replace(bare, deltas={host: d})
    for key, seq in u.streams.items():
        yield Row.STREAM, "/".join(key), replace(bare, streams={key: seq})
    for rank, where in u.ranks.items():
        yield Row.RANK, str(rank), replace(bare, ranks={rank: where})
    for name, comm in u.comms.items():
        yield Row.COMM, name, replace(bare, comms={name: comm})
    for host, reg in u.registrations.items():
        yield Row.REGISTRATION, host, replace(bare, registrations={host: reg})


def store(
    session: Session,
    u: Uncommitted,
    refused: Callable[[Row], None],
    also: Callable[[Session], None] | None = None,
) -> None:
    """Write one job's accounting (and ``also``, its snapshot) in a savepoint; if the database
    refuses it for good, again row by row, dropping only the refused rows. A transient error
    propagates: the caller puts everything back and the clients retry."""
    try:
        with session.begin_nested():
            commit_ingest(session, u=u)
            if also is not None:
                also(session)
    except SQLAlchemyError as exc:
        if transient(exc):
            raise
        log.error("job %s: the database refused its ingest commit (%s); writing it row by row",
                  u.job, str(exc).splitlines()[0])  # fmt: skip
        salvage(session, u, refused, also)


def salvage(
    session: Session,
    u: Uncommitted,
    refused: Callable[[Row], None],
    also: Callable[[Session], None] | None = None,
) -> None:
    """Write one job's accounting (and ``also``, its snapshot) a row per savepoint, dropping
    (logged, counted) the rows the database refuses. A transient error propagates (retry all)."""
    pieces: list[tuple[Row, str, Callable[[Session], None]]] = [
        (kind, what, lambda s, p=piece: commit_ingest(s, u=p)) for kind, what, piece in rows(u)
    ]
    if also is not None:
        pieces.append((Row.SNAPSHOT, u.job, also))
    for kind, what, write in pieces:
        try:
            with session.begin_nested():
                write(session)
        except SQLAlchemyError as exc:
            if transient(exc):
                raise
            refused(kind)
            log.error(
                "job %s: the database refused its %s row %r for good; dropped (%s)",
                u.job, kind.value, what, str(exc).splitlines()[0],
            )  # fmt: skip
