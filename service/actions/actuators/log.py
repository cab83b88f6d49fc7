"""The ``log`` actuator: writes the action to the service log (on by default, no effect)."""

from __future__ import annotations

import logging
from typing import Any

from failslow.service.actions.actuators.base import ActionRequest

log = logging.getLogger("failslow.actions")


class LogActuator:
    name = "log"

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        prefix = "[dry-run] " if request.dry_run else ""
        log.warning(
            "%sACTION %s %s %s on job %s: %s",
            prefix,
            request.id,
            request.kind,
            request.target,
            request.job,
            request.reason,
        )
        return {"logged": True}
