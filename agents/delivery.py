"""Delivery of sealed envelopes: in order, retried with backoff, registered first where they are
v2, buried only when the service refuses them for good; heartbeats when there is nothing to send;
an archive of what was delivered."""

from __future__ import annotations

import gzip
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from failslow.agents import wire
from failslow.agents.columnar import V2Sealer, peek_header
from failslow.agents.transport import UNKNOWN_TOPOLOGY, Backoff, Delivery, Sender
from failslow.wire import v2

if TYPE_CHECKING:
    import threading
    from typing import Any

    from failslow.agents.agent import AgentStats
    from failslow.agents.spool import Outbox

log = logging.getLogger(__name__)
AUTH_ALARM_EVERY_S = 60.0  # an auth failure is logged at ERROR at most this often


class Shipping:
    """The delivery half of :class:`~failslow.agents.agent.NodeAgent`."""

    if TYPE_CHECKING:
        job: str
        host: str
        sender: Sender
        backoff: Backoff
        outbox: Outbox
        stats: AgentStats
        v2: V2Sealer | None
        archive: Path | None
        ranks: dict[int, dict[str, Any]]
        comms: dict[str, dict[str, Any]]
        _registered: set[str]
        _lock: threading.Lock
        _stop: threading.Event
        _last_post: float
        last_ok: float  # monotonic time of the last envelope or heartbeat the service took
        _auth_alarm_at: float
        refused_records: int

    # -- delivery ------------------------------------------------------------------------------
    def deliver_once(self) -> str:
        """Try to deliver the oldest envelope: 'ok', 'retry', 'refused' or 'empty'."""
        item = self.outbox.oldest()
        if item is None:
            return "empty"
        seq, payload, records = item
        header = peek_header(payload) if self.v2 is not None else None
        if header is not None:
            digest = str(header.get("topology"))
            if digest not in self._registered:
                registered = self._register(digest)
                if registered.outcome != "ok":
                    return self._failed(seq, records, registered)
            result = self.sender.post(payload, v2=True)
            if result.outcome == UNKNOWN_TOPOLOGY:  # unknown to the service: register again
                self._registered.discard(digest)
                return "retry"
        else:
            result = self.sender.post(payload)
        self._last_post = time.monotonic()
        if result.outcome == "ok":
            self.last_ok = self._last_post
            body = result.body or {}
            self.stats.records_accepted += int(body.get("accepted", 0))
            self.stats.records_duplicate += int(body.get("duplicates", 0))
            rejected = body.get("rejected") or []
            self.stats.records_rejected += len(rejected)
            if rejected:
                log.warning(
                    "service rejected %d records of envelope %d, e.g. %s",
                    len(rejected),
                    seq,
                    rejected[:3],
                )
            self.stats.envelopes_sent += 1
            if self.archive is not None:
                self._archive(payload)
            self.outbox.ack(seq)
            self.backoff.reset()
            return "ok"
        return self._failed(seq, records, result)

    def _register(self, digest: str) -> Delivery:
        registration = self.v2.registrations.get(digest) if self.v2 is not None else None
        if registration is None:
            return Delivery("refused", None, None, error=f"registration {digest} was lost")
        result = self.sender.register(self.job, self.host, registration)
        if result.outcome == "ok":
            self._registered.add(digest)
            self.stats.registrations += 1
        return result

    def _failed(self, seq: int, records: int, result: Delivery) -> str:
        if result.outcome == "auth":  # kept and retried: a token can be fixed, data cannot
            self.stats.auth_failures += 1
            now = time.monotonic()
            if now - self._auth_alarm_at >= AUTH_ALARM_EVERY_S:
                self._auth_alarm_at = now
                log.error(
                    "the service refuses this agent's token (HTTP %s: %s); %d envelopes wait in "
                    "the outbox and are retried; check --token / FAILSLOW_TOKEN",
                    result.status, result.error, len(self.outbox),
                )  # fmt: skip
        if result.outcome in ("retry", "auth", UNKNOWN_TOPOLOGY):
            self.stats.retries += 1
            self.stats.last_error = (
                f"HTTP {result.status}: {result.error}" if result.status else result.error
            ) or "unknown error"
            wait = result.wait_s if result.wait_s is not None else self.backoff.next()
            log.info(
                "delivery of envelope %d failed (%s); retrying in %.2fs",
                seq,
                self.stats.last_error,
                wait,
            )
            self._stop.wait(wait)
            return "retry"
        self.stats.refused_envelopes += 1
        self.refused_records += records
        self.stats.dropped_records = self.refused_records + self.outbox.dropped_records
        self.stats.last_error = f"HTTP {result.status}: {result.error}"
        log.error(
            "service refused envelope %d (%s); moved to %s",
            seq,
            self.stats.last_error,
            self.outbox.dead,
        )
        self.outbox.bury(seq, self.stats.last_error)
        return "refused"

    def _archive(self, payload: bytes) -> None:
        assert self.archive is not None
        try:
            if self.v2 is not None and peek_header(payload) is not None:
                envelope = self.v2.to_v1(payload)
            else:
                raw = gzip.decompress(payload) if payload[:2] == b"\x1f\x8b" else payload
                envelope = orjson.loads(raw)
            with self.archive.open("ab") as f:
                f.write(orjson.dumps(envelope) + b"\n")
        except (OSError, ValueError) as exc:
            log.warning("cannot archive an envelope to %s: %s", self.archive, exc)

    def heartbeat(self) -> None:
        with self._lock:
            head = {"job": self.job, "host": self.host, "sent_ns": time.time_ns()}
            ranks, comms = list(self.ranks.values()), list(self.comms.values())
        if self.v2 is not None:  # no records, no batch_seq: the topology by digest only
            digest = self.v2.topology(ranks, comms, head["sent_ns"])
            if digest not in self._registered and self._register(digest).outcome != "ok":
                return
            body = v2.encode({**head, "topology": digest}, {}, {})
            result = self.sender.post(gzip.compress(body, compresslevel=1), v2=True)
            if result.outcome == UNKNOWN_TOPOLOGY:
                self._registered.discard(digest)
        else:
            env = {**head, "ranks": ranks, "comms": comms}
            result = self.sender.post(wire.encode_envelope(env))
        self._last_post = time.monotonic()
        if result.outcome == "ok":
            self.last_ok = self._last_post
            self.stats.heartbeats += 1
            if self.archive is not None:  # a replay must hear the host as the service did
                self._archive(
                    wire.encode_envelope(
                        {**head, "ranks": ranks, "comms": comms, "collectives": [], "steps": []},
                        compress=False,
                    )
                )
