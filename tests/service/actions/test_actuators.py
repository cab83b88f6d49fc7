"""Actuators against real local receivers: an HTTP webhook receiver, a recorded ``scontrol`` on
PATH (Debian's Slurm needs a running slurmctld, which this machine does not have), and a local
HTTP server speaking the Kubernetes API paths the official client calls (no cluster here)."""

from __future__ import annotations

import hashlib
import hmac
import json
import stat
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from failslow.service.actions.actuators.base import ActionRequest, run
from failslow.service.actions.actuators.slurm import SlurmActuator
from failslow.service.actions.actuators.webhook import WebhookActuator

REQ = ActionRequest(
    id="act_1",
    job="llama-7",
    incident="inc_1",
    kind="isolate",
    target="host:node-017",
    reason="the job is hung; root(s) on node-017",
    params={"host": "node-017", "ranks": [136, 137]},
)


class Receiver:
    """A real HTTP server that records requests and answers from a script of statuses."""

    def __init__(self, statuses: list[int] | None = None, body: Any = None) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.statuses = list(statuses or [])
        self.body = body
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(n) if n else b""
                outer.requests.append((self.command, self.path, dict(self.headers), data))
                status = outer.statuses.pop(0) if outer.statuses else 200
                payload = outer.body(self.command, self.path) if callable(outer.body) else {}
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _any

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def test_webhook_signs_the_exact_body(receiver: Receiver) -> None:
    act = WebhookActuator(url=receiver.url + "/hook", secret="s3cret")
    out = run(act, REQ, timeout_s=10)
    assert out.ok and out.result["status"] == 200
    method, path, headers, body = receiver.requests[0]
    assert (method, path) == ("POST", "/hook")
    want = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["X-Failslow-Signature"] == want
    assert headers["X-Failslow-Delivery"] == "act_1"
    doc = json.loads(body)
    assert doc["kind"] == "isolate" and doc["target"] == "host:node-017"


def test_webhook_retries_server_errors_then_succeeds() -> None:
    r = Receiver(statuses=[503, 500, 200])
    try:
        out = run(WebhookActuator(url=r.url, secret="k"), REQ, timeout_s=10)
        assert out.ok and out.result["attempts"] == 3
        assert len(r.requests) == 3
    finally:
        r.close()


def test_webhook_gives_up_on_a_refusal_and_reports_it() -> None:
    r = Receiver(statuses=[403, 200])
    try:
        out = run(WebhookActuator(url=r.url, secret="k"), REQ, timeout_s=10)
        assert not out.ok and "HTTP 403" in out.result["error"]
        assert len(r.requests) == 1  # a 4xx is not retried
    finally:
        r.close()


def test_webhook_unreachable_fails_cleanly() -> None:
    out = run(WebhookActuator(url="http://127.0.0.1:9", secret="k", attempts=2), REQ, timeout_s=10)
    assert not out.ok and "failed after 2 attempt(s)" in out.result["error"]


@pytest.fixture
def scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A recorded fake ``scontrol``: appends its argv to a log, fails for node 'bad-node'."""
    log = tmp_path / "scontrol.log"
    exe = tmp_path / "scontrol"
    exe.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {log}\n'
        'case "$*" in *bad-node*) echo "slurm_update error: Invalid node name" >&2; exit 1;; esac\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe, log


def test_slurm_drains_the_node_and_requeues_the_job(scontrol: tuple[Path, Path]) -> None:
    exe, log = scontrol
    act = SlurmActuator(scontrol=str(exe))
    assert run(act, REQ, timeout_s=10).ok
    restart = ActionRequest(
        "act_2", "llama-7", "inc_1", "restart", "job:llama-7", "hung", {"slurm_job_id": 4242}
    )
    assert run(act, restart, timeout_s=10).ok
    hint = ActionRequest("act_4", "llama-7", None, "drain", "host:node-017", "GPU-x 6% slower",
                         {"host": "node-017"})  # fmt: skip
    assert run(act, hint, timeout_s=10).ok
    lines = log.read_text().splitlines()
    assert lines[0].startswith("update nodename=node-017 state=drain reason=failslow act_1:")
    assert lines[1] == "requeue 4242"
    assert lines[2] == "update nodename=node-017 state=drain reason=failslow act_4: GPU-x 6% slower"


def test_slurm_undrain_leaves_a_node_someone_else_drained(tmp_path: Path) -> None:
    """``scontrol show node`` as Slurm prints it for a node an administrator drained."""
    log, exe = tmp_path / "scontrol.log", tmp_path / "scontrol"
    exe.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$*" >> {log}\n'
        'echo "NodeName=node-017 Arch=x86_64 CoresPerSocket=1"\n'
        'echo "   State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1"\n'
        'echo "   Reason=rack 4 maintenance [admin@2026-12-06T10:00:00]"\n'
    )
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    back = ActionRequest("act_7", "j", None, "undrain", "host:node-017", "repaired",
                         {"host": "node-017"})  # fmt: skip
    out = run(SlurmActuator(scontrol=str(exe)), back, timeout_s=10)
    assert not out.ok and "drained by someone else (reason: rack 4 maintenance" in \
        out.result["error"]  # fmt: skip
    assert log.read_text().splitlines() == ["show node node-017"]  # nothing resumed


def test_slurm_failure_carries_scontrols_message(scontrol: tuple[Path, Path]) -> None:
    exe, _ = scontrol
    bad = ActionRequest("act_3", "j", None, "isolate", "host:bad-node", "x", {"host": "bad-node"})
    out = run(SlurmActuator(scontrol=str(exe)), bad, timeout_s=10)
    assert not out.ok and "Invalid node name" in out.result["error"]


def test_slurm_dry_run_runs_nothing(scontrol: tuple[Path, Path]) -> None:
    exe, log = scontrol
    out = run(SlurmActuator(scontrol=str(exe)), _dry(REQ), timeout_s=10)
    assert out.ok and out.result["ran"] is False and out.result["dry_run"] is True
    assert "state=drain" in out.result["commands"][0]
    assert not log.exists()


def _dry(req: ActionRequest) -> ActionRequest:
    return ActionRequest(
        req.id, req.job, req.incident, req.kind, req.target, req.reason, dict(req.params), True
    )


def _kube_body(method: str, path: str) -> Any:
    if method == "GET" and path.startswith("/api/v1/namespaces/train/pods"):
        return {
            "kind": "PodList",
            "apiVersion": "v1",
            "metadata": {},
            "items": [{"metadata": {"name": "llama-7-w3", "namespace": "train"}}],
        }
    if path.startswith("/api/v1/nodes/"):
        return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": path.rsplit("/", 1)[1]}}
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}


def test_kubernetes_cordons_the_node_and_evicts_the_jobs_pods() -> None:
    pytest.importorskip("kubernetes")
    from failslow.service.actions.actuators.kubernetes import KubernetesActuator

    r = Receiver(body=_kube_body)
    try:
        act = KubernetesActuator(namespace="train", host=r.url)
        out = run(act, REQ, timeout_s=20)
        assert out.ok, out.result
        assert out.result == {**out.result, "cordoned": "node-017", "evicted": ["llama-7-w3"]}
        calls = [(m, p.split("?")[0]) for m, p, _, _ in r.requests]
        assert ("GET", "/api/v1/namespaces/train/pods") in calls
        assert ("PATCH", "/api/v1/nodes/node-017") in calls
        assert ("POST", "/api/v1/namespaces/train/pods/llama-7-w3/eviction") in calls
        query = next(p for m, p, _, _ in r.requests if m == "GET")
        qs = parse_qs(urlsplit(query).query)
        assert qs["labelSelector"] == ["failslow.dev/job=llama-7"]
        assert qs["fieldSelector"] == ["spec.nodeName=node-017"]
        patch = next(b for m, _, _, b in r.requests if m == "PATCH")
        assert json.loads(patch) == {"spec": {"unschedulable": True}}
    finally:
        r.close()


def test_kubernetes_drain_hint_cordons_and_taints_the_node() -> None:
    pytest.importorskip("kubernetes")
    from failslow.service.actions.actuators.kubernetes import TAINT, KubernetesActuator

    r = Receiver(body=_kube_body)
    hint = ActionRequest("act_5", "llama-7", None, "drain", "host:node-017", "slow GPU",
                         {"host": "node-017", "part": "GPU-5c1e9d2a/x"})  # fmt: skip
    try:
        out = run(KubernetesActuator(namespace="train", host=r.url), hint, timeout_s=20)
        assert out.ok and out.result["cordoned"] == "node-017", out.result
        patch = json.loads(next(b for m, _, _, b in r.requests if m == "PATCH"))
        assert patch == {"spec": {"unschedulable": True, "taints": [
            {"key": TAINT, "value": "GPU-5c1e9d2a_x", "effect": "NoSchedule"}]}}  # fmt: skip
        assert not any(m == "POST" for m, _, _, _ in r.requests)  # nothing evicted: a hint
    finally:
        r.close()


def _tainted_node(taints: list[dict[str, str]], unschedulable: bool) -> Any:
    def body(method: str, path: str) -> Any:
        if method == "GET" and path.startswith("/api/v1/nodes/"):
            return {"kind": "Node", "apiVersion": "v1", "metadata": {"name": "node-017"},
                    "spec": {"unschedulable": unschedulable, "taints": taints}}  # fmt: skip
        return _kube_body(method, path)

    return body


def test_kubernetes_undrain_removes_only_its_taint_and_uncordons() -> None:
    pytest.importorskip("kubernetes")
    from failslow.service.actions.actuators.kubernetes import TAINT, KubernetesActuator

    gpu = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ours = {"key": TAINT, "value": "GPU-5c1e9d2a_x", "effect": "NoSchedule"}
    back = ActionRequest("act_6", "llama-7", None, "undrain", "host:node-017", "repaired",
                         {"host": "node-017"})  # fmt: skip
    r = Receiver(body=_tainted_node([gpu, ours], True))
    try:
        out = run(KubernetesActuator(namespace="train", host=r.url), back, timeout_s=20)
        assert out.ok and out.result["uncordoned"] == "node-017", out.result
        patch = json.loads(next(b for m, _, _, b in r.requests if m == "PATCH"))
        assert patch == {"spec": {"unschedulable": False, "taints": [gpu]}}
    finally:
        r.close()
    r = Receiver(body=_tainted_node([gpu], True))  # cordoned, but not by failslow
    try:
        out = run(KubernetesActuator(namespace="train", host=r.url), back, timeout_s=20)
        assert not out.ok and "cordoned by someone else" in out.result["error"], out.result
        assert not any(m == "PATCH" for m, _, _, _ in r.requests)
    finally:
        r.close()


def test_kubernetes_api_errors_become_a_failed_outcome() -> None:
    pytest.importorskip("kubernetes")
    from failslow.service.actions.actuators.kubernetes import KubernetesActuator

    r = Receiver(statuses=[403], body=_kube_body)
    try:
        out = run(KubernetesActuator(namespace="train", host=r.url), REQ, timeout_s=20)
        assert not out.ok and "kubernetes API 403" in out.result["error"]
    finally:
        r.close()


class _Slow:
    name = "slow"

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        time.sleep(2)
        return {}


class _Broken:
    name = "broken"

    def execute(self, request: ActionRequest) -> dict[str, Any]:
        raise RuntimeError("boom")


def test_runner_bounds_time_and_isolates_errors() -> None:
    started = time.monotonic()
    out = run(_Slow(), REQ, timeout_s=0.2)
    assert not out.ok and out.result["timeout"] is True
    assert time.monotonic() - started < 1.5
    out = run(_Broken(), REQ, timeout_s=5)
    assert not out.ok and out.result["error"] == "RuntimeError: boom"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.infra import slurm as infra

    why = infra.unavailable()
    if why:
        pytest.skip(why + " (the recorded-scontrol tests above still run)")
    with infra.cluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def test_slurm_against_a_real_cluster_drains_and_requeues(slurm: Any) -> None:
    job = slurm.submit("llama-7")
    deadline = time.monotonic() + 30
    while slurm.field("job", str(job), "JobState") != "RUNNING":
        assert time.monotonic() < deadline, "the test job never started"
        time.sleep(0.2)
    act = SlurmActuator(conf=str(slurm.conf))
    iso = ActionRequest(
        "act_9", "llama-7", "inc_1", "isolate", f"host:{slurm.node}", "GPU 3 is 40% slower",
        {"host": slurm.node},
    )  # fmt: skip
    out = run(act, iso, timeout_s=30)
    assert out.ok, out.result
    assert "DRAIN" in slurm.field("node", slurm.node, "State")
    assert slurm.field("node", slurm.node, "Reason").startswith("failslow")
    restart = ActionRequest(
        "act_10", "llama-7", "inc_1", "restart", "job:llama-7", "restart without the node",
        {"slurm_job_id": job},
    )  # fmt: skip
    assert run(act, restart, timeout_s=30).ok
    assert slurm.field("job", str(job), "Restarts") == "1"
    deadline = time.monotonic() + 30  # requeued: COMPLETING, then PENDING again
    while slurm.field("job", str(job), "JobState") != "PENDING":
        assert time.monotonic() < deadline, slurm.field("job", str(job), "JobState")
        time.sleep(0.2)
    bad = ActionRequest("act_11", "x", None, "restart", "job:x", "r", {"slurm_job_id": 999999})
    failed = run(act, bad, timeout_s=30)
    assert not failed.ok and "Invalid job id" in failed.result["error"]
