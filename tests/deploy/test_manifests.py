"""Static checks of the deployment files (the chart is rendered by helm in test_helm.py): the
compose file parses and everything it mounts exists; every `.Values.x.y` the Helm templates use
is defined in values.yaml; the Dockerfile is multi-stage, non-root and health-checked; the systemd
units, Slurm prolog/epilog and Grafana provisioning are well-formed and point at real files."""

from __future__ import annotations

import argparse
import configparser
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from failslow.relay.cli import register as register_relay

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def test_compose_parses_and_mounts_existing_files() -> None:
    path = DEPLOY / "docker" / "compose.yml"
    doc = yaml.safe_load(path.read_text())
    assert set(doc["services"]) == {
        "postgres", "nats", "failslow", "failslow-2", "relay", "prometheus", "grafana"
    }
    for name, svc in doc["services"].items():
        assert "image" in svc or "build" in svc, name
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (path.parent / src).resolve().exists(), (name, src)
    build = (path.parent / doc["services"]["failslow"]["build"]["context"]).resolve()
    assert (build / "Dockerfile").exists()
    for replica in ("failslow", "failslow-2"):  # two replicas on one database and one bus
        env = doc["services"][replica]["environment"]
        assert env["FAILSLOW_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert env["FAILSLOW_BUS__URL"] == "nats://nats:4222"
    # the relay: the failslow image's `failslow relay`, in front of a replica, on its own port
    relay = doc["services"]["relay"]
    assert relay["image"] == doc["services"]["failslow"]["image"]
    parser = argparse.ArgumentParser()
    register_relay(parser.add_subparsers())
    args = parser.parse_args(relay["command"])
    assert args.upstream == "http://failslow:8000" and args.host == "0.0.0.0"
    assert relay["ports"] == [f"${{FAILSLOW_RELAY_PORT:-{args.port}}}:{args.port}"]
    assert f":{args.port}/relayz" in " ".join(relay["healthcheck"]["test"])
    assert relay["depends_on"]["failslow"]["condition"] == "service_healthy"


def _keys(d: object, prefix: str = "") -> set[str]:
    out = set()
    if isinstance(d, dict):
        for k, v in d.items():
            out.add(prefix + k)
            out |= _keys(v, prefix + k + ".")
    return out


def test_helm_templates_use_only_defined_values() -> None:
    chart = DEPLOY / "helm" / "failslow"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["apiVersion"] == "v2"
    values = _keys(yaml.safe_load((chart / "values.yaml").read_text()))
    used = set()
    for t in (chart / "templates").glob("*"):
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", t.read_text()))
    assert used and used <= values, used - values
    kinds = {
        m
        for t in (chart / "templates").glob("*.yaml")
        for m in re.findall(r"^kind: (\w+)", t.read_text(), flags=re.M)
    }
    assert kinds == {
        "Deployment", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "Secret",
        "StatefulSet", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "PodDisruptionBudget", "ConfigMap",
    }  # fmt: skip
    rules = chart / "files" / "failslow-rules.yml"
    assert rules.read_text() == (DEPLOY / "prometheus" / "failslow-rules.yml").read_text()
    # the training job is `training_job`: kube-prometheus' default scrape (no honorLabels) works
    assert "honorLabels: true" not in (chart / "templates" / "servicemonitor.yaml").read_text()


def test_dockerfile_is_multistage_nonroot_and_healthchecked() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert len(re.findall(r"^FROM ", text, flags=re.M)) == 2
    assert re.search(r"^USER failslow$", text, flags=re.M)
    assert "HEALTHCHECK" in text and "/readyz" in text


def test_dockerfile_copies_every_package() -> None:
    """The image's wheel is built from the folders the Dockerfile copies: each package folder
    of pyproject.toml must be among them (a missing one fails the image build)."""
    folders = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
                  ["package-dir"].values())  # fmt: skip
    copied = set(re.findall(r"^COPY (\w+) \1$", (ROOT / "Dockerfile").read_text(), flags=re.M))
    assert folders <= copied, folders - copied
    # .dockerignore admits only what it names: a folder copied but not admitted is "not found in
    # build context" (relay/ was, until `make stack-smoke` built the image for real)
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert "*" in ignore
    admitted = {line[1:] for line in ignore if line.startswith("!")}
    assert copied <= admitted, copied - admitted


@pytest.mark.parametrize("unit", ["failslow.service", "failslow-agent.service"])
def test_systemd_units(unit: str) -> None:
    cp = configparser.ConfigParser(strict=True, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read(DEPLOY / "systemd" / unit)
    assert cp["Service"]["ExecStart"].startswith("/usr/local/bin/failslow ")
    assert cp["Service"]["User"] == "failslow" and cp["Install"]["WantedBy"]


@pytest.mark.parametrize("script", ["prolog.sh", "epilog.sh"])
def test_slurm_scripts_parse(script: str) -> None:
    path = DEPLOY / "slurm" / script
    assert subprocess.run(["sh", "-n", str(path)], check=False).returncode == 0
    assert path.stat().st_mode & 0o111


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/failslow.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"  # what $datasource picks up
    for f in (DEPLOY / "grafana" / "dashboards").glob("*.json"):
        d = json.loads(f.read_text())
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)) and d["uid"]
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        for p in d["panels"]:  # no fixed data source uid: the installed Grafana's is used
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], p["title"]
        if f.stem == "job":  # the per-job dashboard is filtered by its job throughout
            for p in d["panels"]:
                for t in p["targets"]:
                    assert 'training_job="$training_job"' in t["expr"], (p["title"], t["expr"])


@pytest.mark.skipif(
    shutil.which("docker-compose") is None,
    reason="docker-compose not installed (Debian: apt-get install docker-compose)",
)
def test_docker_compose_accepts_the_compose_file() -> None:
    path = DEPLOY / "docker" / "compose.yml"
    env = {"PATH": "/usr/bin:/bin", "FAILSLOW_TOKEN": "t0ken"}
    p = subprocess.run(
        ["docker-compose", "-f", str(path), "config"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    rendered = yaml.safe_load(p.stdout)
    for replica in ("failslow", "failslow-2"):
        env = rendered["services"][replica]["environment"]
        assert env["FAILSLOW_AUTH__INGEST_TOKENS"] == "t0ken"
        assert env["FAILSLOW_BUS__URL"] == "nats://nats:4222"
    assert rendered["services"]["nats"]["entrypoint"] == ["/nats-server"]
    p = subprocess.run(
        ["docker-compose", "-f", str(path), "config"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert p.returncode != 0 and "set FAILSLOW_TOKEN" in p.stderr  # no token: refused
