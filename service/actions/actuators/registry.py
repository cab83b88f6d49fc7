"""Building the enabled actuators from settings (optional ones are imported only when on)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from failslow.service.actions.actuators.base import ActionRequest, Actuator
from failslow.service.actions.actuators.log import LogActuator
from failslow.service.actions.actuators.plan import PlanActuator
from failslow.service.actions.settings import ActionsSettings


def build_actuators(
    settings: ActionsSettings, publish: Callable[[ActionRequest], dict[str, Any]]
) -> dict[str, Actuator]:
    out: dict[str, Actuator] = {}
    for name in settings.actuators:
        if name == "log":
            out[name] = LogActuator()
        elif name == "plan":
            out[name] = PlanActuator(publish=publish)
        elif name == "webhook":
            from failslow.service.actions.actuators.webhook import WebhookActuator

            out[name] = WebhookActuator(url=settings.webhook_url, secret=settings.webhook_secret)
        elif name == "kubernetes":
            from failslow.service.actions.actuators.kubernetes import KubernetesActuator

            out[name] = KubernetesActuator(
                namespace=settings.kubernetes_namespace,
                job_label=settings.kubernetes_job_label,
                host=settings.kubernetes_host or None,
                in_cluster=settings.kubernetes_in_cluster,
            )
        elif name == "slurm":
            from failslow.service.actions.actuators.slurm import SlurmActuator

            out[name] = SlurmActuator(
                scontrol=settings.slurm_scontrol, conf=settings.slurm_conf or None
            )
    return out
