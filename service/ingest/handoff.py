"""Ingest with a bus (docs/replicas.md): a replica checks an envelope's top level, as without one,
then publishes it to the job's partition of the stream instead of applying it, and answers once
the stream holds it. The job's owner applies it (``failslow.service.replica``)."""

from __future__ import annotations

from failslow.service.bus.client import Bus, BusUnavailable, MessageKind, msg_id
from failslow.service.errors import Unavailable
from failslow.service.stream.state import ApplyResult


async def publish(
    bus: Bus, kind: MessageKind, body: bytes, *, job: str, host: str, agent: str | None,
    batch_seq: int | None, records: int,
) -> ApplyResult:  # fmt: skip
    """Publish one checked envelope; its answer counts its records as queued (or as
    duplicates when the stream already holds the batch)."""
    try:
        done = await bus.publish(job, kind, body, host=host, msg_id=msg_id(job, host, agent,
                                                                          batch_seq))
    except BusUnavailable as exc:
        raise Unavailable(str(exc), headers={"Retry-After": "2"}) from None
    if done.duplicate:
        return ApplyResult(duplicates=records, batch_duplicate=True)
    return ApplyResult(accepted=records)
