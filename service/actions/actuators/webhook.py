"""The ``webhook`` actuator: an HMAC-SHA256-signed JSON POST, retried with backoff.

The receiver checks ``X-Failslow-Signature: sha256=<hex>``, the HMAC of the exact body bytes
with the shared secret, and may de-duplicate on ``X-Failslow-Delivery`` (the action id).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any

import httpx
import orjson

from failslow.service.actions.actuators.base import ActionRequest, ActuatorError


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookActuator:
    name = "webhook"

    def __init__(self, *, url: str, secret: str, timeout_s: float = 5.0, attempts: int = 3) -> None:
        if not url:
            raise ValueError("the webhook actuator needs actions.webhook_url")
        if not secret:
            raise ValueError("the webhook actuator needs actions.webhook_secret")
        self.url, self.secret, self.timeout_s, self.attempts = url, secret, timeout_s, attempts

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        body = orjson.dumps(
            {
                "action": request.id,
                "job": request.job,
                "incident": request.incident,
                "kind": request.kind,
                "target": request.target,
                "reason": request.reason,
                "params": request.params,
                "dry_run": request.dry_run,
            }
        )
        headers = {
            "Content-Type": "application/json",
            "X-Failslow-Signature": sign(self.secret, body),
            "X-Failslow-Delivery": request.id,
        }
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                r = httpx.post(self.url, content=body, headers=headers, timeout=self.timeout_s)
                if r.status_code < 300:
                    return {"status": r.status_code, "attempts": attempt}
                last = f"HTTP {r.status_code}"
                if r.status_code < 500 and r.status_code != 429:
                    break  # the receiver refuses it: retrying will not help
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            if attempt < self.attempts:
                time.sleep(min(0.2 * 2 ** (attempt - 1), 2.0))
        raise ActuatorError(f"webhook {self.url} failed after {attempt} attempt(s): {last}")
