"""The ``kubernetes`` actuator: cordon the culprit node and evict the job's pods on it.

Uses the official ``kubernetes`` client (optional extra ``failslow[kubernetes]``): ``isolate``
patches ``spec.unschedulable=true`` on the node, then evicts (policy/v1 Eviction) every pod of
the job on that node, found by the label ``<job_label>=<job>``; ``restart`` deletes all the
job's pods so that its controller (JobSet, PyTorchJob, ...) recreates them from the checkpoint
without the cordoned node; the fleet's ``drain`` hint cordons the node and taints it
``failslow.dev/unfit=<part>:NoSchedule`` (running pods stay: it keeps future work off);
``undrain`` (a part returned from repair) removes that taint and uncordons the node, only where
failslow's taint is on it: a node cordoned by someone else stays cordoned and the action fails
saying so. Other kinds are no-ops.
"""

from __future__ import annotations

from typing import Any

from failslow.service.actions.actuators.base import ActionRequest, ActuatorError
from failslow.service.actions.vocab import ActionKind

TAINT = "failslow.dev/unfit"


def taint_value(request: ActionRequest) -> str:
    """A label value (63 characters of [A-Za-z0-9._-]) naming the part the hint is for."""
    part = str(request.params.get("part") or request.target)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in part)
    return safe[:63].strip("._-") or "unfit"


def others(spec: Any) -> list[dict[str, str]]:
    """A node spec's taints other than failslow's, as a patch writes them."""
    current = (spec.taints if spec is not None else None) or []
    return [{"key": t.key, "value": t.value, "effect": t.effect} for t in current
            if t.key != TAINT]  # fmt: skip


class KubernetesActuator:
    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "default",
        job_label: str = "failslow.dev/job",
        kubeconfig: str | None = None,
        host: str | None = None,
        in_cluster: bool = False,
    ) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ValueError(
                "the kubernetes actuator needs the extra: pip install 'failslow[kubernetes]'"
            ) from exc
        if host:
            cfg = client.Configuration()
            cfg.host = host
            api_client = client.ApiClient(cfg)
        elif in_cluster:
            config.load_incluster_config()
            api_client = client.ApiClient()
        else:
            api_client = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(api_client)
        self.client = client
        self.namespace, self.job_label = namespace, job_label

    def _pods(self, job: str, node: str | None) -> list[Any]:
        kwargs: dict[str, Any] = {"label_selector": f"{self.job_label}={job}"}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        return list(self.core.list_namespaced_pod(self.namespace, **kwargs).items)

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        from kubernetes.client.rest import ApiException

        try:
            if request.kind == ActionKind.ISOLATE:
                node = str(request.params.get("host") or request.target.removeprefix("host:"))
                pods = [p.metadata.name for p in self._pods(request.job, node)]
                if request.dry_run:
                    return {"cordon": node, "evict": pods, "ran": False}
                self.core.patch_node(node, {"spec": {"unschedulable": True}})
                for name in pods:
                    body = self.client.V1Eviction(
                        metadata=self.client.V1ObjectMeta(name=name, namespace=self.namespace)
                    )
                    self.core.create_namespaced_pod_eviction(name, self.namespace, body)
                return {"cordoned": node, "evicted": pods, "ran": True}
            if request.kind == ActionKind.DRAIN:
                node = str(request.params.get("host") or request.target.removeprefix("host:"))
                taint = {"key": TAINT, "value": taint_value(request), "effect": "NoSchedule"}
                if request.dry_run:
                    return {"cordon": node, "taint": taint, "ran": False}
                spec = self.core.read_node(node).spec
                kept = others(spec)
                self.core.patch_node(node, {"spec": {"unschedulable": True,
                                                     "taints": [*kept, taint]}})  # fmt: skip
                return {"cordoned": node, "tainted": taint, "ran": True}
            if request.kind == ActionKind.UNDRAIN:
                return self._undrain(request)
            if request.kind == ActionKind.RESTART:
                pods = [p.metadata.name for p in self._pods(request.job, None)]
                if request.dry_run:
                    return {"delete": pods, "ran": False}
                for name in pods:
                    self.core.delete_namespaced_pod(name, self.namespace)
                return {"deleted": pods, "ran": True}
        except ApiException as exc:
            raise ActuatorError(f"kubernetes API {exc.status}: {exc.reason}") from exc
        return {"ran": False, "note": f"nothing to do for {request.kind}"}

    def _undrain(self, request: ActionRequest) -> dict[str, Any]:
        node = str(request.params.get("host") or request.target.removeprefix("host:"))
        spec = self.core.read_node(node).spec
        current = (spec.taints if spec is not None else None) or []
        ours = [t for t in current if t.key == TAINT]
        if not ours:
            if spec is not None and spec.unschedulable:
                raise ActuatorError(f"{node} was cordoned by someone else (no {TAINT} taint): "
                                    "left cordoned")  # fmt: skip
            return {"ran": False, "note": f"{node} is not cordoned"}
        kept = others(spec)
        if request.dry_run:
            return {"uncordon": node, "untaint": TAINT, "ran": False}
        self.core.patch_node(node, {"spec": {"unschedulable": False, "taints": kept}})
        return {"uncordoned": node, "untainted": TAINT, "ran": True}
