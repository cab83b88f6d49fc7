"""The ``plan`` actuator: publishes a new version of the job's plan for the training job to apply.

It has no effect outside failslow (jobs opt in by polling ``GET /v1/jobs/{job}/plan``), which is
why it is on by default next to ``log``. Publishing is keyed by the action id, so an action that
is executed again publishes nothing new.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from failslow.service.actions.actuators.base import ActionRequest

Publish = Callable[[ActionRequest], dict[str, Any]]


class PlanActuator:
    name = "plan"

    def __init__(self, *, publish: Publish) -> None:
        self.publish = publish

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        if request.dry_run:
            return {"would_publish": request.params, "ran": False}
        return self.publish(request)
