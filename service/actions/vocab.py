"""The mitigation policy's vocabulary: kinds of action, their states, approval modes, actuators."""

from __future__ import annotations

from enum import StrEnum


class ActionKind(StrEnum):
    """The rungs of the mitigation ladder."""

    NOTIFY = "notify"
    REBALANCE = "rebalance"  # move micro-batches away from a slow GPU or node
    REPLAN = "replan"  # re-order rings around a slow link
    ISOLATE = "isolate"  # exclude a host
    RESTART = "restart"  # checkpoint-restart the job
    DRAIN = "drain"  # a fleet hint: keep a host out of future jobs (Slurm drain, K8s cordon+taint)
    # a part returned from repair: its host back in service (Slurm resume, K8s uncordon and
    # untaint), only where failslow drained it
    UNDRAIN = "undrain"


class ActionState(StrEnum):
    PROPOSED = "proposed"  # waiting for an operator
    APPROVED = "approved"  # waiting to be executed
    EXECUTING = "executing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"


PENDING = (ActionState.PROPOSED, ActionState.APPROVED, ActionState.EXECUTING)
FINAL = (ActionState.SUCCEEDED, ActionState.FAILED, ActionState.REJECTED)
MEASURED = (ActionKind.REBALANCE, ActionKind.REPLAN, ActionKind.RESTART)  # outcomes are scored


class Approval(StrEnum):
    AUTO = "auto"  # executed at once
    MANUAL = "manual"  # waits for an operator


class ActuatorName(StrEnum):
    LOG = "log"
    PLAN = "plan"
    WEBHOOK = "webhook"
    KUBERNETES = "kubernetes"
    SLURM = "slurm"
