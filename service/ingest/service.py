"""Accepting an envelope: apply it to the job's memory, then make its accounting durable."""

from __future__ import annotations

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from failslow.service.db import session_scope
from failslow.service.errors import Overloaded, Unavailable
from failslow.service.jobs.service import clear_committed, commit_ingest
from failslow.service.stream.records import Envelope
from failslow.service.stream.registry import JobRegistry, RegistryFull
from failslow.service.stream.state import ApplyResult


def accept(
    *, jobs: JobRegistry, sessions: sessionmaker[Session], envelope: Envelope
) -> ApplyResult:
    """Apply ``envelope`` and commit its counters before answering.

    If the commit fails the counters stay pending in memory (they are additive) and go out with
    the job's next successful commit; the client gets 503 and re-sends, which is then recognised
    as a duplicate. Either way every record is counted exactly once.
    """
    try:
        state = jobs.get_or_load(envelope.job)
    except RegistryFull as exc:
        raise Overloaded(str(exc), headers={"Retry-After": "5"}) from None
    with state.lock:
        result = state.apply(envelope)
        try:
            with session_scope(sessions) as session:
                commit_ingest(session, state=state)
        except SQLAlchemyError as exc:
            raise Unavailable(
                f"storage unavailable ({type(exc).__name__}); retry later",
                headers={"Retry-After": "2"},
            ) from exc
        clear_committed(state)
    return result
