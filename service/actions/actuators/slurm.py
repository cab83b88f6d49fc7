"""The ``slurm`` actuator: drain the culprit node and requeue the job with ``scontrol``.

``isolate`` -> ``scontrol update nodename=<host> state=drain reason="failslow: ..."``; the
fleet's ``drain`` hint (a host unfit for future jobs, docs/fleet.md) -> the same command;
``restart`` -> ``scontrol requeue <slurm job id>`` (the job id is the action's job unless
``params.slurm_job_id`` says otherwise); ``undrain`` (a part returned from repair) ->
``scontrol update nodename=<host> state=resume``, only when the node is drained by failslow (its
reason starts with ``failslow``): a node an administrator drained for something else stays
drained and the action fails saying so. Other kinds are logged only.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from typing import Any

from failslow.service.actions.actuators.base import ActionRequest, ActuatorError
from failslow.service.actions.vocab import ActionKind

OURS = "failslow"  # the start of the reason of every drain failslow makes


class SlurmActuator:
    name = "slurm"

    def __init__(
        self, *, scontrol: str = "scontrol", conf: str | None = None, timeout_s: float = 30.0
    ) -> None:
        """``conf``: the cluster's slurm.conf when it is not the default (``SLURM_CONF``)."""
        self.scontrol, self.timeout_s = scontrol, timeout_s
        self.env = {**os.environ, "SLURM_CONF": conf} if conf else None

    def commands(self, request: ActionRequest) -> list[list[str]]:
        host = str(request.params.get("host") or request.target.removeprefix("host:"))
        if request.kind in (ActionKind.ISOLATE, ActionKind.DRAIN):
            reason = f"{OURS} {request.id}: {request.reason}"[:200]
            return [
                [self.scontrol, "update", f"nodename={host}", "state=drain", f"reason={reason}"]
            ]
        if request.kind == ActionKind.UNDRAIN:
            return [[self.scontrol, "update", f"nodename={host}", "state=resume"]]
        if request.kind == ActionKind.RESTART:
            job = str(request.params.get("slurm_job_id") or request.job)
            return [[self.scontrol, "requeue", job]]
        return []

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        cmds = self.commands(request)
        if request.dry_run or not cmds:
            return {"commands": [shlex.join(c) for c in cmds], "ran": False}
        if request.kind == ActionKind.UNDRAIN:
            host = cmds[0][2].removeprefix("nodename=")
            state, reason = self._drained(host)
            if "DRAIN" not in state:
                return {"commands": [], "ran": False, "note": f"{host} is not drained ({state})"}
            if not reason.startswith(OURS):
                raise ActuatorError(f"{host} was drained by someone else (reason: {reason or '-'})"
                                    ": left drained")  # fmt: skip
        for cmd in cmds:
            self._run(cmd)
        return {"commands": [shlex.join(c) for c in cmds], "ran": True}

    def _drained(self, host: str) -> tuple[str, str]:
        """The node's state and drain reason (``scontrol show node``)."""
        text = self._run([self.scontrol, "show", "node", host])
        state = reason = ""
        for line in text.splitlines():
            for field in line.strip().split(" "):
                if field.startswith("State="):
                    state = field.removeprefix("State=")
            if line.strip().startswith("Reason="):  # the rest of the line: it holds spaces
                reason = line.strip().removeprefix("Reason=")
        return state, reason

    def _run(self, cmd: list[str]) -> str:
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s,
                               check=False, env=self.env)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ActuatorError(f"{shlex.join(cmd)}: {exc}") from exc
        if p.returncode != 0:
            raise ActuatorError(
                f"{shlex.join(cmd)} exited {p.returncode}: {(p.stderr or p.stdout).strip()}"
            )
        return p.stdout
