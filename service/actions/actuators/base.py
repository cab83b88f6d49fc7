"""The actuator interface and the runner that isolates its failures and bounds its time."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """What an actuator is asked to do (a copy of the persisted action)."""

    id: str
    job: str
    incident: str | None
    kind: str
    target: str
    reason: str
    params: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False


class ActuatorError(Exception):
    """An actuator could not carry out its action (the message goes into the action's result)."""


class Actuator(Protocol):
    name: str

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        """Carry the action out (or, with ``request.dry_run``, say what would be done).

        Returns a JSON-able result; raises on failure. Must be safe to call from a worker thread.
        """
        ...


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    result: dict[str, Any]


_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="actuator")


def run(actuator: Actuator, request: ActionRequest, *, timeout_s: float) -> Outcome:
    """Run one actuator with a deadline; any exception or timeout becomes a failed outcome."""
    started = time.monotonic()
    future = _POOL.submit(actuator.execute, request)
    try:
        result = future.result(timeout=timeout_s)
    except concurrent.futures.TimeoutError:
        # the worker thread cannot be killed; it is left to finish and its result is discarded
        return Outcome(
            False, {"error": f"{actuator.name} timed out after {timeout_s:.0f} s", "timeout": True}
        )
    except Exception as exc:  # noqa: BLE001 - an actuator's failure must not escape
        log.warning("actuator %s failed for %s: %s", actuator.name, request.id, exc)
        return Outcome(False, {"error": f"{type(exc).__name__}: {exc}"})
    out = dict(result or {})
    out.setdefault("seconds", round(time.monotonic() - started, 3))
    if request.dry_run:
        out["dry_run"] = True
    return Outcome(True, out)
