"""The ``slurm`` actuator: drain the culprit node and requeue the job with ``scontrol``.

``isolate`` -> ``scontrol update nodename=<host> state=drain reason="failslow: ..."``; the
fleet's ``drain`` hint (a host unfit for future jobs, docs/fleet.md) -> the same command;
``restart`` -> ``scontrol requeue <slurm job id>`` (the job id is the action's job unless
``params.slurm_job_id`` says otherwise). Other kinds are logged only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Any

from failslow.service.actions.actuators.base import ActionRequest, ActuatorError


class SlurmActuator:
    name = "slurm"

    def __init__(
        self, *, scontrol: str = "scontrol", conf: str | None = None, timeout_s: float = 30.0
    ) -> None:
        """``conf``: the cluster's slurm.conf when it is not the default (``SLURM_CONF``)."""
        self.scontrol, self.timeout_s = scontrol, timeout_s
        self.env = {**os.environ, "SLURM_CONF": conf} if conf else None

    def commands(self, request: ActionRequest) -> list[list[str]]:
        if request.kind in ("isolate", "drain"):
            host = request.params.get("host") or request.target.removeprefix("host:")
            reason = f"failslow {request.id}: {request.reason}"[:200]
            return [
                [self.scontrol, "update", f"nodename={host}", "state=drain", f"reason={reason}"]
            ]
        if request.kind == "restart":
            job = str(request.params.get("slurm_job_id") or request.job)
            return [[self.scontrol, "requeue", job]]
        return []

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        cmds = self.commands(request)
        if request.dry_run or not cmds:
            return {"commands": [shlex.join(c) for c in cmds], "ran": False}
        ran = []
        for cmd in cmds:
            try:
                p = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    timeout=self.timeout_s,
                    check=False,
                    env=self.env,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise ActuatorError(f"{shlex.join(cmd)}: {exc}") from exc
            if p.returncode != 0:
                raise ActuatorError(
                    f"{shlex.join(cmd)} exited {p.returncode}: {(p.stderr or p.stdout).strip()}"
                )
            ran.append(shlex.join(cmd))
        return {"commands": ran, "ran": True}
