"""Mitigation settings (``FAILSLOW_ACTIONS__*``): costs, budgets, approvals, actuators."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from failslow.detectors.vocab import Severity
from failslow.service.actions.vocab import ActionKind, ActuatorName, Approval


class ActionsSettings(BaseModel):
    """Mitigation: the policy's costs and budgets, approval modes and actuators."""

    enabled: bool = Field(default=True, description="Run the policy on open incidents.")
    actuators: list[str] = Field(
        default_factory=lambda: [ActuatorName.LOG, ActuatorName.PLAN],
        description="Actuators switched on. `log` and `plan` have no effect outside failslow.",
    )
    actuator_for: dict[str, str] = Field(
        default_factory=lambda: {
            ActionKind.NOTIFY: ActuatorName.LOG,
            ActionKind.REBALANCE: ActuatorName.PLAN,
            ActionKind.REPLAN: ActuatorName.PLAN,
            ActionKind.ISOLATE: ActuatorName.LOG,
            ActionKind.RESTART: ActuatorName.LOG,
            ActionKind.DRAIN: ActuatorName.LOG,
            ActionKind.UNDRAIN: ActuatorName.LOG,
        },
        description="Which actuator carries out each action kind (JSON in the environment).",
    )
    approval: dict[str, str] = Field(
        default_factory=lambda: {
            ActionKind.NOTIFY: Approval.AUTO,
            ActionKind.REBALANCE: Approval.AUTO,
            ActionKind.REPLAN: Approval.AUTO,
            ActionKind.ISOLATE: Approval.MANUAL,
            ActionKind.RESTART: Approval.MANUAL,
            ActionKind.DRAIN: Approval.MANUAL,
            ActionKind.UNDRAIN: Approval.MANUAL,
        },
        description="`auto` executes at once; `manual` waits for an operator's approval.",
    )
    dry_run: bool = Field(default=False, description="Actuators only say what they would do.")
    timeout_s: float = Field(default=30.0, gt=0, description="Deadline of one actuator call.")
    costs_s: dict[str, float] = Field(
        default_factory=lambda: {
            ActionKind.NOTIFY: 0.0,
            ActionKind.REBALANCE: 5.0,
            ActionKind.REPLAN: 30.0,
            ActionKind.ISOLATE: 0.0,
            ActionKind.RESTART: 600.0,
        },
        description="Default cost of each action in seconds of job time, until outcomes teach "
        "better ones (ski rental: act once the time lost reaches the cost).",
    )
    max_isolations_per_hour: int = Field(default=2, ge=0, description="Per job.")
    min_world_size: int = Field(default=1, ge=1, description="Never isolate below this many ranks.")
    cooldown_s: float = Field(default=600.0, ge=0, description="Per target, between actions.")
    act_from: Severity = Field(
        default=Severity.MAJOR,
        description="Least incident severity the policy acts on; less severe incidents are only "
        "notified (severity: FAILSLOW_DETECTION__MAJOR_SLOWDOWN, __CRITICAL_SLOWDOWN).",
    )
    min_gain: float = Field(
        default=0.05, ge=0, le=1, description="Least predicted recovery for rebalance."
    )
    outcome_steps: int = Field(
        default=10,
        ge=2,
        description="Steps after an executed action before its outcome is measured.",
    )
    plan_ack_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A plan with new shares the job has not acknowledged (POST .../plan/ack) "
        "within this many seconds is assumed applied.",
    )
    outcome_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="Event time after which an action whose job made no progress is recorded "
        "as having recovered nothing.",
    )
    webhook_url: str = Field(default="", description="Receiver of the `webhook` actuator.")
    webhook_secret: str = Field(default="", description="HMAC-SHA256 key of webhook bodies.")
    kubernetes_namespace: str = Field(default="default", description="Namespace of job pods.")
    kubernetes_job_label: str = Field(
        default="failslow.dev/job", description="Pod label whose value is the failslow job id."
    )
    kubernetes_host: str = Field(default="", description="API server URL (else kubeconfig).")
    kubernetes_in_cluster: bool = Field(default=False, description="Use the pod's account.")
    slurm_scontrol: str = Field(default="scontrol", description="Path of `scontrol`.")
    slurm_conf: str = Field(default="", description="slurm.conf path (else Slurm's default).")

    @model_validator(mode="after")
    def _check(self) -> ActionsSettings:
        actuators = tuple(ActuatorName)
        for name in self.actuators:
            if name not in actuators:
                raise ValueError(f"unknown actuator {name!r}; one of {actuators}")
        for kind, name in self.actuator_for.items():
            if kind not in ActionKind.__members__.values():
                raise ValueError(f"unknown action kind {kind!r} in actuator_for")
            if name not in actuators:
                raise ValueError(f"unknown actuator {name!r} for {kind}")
        for kind, mode in self.approval.items():
            if kind not in ActionKind.__members__.values() or mode not in tuple(Approval):
                raise ValueError(f"approval[{kind!r}] must be auto or manual")
        if ActuatorName.WEBHOOK in self.actuators and not (
            self.webhook_url and self.webhook_secret
        ):
            raise ValueError("the webhook actuator needs actions.webhook_url and webhook_secret")
        return self
