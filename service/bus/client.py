"""The connection to NATS JetStream: the stream of envelopes, the buckets of ownership and of
registered topologies, and publishing.

Every accepted envelope becomes one message on ``<subject>.<partition>`` (the partition is a
stable hash of the job), carrying the body as received (decompressed) and its kind, job and host
in headers. ``Nats-Msg-Id`` is ``job/host/agent/batch_seq`` when the envelope has them, so a batch
re-sent within the duplicate window is stored once (JetStream answers ``duplicate``).
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import nats
from nats.errors import Error as NatsError
from nats.js import api
from nats.js.errors import BadRequestError, KeyNotFoundError
from nats.js.kv import KeyValue

from failslow.service.bus.settings import BusSettings

log = logging.getLogger(__name__)

HDR_KIND = "Failslow-Kind"
HDR_JOB = "Failslow-Job"
HDR_HOST = "Failslow-Host"
OWNERS = "failslow-owners"
REPLICAS = "failslow-replicas"
TOPOLOGIES = "failslow-topologies"


class MessageKind(StrEnum):
    V1 = "v1"  # a v1 JSON envelope
    V2 = "v2"  # a v2 binary envelope
    TOPOLOGY = "topology"  # a v2 host registration (JSON: sent_ns, ranks, comms)


class BusUnavailable(Exception):
    """NATS did not confirm that the stream holds the message."""


@dataclass(frozen=True, slots=True)
class Published:
    seq: int  # stream sequence
    duplicate: bool  # JetStream already held a message with this id


def partition_of(job: str, partitions: int) -> int:
    """The partition of a job: the same in every replica and every release."""
    return zlib.crc32(job.encode()) % partitions


def msg_id(job: str, host: str, agent: str | None, batch_seq: int | None) -> str | None:
    if agent is None or batch_seq is None:
        return None
    return f"{job}/{host}/{agent}/{batch_seq}"


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _topology_key(job: str, host: str, digest: str) -> str:
    # KV keys allow fewer characters than ids: hash them
    return hashlib.sha256(f"{job}\0{host}\0{digest}".encode()).hexdigest()[:40]


class Bus:
    def __init__(self, settings: BusSettings) -> None:
        if not settings.url:
            raise ValueError("the bus needs FAILSLOW_BUS__URL")
        self.settings = settings
        self.replica = settings.replica_id or default_replica_id()
        self.nc: Any = None
        self.js: Any = None
        self.owners: KeyValue | None = None
        self.replicas: KeyValue | None = None
        self.topologies: KeyValue | None = None
        self._known: OrderedDict[str, None] = OrderedDict()  # topology keys seen

    # -- set-up --------------------------------------------------------------------------------
    async def connect(self) -> None:
        s = self.settings
        servers = [u.strip() for u in (s.url or "").split(",") if u.strip()]
        self.nc = await nats.connect(
            servers=servers, name=self.replica, max_reconnect_attempts=-1,
            reconnect_time_wait=0.5, connect_timeout=5,
        )  # fmt: skip
        self.js = self.nc.jetstream(timeout=s.publish_timeout_s)
        cfg = api.StreamConfig(
            name=s.stream, subjects=[f"{s.subject}.*"], max_age=s.max_age_s,
            duplicate_window=s.duplicate_window_s, num_replicas=s.stream_replicas,
            storage=api.StorageType.FILE, retention=api.RetentionPolicy.LIMITS,
        )  # fmt: skip
        try:
            await self.js.add_stream(cfg)
        except BadRequestError:  # it exists with other limits: take ours
            await self.js.update_stream(cfg)
        self.owners = await self._bucket(OWNERS, ttl=s.owner_ttl_s)
        self.replicas = await self._bucket(REPLICAS, ttl=s.owner_ttl_s)
        self.topologies = await self._bucket(TOPOLOGIES, ttl=s.max_age_s * 2)
        log.info("bus: %s on stream %s (%d partitions)", self.replica, s.stream, s.partitions)

    async def _bucket(self, name: str, *, ttl: float) -> KeyValue:
        cfg = api.KeyValueConfig(
            bucket=name, history=1, ttl=ttl, replicas=self.settings.stream_replicas
        )
        try:
            return await self.js.create_key_value(cfg)  # type: ignore[no-any-return]
        except BadRequestError:
            return await self.js.key_value(name)  # type: ignore[no-any-return]

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            await self.nc.drain()

    # -- ingest side -----------------------------------------------------------------------------
    async def last_seq(self, partition: int) -> int | None:
        """The stream sequence of the partition's newest message (None: none, or NATS away)."""
        try:
            msg = await self.js.get_last_msg(self.settings.stream, self.subject(partition))
        except Exception:  # noqa: BLE001 - no message yet, or the server away: unknown
            return None
        return int(msg.seq) if msg.seq is not None else None

    def subject(self, partition: int) -> str:
        return f"{self.settings.subject}.{partition}"

    def partition(self, job: str) -> int:
        return partition_of(job, self.settings.partitions)

    async def publish(
        self, job: str, kind: MessageKind, body: bytes, *, host: str, msg_id: str | None
    ) -> Published:
        """Return once the stream holds the message (raises :class:`BusUnavailable`)."""
        headers = {HDR_KIND: kind.value, HDR_JOB: job, HDR_HOST: host}
        if msg_id is not None:
            headers["Nats-Msg-Id"] = msg_id
        try:
            ack = await self.js.publish(
                self.subject(self.partition(job)), body, headers=headers,
                timeout=self.settings.publish_timeout_s,
            )  # fmt: skip
        except (NatsError, TimeoutError) as exc:
            raise BusUnavailable(f"the stream did not confirm the batch ({exc!r})") from exc
        return Published(seq=int(ack.seq), duplicate=bool(ack.duplicate))

    async def remember_topology(self, job: str, host: str, digest: str) -> None:
        key = _topology_key(job, host, digest)
        assert self.topologies is not None
        try:
            await self.topologies.put(key, b"1")
        except (NatsError, TimeoutError) as exc:
            raise BusUnavailable(f"the registration was not stored ({exc!r})") from exc
        self._remember(key)

    async def knows_topology(self, job: str, host: str, digest: str) -> bool:
        """Whether a replica published this registration (cached once seen)."""
        key = _topology_key(job, host, digest)
        if key in self._known:
            self._known.move_to_end(key)
            return True
        assert self.topologies is not None
        try:
            await self.topologies.get(key)
        except KeyNotFoundError:
            return False
        except (NatsError, TimeoutError) as exc:
            raise BusUnavailable(f"registrations cannot be read ({exc!r})") from exc
        self._remember(key)
        return True

    def _remember(self, key: str) -> None:
        self._known[key] = None
        self._known.move_to_end(key)
        while len(self._known) > 100_000:
            self._known.popitem(last=False)
