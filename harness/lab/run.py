"""``failslow lab``: real faults injected into a real PyTorch job, found by the real service.

N ranks of :mod:`failslow.harness.lab.train` (gloo, CPU; tensor-parallel pairs x data-parallel
DDP), each in its own network namespace (``node-<i>``) on a Linux bridge, each with its own node
agent in that namespace shipping the ranks' telemetry to a failslow service (started here unless
``--service`` is given; it listens on the bridge address). After a warm-up, faults are injected one
at a time
into one rank (``--target``) and removed again:

* ``compute``: the rank's process into a cgroup v1 ``cpu`` group with a quota (default 25% of a
  CPU) — expected: ``slow_gpu`` on that rank;
* ``link``: a token bucket (``tc tbf``) on both ends of the rank's veth — expected: ``slow_link``
  naming the rank's host;
* ``hang``: SIGSTOP of the rank, SIGCONT to recover — expected: ``hang`` with that rank as root;
* ``slow``: the rank computes ``--slow-factor`` times slower (:mod:`~failslow.harness.lab.slowdown`,
  a truth to hold "N% slower than its peers" against) — expected: ``slow_gpu`` on that rank,
  whose reported slowdown is written next to the injected one.

Per fault: detected or not, the incident's kind and subject, the detection delay in steps and in
seconds (from the injection to the incident's ``detected_ns``), whether it resolved after the
recovery, and every other GPU/node/link/hang incident (a false incident). Printed as a table and
written as JSON. Namespaces, veths, qdiscs, cgroups and processes are removed whatever happens
(also after a crash of an earlier run: all names carry the ``--prefix``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from failslow.agents.launch import run_environment
from failslow.detectors.vocab import IncidentKind
from failslow.harness.lab import remote
from failslow.harness.lab.faulting import FaultRunner
from failslow.harness.lab.report import LOCALIZED_KINDS, FaultResult, table
from failslow.harness.lab.system import CpuQuota, LabError, LabNetwork, cleanup_stale


class Lab(FaultRunner):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.n = args.ranks
        self.job = args.job
        self.work = Path(args.workdir or tempfile.mkdtemp(prefix="failslow-lab-"))
        marker = self.work / ".failslow-lab"
        if self.work.exists() and any(self.work.iterdir()):
            if not marker.exists():
                raise LabError(f"--workdir {self.work} is not empty and not an earlier lab's")
            shutil.rmtree(self.work)  # an earlier run's: its database and progress would mix in
        self.work.mkdir(parents=True, exist_ok=True)
        marker.touch()
        self.net = LabNetwork(self.n, prefix=args.prefix, net=args.net)
        self.token = secrets.token_urlsafe(24)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.trainers: list[subprocess.Popen[bytes]] = []
        self.quota: CpuQuota | None = None
        self.url = args.service
        # a loopback service cannot be reached from the namespaces: agents run outside them
        self.agents_in_ns = not (args.service and remote.is_loopback(args.service))
        self.http = httpx.Client(timeout=5.0, headers={"Authorization": f"Bearer {self.token}"})
        if args.service and args.token:
            self.http.headers["Authorization"] = f"Bearer {args.token}"
        self.results: list[FaultResult] = []
        self.step_time_s = float("nan")
        # the compute fault takes away a fraction of the CPU the rank gets when healthy: a whole
        # CPU where there are enough, its fair share where ranks outnumber the CPUs
        self.fair_share = min(1.0, (os.cpu_count() or 1) / self.n)
        self.cpu_quota = round(args.cpu_quota * self.fair_share, 4)

    # -- output --------------------------------------------------------------------------------
    def say(self, text: str) -> None:
        print(f"[lab {time.strftime('%H:%M:%S')}] {text}", flush=True)

    @property
    def dp(self) -> int:
        return self.n // (self.args.tp * self.args.pp)

    def host(self, i: int) -> str:
        return f"node-{i}"

    # -- processes -----------------------------------------------------------------------------
    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, nice: int = 0
    ) -> Any:
        """``nice``: the service and the agents yield the CPU to the ranks (this machine may
        have fewer cores than ranks; their own work is not what the lab measures)."""
        log = open(self.work / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            ["nice", "-n", str(nice), *argv] if nice else argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def start_service(self) -> None:
        port = self.args.port
        self.url = f"http://{self.net.gateway}:{port}"
        env = {
            "FAILSLOW_DATABASE_URL": f"sqlite:///{self.work}/failslow.db",
            "FAILSLOW_DETECTION__INTERVAL_S": "0.25",
            "FAILSLOW_ACTIONS__ENABLED": "false",  # a detection lab: nothing acts on the job
            "FAILSLOW_AUTH__INGEST_TOKENS": self.token,
            "FAILSLOW_AUTH__READ_TOKENS": self.token,
            "FAILSLOW_AUTH__OPERATOR_TOKENS": self.token,
        }
        argv = [sys.executable, "-m", "failslow.cli", "serve", "--host", self.net.gateway]
        self._spawn("service", [*argv, "--port", str(port)], env, nice=5)
        self._wait_ready(60.0)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            svc = self.procs.get("service")
            if svc is not None and svc.poll() is not None:
                raise LabError(f"the service exited; see {self.work}/service.log")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(f"{self.url}/readyz").status_code == 200:
                    return
            time.sleep(0.2)
        raise LabError(f"the service at {self.url} is not ready after {timeout_s:.0f} s")

    def start_job(self) -> None:
        for i in range(self.n):
            sock = str(self.work / f"{self.host(i)}.sock")
            agent = [
                sys.executable, "-m", "failslow.cli", "agent", "--service", self.url,
                "--job", self.job, "--host", self.host(i), "--socket", sock,
                "--state-dir", str(self.work / "agents" / self.host(i)),
                f"--token={self.args.token or self.token}",  # a token may begin with "-"
                "--flush-interval", "0.25", "--heartbeat", "1", "--no-fsync",
                "--archive", str(self.work / f"envelopes-{self.host(i)}.jsonl"),
            ]  # fmt: skip
            if self.agents_in_ns:  # active probes cross the node's own veth
                agent += ["--probe-listen", f"{self.net.ip(i)}:7100", "--task-poll", "1"]
                agent = self.net.exec(i, agent)
            self._spawn(f"agent-{i}", agent, nice=5)
        for i in range(self.n):
            sock = str(self.work / f"{self.host(i)}.sock")
            deadline = time.monotonic() + 30
            while not Path(sock).exists():
                if time.monotonic() > deadline:
                    raise LabError(f"agent {i} did not open {sock}; see {self.work}/agent-{i}.log")
                time.sleep(0.1)
        (self.work / "stop").unlink(missing_ok=True)
        for i in range(self.n):
            sock = str(self.work / f"{self.host(i)}.sock")
            common = [
                "--rank", str(i), "--world", str(self.n), "--tp", str(self.args.tp),
                "--pp", str(self.args.pp), "--master", f"{self.net.ip(0)}:29500",
                "--progress", str(self.work / f"progress-{i}.jsonl"),
                "--stop-file", str(self.work / "stop"), "--slow-file", str(self.slow_file(i)),
            ]  # fmt: skip
            env = {"GLOO_SOCKET_IFNAME": self.net.ns_if(i), "OMP_NUM_THREADS": "1"}
            if self.args.model == "titan":  # no failslow code in it: failslow run's way
                train = [sys.executable, "-m", "failslow.harness.lab.titan", *common]
                env = run_environment({**os.environ, **env}, self.job, sock, None)
            else:
                train = [
                    sys.executable, "-m", "failslow.harness.lab.train", *common,
                    "--job", self.job, "--socket", sock, "--batch", str(self.args.batch),
                ]  # fmt: skip
            self.trainers.append(self._spawn(f"rank-{i}", self.net.exec(i, train), env))

    def slow_file(self, i: int) -> Path:
        return self.work / f"slow-{i}"

    def trainer_pid(self, i: int) -> int:
        """The Python process of rank ``i`` (``ip netns exec`` execs it, same pid)."""
        return self.trainers[i].pid

    # -- progress ------------------------------------------------------------------------------
    def progress(self, i: int) -> list[dict[str, Any]]:
        path = self.work / f"progress-{i}.jsonl"
        out = []
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def step(self, exclude: int | None = None) -> int:
        """Steps completed by the slowest rank other than ``exclude``."""
        counts = [len(self.progress(i)) for i in range(self.n) if i != exclude]
        return min(counts) if counts else 0

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise LabError(f"{name} exited with {proc.returncode}; see {self.work}/{name}.log")

    def wait_steps(self, n: int, timeout_s: float, exclude: int | None = None) -> int:
        target = self.step(exclude) + n
        deadline = time.monotonic() + timeout_s
        while self.step(exclude) < target:
            self.check_alive()
            if time.monotonic() > deadline:
                raise LabError(f"training made no progress to step {target} in {timeout_s:.0f} s")
            time.sleep(0.2)
        return self.step(exclude)

    def steps_between(self, rank: int, start_ns: int, end_ns: int) -> int:
        return sum(1 for p in self.progress(rank) if start_ns < p["end_ns"] <= end_ns)

    # -- incidents -----------------------------------------------------------------------------
    def incidents(self) -> list[dict[str, Any]]:
        try:
            r = self.http.get(f"{self.url}/v1/jobs/{self.job}/incidents", params={"state": "all"})
        except httpx.HTTPError as exc:
            raise LabError(f"cannot read incidents from {self.url}: {exc}") from exc
        if r.status_code == 404:
            return []
        if r.status_code != 200:
            raise LabError(f"{self.url} answered {r.status_code} for incidents: {r.text[:200]}")
        return list(r.json())

    # -- the whole run -------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        faults = self.args.faults
        if self.url is not None:  # stop at once, with the reason, where the lab could not work
            remote.check_service(self.url, self.args.token)
        with self.net:
            if self.url is None:
                self.start_service()
            elif self.agents_in_ns:
                remote.check_from_namespace(self.url, self.net.exec(0, []))
            else:
                self.say("loopback service: the agents run outside the namespaces (no probes)")
            self.say(f"service {self.url}; work dir {self.work}")
            self.start_job()
            self.say(
                f"{self.n} ranks of the {self.args.model} job (tp={self.args.tp} x dp={self.dp} x "
                f"pp={self.args.pp}), one per namespace; warming up {self.args.warmup} steps"
            )
            self.wait_steps(self.args.warmup, 180.0)
            agents = [self.work / "agents" / self.host(i) for i in range(self.n)]
            remote.check_delivery(self.url, [remote.agent_stats(a) for a in agents])
            durations = sorted((p["end_ns"] - p["start_ns"]) / 1e9 for p in self.progress(0)[5:])
            self.step_time_s = durations[len(durations) // 2] if durations else float("nan")
            self.say(f"healthy step time {self.step_time_s * 1000:.0f} ms")
            started_ns = time.time_ns()
            if faults == ["none"]:
                self.wait_steps(self.args.healthy_steps, 600.0)
            for fault in faults:
                if fault != "none":
                    self.results.append(self.run_fault(fault))
            incidents = self.incidents()
            self.stop_job()
        return self.report(incidents, started_ns)

    def stop_job(self) -> None:
        stop_at = max(len(self.progress(i)) for i in range(self.n)) + 5
        (self.work / "stop").write_text(str(stop_at))
        deadline = time.monotonic() + 60
        for p in self.trainers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, deadline - time.monotonic()))

    def report(self, incidents: list[dict[str, Any]], started_ns: int) -> dict[str, Any]:
        expected = {r.incident for r in self.results if r.incident}
        false = [
            {k: inc[k] for k in ("id", "kind", "ranks", "hosts", "summary", "detected_ns")}
            for inc in incidents
            if inc["kind"] in LOCALIZED_KINDS and inc["id"] not in expected
        ]
        job_slowdowns = sum(1 for inc in incidents if inc["kind"] == IncidentKind.JOB_SLOWDOWN)
        ok = (
            all(
                r.detected
                and r.localized
                and r.delay_steps is not None
                and r.delay_steps <= self.args.max_delay_steps
                for r in self.results
            )
            and not false
        )
        out = {
            "model": self.args.model,
            "ranks": self.n,
            "tp": self.args.tp,
            "dp": self.dp,
            "pp": self.args.pp,
            "step_time_s": round(self.step_time_s, 4),
            "cpu_quota_of_healthy": self.args.cpu_quota,
            "cpu_quota_cpus": self.cpu_quota,
            "link_rate": self.args.link_rate,
            "faults": [asdict(r) for r in self.results],
            "false_incidents": false,
            "job_slowdown_incidents": job_slowdowns,
            "incidents": len(incidents),
            "ok": ok,
            "workdir": str(self.work),
        }
        print(table(out), flush=True)
        return out

    def close(self) -> None:
        for p in self.trainers:  # a stopped rank must run to die
            with contextlib.suppress(OSError):
                os.kill(p.pid, signal.SIGCONT)
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if self.quota is not None:
            self.quota.close()
        self.net.close()
        cleanup_stale(self.args.prefix)
        self.http.close()
