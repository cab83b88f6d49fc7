"""Bodies gathered per token and sent upstream as one ``POST /v2/ingest/bundle``.

Every v2 body a relay takes waits (at most ``max_wait_s``) for others sent with the same
Authorization header; ``max_bundle`` bodies, ``max_bundle_bytes`` or the wait close a bundle.
The service's answer lists one item per body, in order (docs/ingest-v2.md, section 2b), and each
waiting agent is answered with its own item as the service would have answered it alone: its
IngestResult (200), or its problem with the status, Retry-After included. A failure of the whole
bundle becomes each body's answer: 401/403/429/503 as the service gave them; 413 splits the
bundle in halves and sends each again (a body alone goes as ``POST /v2/ingest``); the service
unreachable, or any other answer, is a ``503``/``502`` with Retry-After, which agents retry
(they keep their batches, and the service recognises a re-sent batch by its agent and
batch_seq: nothing is lost or counted twice).
"""

from __future__ import annotations

import asyncio
import gzip
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx
import orjson

from failslow.wire import v2

log = logging.getLogger(__name__)

PROBLEM = "application/problem+json"
TYPE_BASE = "https://failslow.dev/problems/"  # as the service's problem types
_PROBLEM_FIELDS = ("type", "title", "status", "detail", "errors", "correlation_id")


class Outcome(StrEnum):
    """What became of a body the relay took (the label of its counter)."""

    ACCEPTED = "accepted"  # the service's 200
    REFUSED = "refused"  # the service's problem for this body (4xx, 5xx)
    BUSY = "busy"  # the relay's own queue is full: 429 before anything was sent
    UNREACHABLE = "unreachable"  # no answer from the service: 503
    BAD_UPSTREAM = "bad_upstream"  # an answer the relay cannot read: 502


@dataclass(frozen=True)
class Answer:
    """One agent's answer."""

    status: int
    body: bytes
    content_type: str = "application/json"
    retry_after_s: int | None = None
    outcome: Outcome = Outcome.ACCEPTED


def problem(status: int, slug: str, title: str, detail: str, retry_after_s: int | None,
            outcome: Outcome) -> Answer:  # fmt: skip
    """An answer the relay makes itself, shaped as the service's problems are."""
    body = {"type": TYPE_BASE + slug, "title": title, "status": status, "detail": detail}
    return Answer(status, orjson.dumps(body), PROBLEM, retry_after_s, outcome)


@dataclass(frozen=True)
class RelaySettings:
    upstream: str  # the service's base URL
    max_bundle: int = 64  # bodies per bundle
    max_wait_s: float = 0.05  # the longest a body waits for others
    max_bundle_bytes: int = 8 * 1024 * 1024  # below the service's ingest.max_body_bytes (16 MiB)
    max_body_bytes: int = 16 * 1024 * 1024  # one agent's body, after decompression (413)
    max_queued_bytes: int = 256 * 1024 * 1024  # bodies waiting or in flight; more: 429
    max_in_flight: int = 16  # bundles awaiting the service's answer at once
    max_passthrough: int = 64  # other requests (registrations, reads) passed on at once
    timeout_s: float = 30.0  # for one bundle's answer
    gzip: bool = False  # gzip bundles (costs both ends CPU; for slow links)
    retry_after_s: int = 1  # sent with the relay's own 429 and 503

    def __post_init__(self) -> None:
        if not 1 <= self.max_bundle <= v2.MAX_BUNDLE_ITEMS:
            raise ValueError(f"max_bundle must be 1 to {v2.MAX_BUNDLE_ITEMS}")
        if self.max_wait_s < 0 or self.max_in_flight < 1 or self.timeout_s <= 0:
            raise ValueError("max_wait_s >= 0, max_in_flight >= 1 and timeout_s > 0 are needed")
        if self.max_passthrough < 1:
            raise ValueError("max_passthrough >= 1 is needed")
        if not self.upstream.startswith(("http://", "https://")):
            raise ValueError(f"upstream must be an http(s) URL, not {self.upstream!r}")


@dataclass
class _Pending:
    bodies: list[bytes] = field(default_factory=list)
    futures: list[asyncio.Future[Answer]] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | None = None


@dataclass
class Counters:
    """What the relay did; read by /relayz and /metrics."""

    bodies: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))
    bundles: int = 0
    splits: int = 0  # bundles the service found too large, sent again in halves
    alone: int = 0  # bodies too large for a bundle of one, sent as POST /v2/ingest
    queued_bytes: int = 0
    in_flight: int = 0


class Batcher:
    def __init__(self, settings: RelaySettings, client: httpx.AsyncClient,
                 on_bundle: Callable[[int, float], None] | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.client = client
        self.url = settings.upstream.rstrip("/") + "/v2/ingest/bundle"
        self.counters = Counters()
        self.on_bundle = on_bundle  # (bodies, seconds to the answer), for metrics
        self._pending: dict[str, _Pending] = {}
        self._slots = asyncio.Semaphore(settings.max_in_flight)
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, authorization: str, body: bytes) -> Answer:
        """Queue one agent's (decompressed) v2 body; its answer once its bundle's is in."""
        s, c = self.settings, self.counters
        if c.queued_bytes + len(body) > s.max_queued_bytes:
            return problem(429, "overloaded", "Too many requests",
                           "the relay holds as many bodies as it may; send again later",
                           s.retry_after_s, Outcome.BUSY)  # fmt: skip
        pending = self._pending.get(authorization)
        if pending is not None and pending.size + len(body) > s.max_bundle_bytes:
            self._flush(authorization)
            pending = None
        if pending is None:
            pending = self._pending[authorization] = _Pending()
            loop = asyncio.get_running_loop()
            pending.timer = loop.call_later(s.max_wait_s, self._flush, authorization)
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        pending.bodies.append(body)
        pending.futures.append(future)
        pending.size += len(body)
        c.queued_bytes += len(body)
        if len(pending.bodies) >= s.max_bundle:
            self._flush(authorization)
        return await future

    def _flush(self, authorization: str) -> None:
        pending = self._pending.pop(authorization, None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        task = asyncio.create_task(self._send(authorization, pending))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self, timeout_s: float = 30.0) -> None:
        """Send whatever waits and wait (bounded) for every bundle's answer: on shutdown."""
        for key in list(self._pending):
            self._flush(key)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    async def _send(self, authorization: str, pending: _Pending) -> None:
        try:
            async with self._slots:
                self.counters.in_flight += 1
                try:
                    answers = await self._post(authorization, pending.bodies)
                finally:
                    self.counters.in_flight -= 1
        except Exception:  # a bug here must still answer every agent that waits
            log.exception("sending a bundle of %d bodies failed", len(pending.bodies))
            answers = [_unreachable(self.settings, "the relay failed to send the bundle")] * len(
                pending.bodies
            )
        finally:
            self.counters.queued_bytes -= pending.size
        for future, answer in zip(pending.futures, answers, strict=True):
            if not future.done():
                future.set_result(answer)

    async def _post(self, authorization: str, bodies: list[bytes]) -> list[Answer]:
        s = self.settings
        data = v2.encode_bundle(bodies)
        headers = {"Content-Type": v2.BUNDLE_MEDIA_TYPE}
        if authorization:
            headers["Authorization"] = authorization
        if s.gzip:
            data = gzip.compress(data, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            resp = await self.client.post(self.url, content=data, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("the service did not answer a bundle of %d: %s: %s",
                        len(bodies), type(exc).__name__, exc)  # fmt: skip
            return [_unreachable(s, f"the service did not answer: {type(exc).__name__}")] * len(
                bodies
            )
        self.counters.bundles += 1
        if self.on_bundle is not None:
            self.on_bundle(len(bodies), loop.time() - started)
        status = resp.status_code
        if status == 200:
            return _items(resp.content, len(bodies))
        if status == 413 and len(bodies) > 1:  # each half again: only a body too large alone fails
            self.counters.splits += 1
            half = len(bodies) // 2
            first, second = await asyncio.gather(
                self._post(authorization, bodies[:half]), self._post(authorization, bodies[half:])
            )
            return first + second
        if status == 413:  # one body that fits the service's limit alone, not with the framing
            return [await self._post_alone(authorization, bodies[0])]
        if status in (401, 403, 429, 503):  # about every body alike: answered as given
            return [passed_on(resp, PROBLEM, Outcome.REFUSED)] * len(bodies)
        log.error("the service answered a bundle with %d: %r", status, resp.content[:300])
        bad = problem(502, "bad-gateway", "Bad gateway",
                      f"the service answered the relay's bundle with {status}",
                      s.retry_after_s, Outcome.BAD_UPSTREAM)  # fmt: skip
        return [bad] * len(bodies)


    async def _post_alone(self, authorization: str, body: bytes) -> Answer:
        """One body as ``POST /v2/ingest``: a body of exactly the service's limit is a bundle
        12 bytes over it (issue 31: the relay answered 413 where the service answers 200, and
        agents drop a body answered 413). Its answer is the service's, as it came."""
        headers = {"Content-Type": v2.MEDIA_TYPE}
        if authorization:
            headers["Authorization"] = authorization
        url = self.settings.upstream.rstrip("/") + "/v2/ingest"
        try:
            resp = await self.client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return _unreachable(self.settings, f"the service did not answer: {type(exc).__name__}")
        self.counters.alone += 1
        if resp.status_code == 200:
            return Answer(200, resp.content)
        return passed_on(resp, PROBLEM, Outcome.REFUSED)


def passed_on(resp: httpx.Response, content_type: str, outcome: Outcome) -> Answer:
    """The service's answer as it came: status, body, content type (``content_type`` when it
    named none) and Retry-After."""
    retry = resp.headers.get("retry-after")
    return Answer(resp.status_code, resp.content, resp.headers.get("content-type", content_type),
                  int(retry) if retry and retry.isdigit() else None, outcome)  # fmt: skip


def _unreachable(s: RelaySettings, detail: str) -> Answer:
    return problem(503, "unavailable", "Service unavailable", detail, s.retry_after_s,
                   Outcome.UNREACHABLE)  # fmt: skip


def _items(content: bytes, n: int) -> list[Answer]:
    """Each body's answer from the bundle's ``{"items": [...]}``."""
    try:
        items = orjson.loads(content)["items"]
        if not isinstance(items, list) or len(items) != n:
            raise ValueError(f"{n} items expected")
        return [_answer(item) for item in items]
    except (ValueError, KeyError, TypeError) as exc:
        log.error("unreadable bundle answer (%s): %r", exc, content[:300])
        bad = problem(502, "bad-gateway", "Bad gateway", "the service's answer was unreadable",
                      1, Outcome.BAD_UPSTREAM)  # fmt: skip
        return [bad] * n


def _answer(item: dict[str, Any]) -> Answer:
    status = item.get("status")
    if status is None:
        return Answer(200, orjson.dumps(item))
    body = {k: item[k] for k in _PROBLEM_FIELDS if k in item}
    retry = item.get("retry_after_s")
    return Answer(int(status), orjson.dumps(body), PROBLEM, retry, Outcome.REFUSED)
