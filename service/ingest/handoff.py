"""Ingest with a bus (docs/replicas.md): a replica checks an envelope's top level, as without one,
then publishes it to the job's partition of the stream instead of applying it, and answers once
the stream holds it. The job's owner applies it (``failslow.service.replica``). Every call to the
bus from ingest is here, and so is the one answer to the bus being away (503)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from failslow.service.bus.client import Bus, BusUnavailable, MessageKind, msg_id
from failslow.service.errors import Unavailable
from failslow.service.stream.columnar import UnknownTopology
from failslow.service.stream.state import ApplyResult


@contextmanager
def _bus_calls() -> Iterator[None]:
    try:
        yield
    except BusUnavailable as exc:
        raise Unavailable(str(exc), headers={"Retry-After": "2"}) from None


async def publish(
    bus: Bus, kind: MessageKind, body: bytes, *, job: str, host: str, agent: str | None,
    batch_seq: int | None, records: int,
) -> ApplyResult:  # fmt: skip
    """Publish one checked envelope; its answer counts its records as queued (or as
    duplicates when the stream already holds the batch)."""
    with _bus_calls():
        done = await bus.publish(job, kind, body, host=host,
                                 msg_id=msg_id(job, host, agent, batch_seq))  # fmt: skip
    if done.duplicate:
        return ApplyResult(duplicates=records, batch_duplicate=True)
    return ApplyResult(accepted=records)


async def publish_v2(bus: Bus, header: dict[str, Any], body: bytes) -> ApplyResult:
    """A checked v2 envelope; raises UnknownTopology (409, as without a bus) for a digest no
    replica registered."""
    job, host, digest = header["job"], header["host"], header["topology"]
    with _bus_calls():
        known = await bus.knows_topology(job, host, digest)
    if not known:
        raise UnknownTopology(host, digest)
    return await publish(
        bus, MessageKind.V2, body, job=job, host=host, agent=header.get("agent"),
        batch_seq=header.get("batch_seq"),
        records=int(header.get("collectives", 0)) + int(header.get("steps", 0)),
    )  # fmt: skip


async def publish_registration(bus: Bus, raw: bytes, *, job: str, host: str, digest: str) -> None:
    """A checked v2 registration: to the stream (its owner applies it) and to the registry of
    digests every replica answers 409 from."""
    await publish(bus, MessageKind.TOPOLOGY, raw, job=job, host=host, agent=None,
                  batch_seq=None, records=0)  # fmt: skip
    with _bus_calls():
        await bus.remember_topology(job, host, digest)
