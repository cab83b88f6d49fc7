"""HTTP delivery of envelopes with retries: exponential backoff with full jitter, 429 aware."""

from __future__ import annotations

import email.utils
import json
import random
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

RETRYABLE = {408, 425, 429, 500, 502, 503, 504}
# Only these mean "this envelope is invalid and never will be": it goes to outbox/dead.
INVALID = {400, 413, 415, 422}
AUTH = {401, 403}  # a rotated or mistyped token: retried (and alarmed), never discarded


@dataclass(slots=True)
class Backoff:
    """Full-jitter exponential backoff (AWS architecture blog): sleep U(0, min(cap, base*2^n))."""

    base_s: float = 0.25
    cap_s: float = 30.0
    attempt: int = 0
    rng: random.Random | None = None

    def next(self) -> float:
        # The exponent stops growing once the cap is reached: 2**n as a float overflows after
        # ~1,024 attempts (hours of outage at a 30 s cap), which killed the sender thread.
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(self.attempt, 60))
        self.attempt += 1
        return (self.rng or random).uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0


def retry_after(value: str | None, *, cap_s: float = 300.0) -> float | None:
    """Seconds from a Retry-After header (delta-seconds or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), cap_s)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, min(when.timestamp() - time.time(), cap_s))


@dataclass(frozen=True, slots=True)
class Delivery:
    """Outcome of one POST: ``ok`` (stored), ``retry`` (try later), ``auth`` (the service does
    not accept our token: try later, raise the alarm), ``refused`` (invalid: never retry)."""

    outcome: str
    status: int | None
    body: dict[str, Any] | None
    wait_s: float | None = None
    error: str | None = None


V2_MEDIA_TYPE = "application/vnd.failslow.v2"
UNKNOWN_TOPOLOGY = "unknown-topology"


class Sender:
    def __init__(self, service: str, *, token: str | None = None, timeout_s: float = 10.0) -> None:
        headers = {"Content-Type": "application/json", "User-Agent": "failslow-agent/1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base = service.rstrip("/")
        self.url = self.base + "/v1/ingest"
        self.client = httpx.Client(headers=headers, timeout=timeout_s)

    def post(self, payload: bytes, *, gzipped: bool = True, v2: bool = False) -> Delivery:
        """One envelope; ``v2``: a binary v2 body (``unknown-topology`` when the service does
        not know the topology it names: register it and send again)."""
        headers = {"Content-Encoding": "gzip"} if gzipped else {}
        url = self.url
        if v2:
            headers["Content-Type"] = V2_MEDIA_TYPE
            url = self.base + "/v2/ingest"
        return self._send("POST", url, payload, headers)

    def register(self, job: str, host: str, registration: dict[str, Any]) -> Delivery:
        """Register a host's topology for v2 envelopes."""
        url = f"{self.base}/v2/jobs/{job}/topology/{host}"
        return self._send("PUT", url, json.dumps(registration).encode(), {})

    def put_hardware(self, host: str, body: bytes) -> Delivery:
        """This node's hardware inventory, for the fleet ledger (agents/hardware.py)."""
        url = f"{self.base}/v1/fleet/hosts/{quote(host, safe='')}/hardware"
        return self._send("PUT", url, body, {})

    def _send(self, method: str, url: str, payload: bytes, headers: dict[str, str]) -> Delivery:
        try:
            resp = self.client.request(method, url, content=payload, headers=headers)
        except httpx.HTTPError as exc:
            return Delivery("retry", None, None, error=f"{type(exc).__name__}: {exc}")
        body: dict[str, Any] | None
        try:
            body = resp.json()
        except ValueError:
            body = None
        if resp.status_code == 200:
            return Delivery("ok", 200, body)
        if resp.status_code == 409 and str((body or {}).get("type", "")).endswith(UNKNOWN_TOPOLOGY):
            return Delivery(UNKNOWN_TOPOLOGY, 409, body, error=(body or {}).get("detail"))
        detail = (body or {}).get("detail") if isinstance(body, dict) else None
        if resp.status_code in INVALID:
            return Delivery("refused", resp.status_code, body, error=detail)
        if resp.status_code in AUTH:
            return Delivery("auth", resp.status_code, body, error=detail)
        # 5xx, 429 and anything unexpected (a 404 from a wrong URL or a proxy): try again later
        return Delivery(
            "retry", resp.status_code, body, wait_s=retry_after(resp.headers.get("retry-after")),
            error=detail,
        )  # fmt: skip

    def close(self) -> None:
        self.client.close()
