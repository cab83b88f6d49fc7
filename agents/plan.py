"""``PlanClient``: how a training loop follows the plan failslow publishes.

The loop calls :meth:`PlanClient.poll` at a step boundary (a conditional GET: one small request,
answered ``304 Not Modified`` while nothing changed) or runs :meth:`PlanClient.start` to poll in
a background thread and calls :meth:`PlanClient.take` at each step boundary. Either way the new
plan is applied between steps, never in the middle of one. Like the SDK, it never raises into
the training loop: failures are logged and counted, and the last good plan stays in force.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Plan:
    version: int = 0
    microbatch_shares: tuple[int, ...] | None = None
    excluded_hosts: tuple[str, ...] = ()
    excluded_ranks: tuple[int, ...] = ()
    rank_order: dict[str, tuple[int, ...]] = field(default_factory=dict)
    restart_epoch: int = 0
    reason: str = ""

    @staticmethod
    def from_json(d: dict[str, Any]) -> Plan:
        shares = d.get("microbatch_shares")
        return Plan(
            version=int(d["version"]),
            microbatch_shares=tuple(int(x) for x in shares) if shares else None,
            excluded_hosts=tuple(d.get("excluded_hosts") or ()),
            excluded_ranks=tuple(int(x) for x in d.get("excluded_ranks") or ()),
            rank_order={k: tuple(v) for k, v in (d.get("rank_order") or {}).items()},
            restart_epoch=int(d.get("restart_epoch") or 0),
            reason=str(d.get("reason") or ""),
        )

    def microbatches(self, dp_rank: int, default: int) -> int:
        """This data-parallel rank's micro-batches per step under the plan."""
        if self.microbatch_shares is None or dp_rank >= len(self.microbatch_shares):
            return default
        return self.microbatch_shares[dp_rank]


class PlanClient:
    def __init__(
        self,
        service: str,
        job: str,
        *,
        token: str | None = None,
        global_batch: int | None = None,
        timeout_s: float = 2.0,
        on_change: Callable[[Plan], None] | None = None,
        client: httpx.Client | None = None,
    ) -> None:
        """``client``: an existing HTTP client whose base URL is the service (tests, tools)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._own = client is None
        self.http = client or httpx.Client(
            base_url=service.rstrip("/"), headers=headers, timeout=timeout_s
        )
        self.job = job
        self.global_batch = global_batch
        self.on_change = on_change
        self.current = Plan()
        self.etag: str | None = None
        self.errors = 0
        self.declared = global_batch is None
        self._pending: Plan | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the workload ------------------------------------------------------------------------------
    def declare(self) -> bool:
        """Tell the service the global batch (retried at every poll until it is known)."""
        if self.declared or self.global_batch is None:
            return True
        try:
            r = self.http.put(
                f"/v1/jobs/{self.job}/workload", json={"global_batch": self.global_batch}
            )
        except httpx.HTTPError as exc:
            log.debug("failslow: declaring the workload failed: %s", exc)
            return False
        self.declared = r.status_code == 200
        return self.declared

    # -- polling ---------------------------------------------------------------------------------
    def poll(self) -> Plan | None:
        """The new plan if it changed since the last poll, else None. Never raises."""
        self.declare()
        headers = {"If-None-Match": self.etag} if self.etag else {}
        try:
            r = self.http.get(f"/v1/jobs/{self.job}/plan", headers=headers)
        except httpx.HTTPError as exc:
            self.errors += 1
            log.debug("failslow: plan poll failed: %s", exc)
            return None
        if r.status_code == 304:
            return None
        if r.status_code != 200:
            self.errors += 1
            if r.status_code != 404:  # 404: the job has not reported yet
                log.warning("failslow: plan poll got HTTP %s", r.status_code)
            return None
        try:
            plan = Plan.from_json(r.json())
        except (ValueError, KeyError, TypeError) as exc:
            self.errors += 1
            log.warning("failslow: malformed plan ignored: %s", exc)
            return None
        self.etag = r.headers.get("ETag")
        if plan.version == self.current.version:
            return None
        self.current = plan
        if self.on_change is not None:
            try:
                self.on_change(plan)
            except Exception:  # noqa: BLE001 - the callback is the user's; keep polling
                log.exception("failslow: plan callback failed")
        return plan

    def ack(self, plan: Plan, step: int) -> bool:
        """Tell the service the job runs ``plan`` from ``step`` on (call it when applying it):
        detectors then judge each rank by its new share from exactly that step. Never raises."""
        try:
            r = self.http.post(
                f"/v1/jobs/{self.job}/plan/ack", json={"version": plan.version, "step": step}
            )
        except httpx.HTTPError as exc:
            self.errors += 1
            log.debug("failslow: plan acknowledgement failed: %s", exc)
            return False
        if r.status_code != 200:
            self.errors += 1
            log.warning("failslow: plan acknowledgement got HTTP %s", r.status_code)
        return r.status_code == 200

    # -- background ------------------------------------------------------------------------------
    def start(self, interval_s: float = 5.0) -> PlanClient:
        """Poll in a daemon thread; the loop picks the newest plan up with :meth:`take`."""

        def loop() -> None:
            while not self._stop.wait(interval_s):
                plan = self.poll()
                if plan is not None:
                    with self._lock:
                        self._pending = plan

        self._thread = threading.Thread(target=loop, name="failslow-plan", daemon=True)
        self._thread.start()
        return self

    def take(self) -> Plan | None:
        """At a step boundary: the plan that arrived since the last call, if any."""
        with self._lock:
            plan, self._pending = self._pending, None
        return plan

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._own:
            self.http.close()

    def __enter__(self) -> PlanClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
