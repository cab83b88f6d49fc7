"""The demo itself: start the service and one agent per host, play the job, follow its plan,
print what failslow finds and does."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from failslow.agents.plan import PlanClient
from failslow.agents.sdk import Recorder
from failslow.detectors.vocab import IncidentKind
from failslow.harness.demo.story import JOB, MICROBATCHES, story
from failslow.harness.demo.terminal import BOLD, GREEN, RED, YELLOW, Terminal, pick_port
from failslow.harness.simulator import Fault, closedloop
from failslow.harness.simulator.engine import Simulation
from failslow.harness.simulator.faults import FaultKind


class Demo:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.term = Terminal()
        self.work = Path(args.workdir).resolve()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.recorders: dict[str, Recorder] = {}
        self.http = httpx.Client(timeout=2.0)
        self.seen: dict[str, str] = {}
        self.incidents: list[dict[str, Any]] = []
        self.actions_seen: dict[str, str] = {}
        self.actions: list[dict[str, Any]] = []
        self.plans: PlanClient | None = None
        self.registered: set[str] = set()

    # -- processes ---------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.work / "logs" / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        if self.work.exists():
            shutil.rmtree(self.work)
        for sub in ("logs", "agents", "sock"):
            (self.work / sub).mkdir(parents=True)
        self.port = pick_port(self.args.port)
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        env.update(
            {
                "FAILSLOW_DATABASE_URL": f"sqlite:///{self.work}/failslow.db",
                "FAILSLOW_DETECTION__INTERVAL_S": "0.2",
                "PYTHONUNBUFFERED": "1",
            }
        )
        cli = [sys.executable, "-m", "failslow.cli"]
        self.term.line(
            self.term.c(BOLD, "failslow demo")
            + f": service on {self.url}, logs in {self.work}/logs"
        )
        self._spawn("service", cli + ["serve", "--port", str(self.port)], env)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.procs[0].poll() is not None:
                raise SystemExit(f"the service exited; see {self.work}/logs/service.log")
            with contextlib.suppress(httpx.HTTPError):
                if self.http.get(self.url + "/readyz").status_code == 200:
                    break
            time.sleep(0.1)
        else:
            raise SystemExit("the service did not become ready in 60 s")
        self.scenario = replace(story(self.args.fast), t0_ns=time.time_ns())
        lay = self.scenario.layout
        for host in lay.hosts:
            sock = str(self.work / "sock" / f"{host}.sock")
            self._spawn(
                f"agent-{host}",
                cli
                + [
                    "agent",
                    "--service",
                    self.url,
                    "--job",
                    JOB,
                    "--host",
                    host,
                    "--socket",
                    sock,
                    "--state-dir",
                    str(self.work / "agents" / host),
                    "--flush-interval",
                    "0.5",
                    "--no-fsync",
                ],
                env,
            )
            rec = Recorder(JOB, socket_path=sock, flush_interval_s=0.05)
            for r in self.scenario.host_ranks(host):
                rec.register_rank(r["rank"], gpu=r["gpu"], world_size=r["world_size"])
            for c in self.scenario.host_comms(host):
                rec.register_comm(c["comm"], c["kind"], c["ranks"])
                self.registered.add(c["comm"])
            self.recorders[host] = rec
        # the job follows failslow's plan: it declares its global batch and polls the plan
        self.plans = PlanClient(self.url, JOB, global_batch=lay.dp * MICROBATCHES)
        self.term.line(
            f"{len(lay.hosts)} node agents started; simulated job {self.term.c(BOLD, JOB)}: "
            f"{lay.world} ranks (TP={lay.tp} x PP={lay.pp} x DP={lay.dp}), "
            f"{self.scenario.steps} steps"
        )

    def stop(self) -> None:
        if self.plans is not None:
            self.plans.close()
        for rec in self.recorders.values():
            rec.close(timeout_s=2)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.http.close()

    # -- the story -------------------------------------------------------------------------------
    def describe_fault(self, f: Fault) -> str:
        lay = self.scenario.layout
        if f.kind == FaultKind.SLOW_GPU:
            r = f.ranks[0]
            where = f"GPU {lay.gpu(r)} on {lay.host(r)}"
            return f"slow GPU: rank {r} ({where}) computes {f.factor:g}x slower"
        if f.kind == "slow_nic":
            return f"slow NIC: {f.hosts[0]}'s network link is {f.factor:g}x slower"
        return f"{f.kind} {f.ranks or f.hosts} x{f.factor:g}"

    def play(self) -> None:
        sim = self.scenario.simulation()
        hosts = self.scenario.layout.hosts
        start = time.monotonic()
        announced: set[int] = set()
        ended: set[int] = set()
        next_poll = 0.0
        records = 0
        while not sim.done:
            now = time.monotonic() - start
            sim.run_until(now)
            for host_idx, rec in sim.drain(now):
                r = self.recorders[hosts[host_idx]]
                if rec[0] == "c":
                    _, rank, comm, seq, op, nbytes, s, e, peer = rec
                    r.record_collective(
                        rank=rank,
                        comm=comm,
                        seq=seq,
                        op=op,
                        nbytes=nbytes,
                        start_ns=s,
                        end_ns=e,
                        peer=peer,
                    )
                else:
                    _, rank, step, s, e = rec
                    r.record_step(rank=rank, step=step, start_ns=s, end_ns=e)
                records += 1
            for i, f in enumerate(self.scenario.faults):
                if i in sim.fault_onset and i not in announced:
                    announced.add(i)
                    self.term.line(
                        self.term.c(
                            YELLOW,
                            f"[{now:6.1f}s] >> injected at step {f.start_step}: "
                            f"{self.describe_fault(f)}",
                        )
                    )
                if i in sim.fault_end and i not in ended:
                    ended.add(i)
                    self.term.line(
                        self.term.c(
                            YELLOW,
                            f"[{now:6.1f}s] >> cleared at step {f.end_step}: {f.kind} is gone",
                        )
                    )
            if now >= next_poll:
                next_poll = now + 1.0
                self.poll(now, records)
                self.follow_plan(sim, now)
            if self.args.seconds and now > self.args.seconds:
                break
            time.sleep(0.02)
        for rec in self.recorders.values():
            rec.flush(timeout_s=5)
        end = time.monotonic() + 4
        while time.monotonic() < end:  # let the agents deliver and detection catch up
            self.poll(time.monotonic() - start, records)
            time.sleep(0.5)

    def follow_plan(self, sim: Simulation, now: float) -> None:
        """What a training loop does at a step boundary: apply a new plan, acknowledge it."""
        assert self.plans is not None
        plan = self.plans.poll()
        if plan is None:
            return
        step = closedloop.follow(sim, plan)
        self.plans.ack(plan, step)
        for host in self.scenario.layout.hosts:  # re-created communicators are announced
            for c in sim.comms_of_host(host):
                if c.comm not in self.registered:
                    self.recorders[host].register_comm(c.comm, c.kind, list(c.ranks))
        self.registered |= {c.comm for c in sim.comms()}
        what = (
            f"micro-batch shares {list(plan.microbatch_shares)}"
            if plan.microbatch_shares
            else "equal shares"
        )
        self.term.line(
            self.term.c(
                BOLD, f"[{now:6.1f}s] >> the job applies plan v{plan.version} from step {step}: "
            )
            + what
        )

    def poll_actions(self, now: float) -> None:
        try:
            actions = self.http.get(f"{self.url}/v1/jobs/{JOB}/actions").json()
        except (httpx.HTTPError, ValueError):
            return
        if not isinstance(actions, list):
            return
        for a in actions:
            if self.actions_seen.get(a["id"]) == a["state"]:
                continue
            self.actions_seen[a["id"]] = a["state"]
            if a["state"] not in ("proposed", "succeeded", "failed", "rejected"):
                continue
            color = GREEN if a["state"] == "succeeded" else YELLOW
            self.term.line(
                self.term.c(color, f"[{now:6.1f}s] == ACTION {a['kind']} {a['state']}")
                + f" ({a['mode']}, via {a['actuator']}): {a['reason']}"
            )
        self.actions = actions

    def poll(self, now: float, records: int) -> None:
        try:
            job = self.http.get(f"{self.url}/v1/jobs/{JOB}").json()
            incidents = self.http.get(f"{self.url}/v1/jobs/{JOB}/incidents").json()
        except (httpx.HTTPError, ValueError):
            self.term.status(f"[{now:6.1f}s] waiting for the service...")
            return
        if "job" not in job:
            self.term.status(f"[{now:6.1f}s] waiting for the first envelopes...")
            return
        for inc in incidents:
            before = self.seen.get(inc["id"])
            if before == inc["state"]:
                continue
            self.seen[inc["id"]] = inc["state"]
            delay = (inc["detected_ns"] - inc["onset_ns"]) / 1e9
            if inc["state"] == "open" or before is None:
                steps = ""
                if inc["onset_step"] is not None and inc["detected_step"] is not None:
                    steps = f", {inc['detected_step'] - inc['onset_step']} steps"
                self.term.line(
                    self.term.c(
                        RED, f"[{now:6.1f}s] ** INCIDENT {inc['kind']} opened: {inc['summary']}"
                    )
                )
                self.term.line(
                    f"          detected {delay:.1f} s{steps} after onset; "
                    f"confidence {inc['confidence']:.2f}; GET /v1/incidents/{inc['id']}"
                )
            if inc["state"] == "resolved":
                who = f"ranks {inc['ranks']}" if inc["ranks"] else ", ".join(inc["hosts"])
                self.term.line(
                    self.term.c(
                        GREEN,
                        f"[{now:6.1f}s] ** INCIDENT {inc['kind']} resolved ({who}) "
                        f"at step {inc['resolved_step']}",
                    )
                )
        self.incidents = incidents
        self.job = job
        self.poll_actions(now)
        base = job.get("baseline_step_time_s")
        st = job.get("step_time_s")
        slow = job.get("slowdown")
        text = f"[{now:6.1f}s] step {job.get('step')}"
        if st:
            text += f"  step time {st:.3f}s"
        if base and slow:
            pct = round((slow - 1) * 100)
            text += f" (baseline {base:.3f}s, {pct:+d}%)"
        text += f"  records sent {records:,}  state {job['state']}"
        text += f"  open incidents {job['open_incidents']}"
        self.term.status(text)

    def check_undone(self, done: list[dict[str, Any]]) -> bool:
        """A rebalance for the GPU that recovered is undone (equal shares again), and, once
        every fault is over, the job ends within 3% of its healthy step time (issue 16)."""
        rebalanced = any(a["kind"] == "rebalance" and not a["params"].get("restore") for a in done)
        restored = any(a["params"].get("restore") for a in done)
        if rebalanced and not restored:
            self.term.line(self.term.c(RED, "NOT RESTORED: the job kept lopsided shares"))
            return False
        job = getattr(self, "job", None) or {}
        st, base = job.get("step_time_s"), job.get("baseline_step_time_s")
        sc = self.scenario
        if not st or not base or any(f.end_step is None or f.end_step >= sc.steps
                                     for f in sc.faults):  # fmt: skip
            return True  # a fault still on at the end (--fast): nothing to compare
        off = st / base - 1
        colour, verdict = (GREEN, "OK") if abs(off) <= 0.03 else (RED, "SLOWER")
        text = f"{verdict}: the job ends at {st:.3f}s per step, {off:+.1%} against its healthy"
        self.term.line(self.term.c(colour, f"{text} {base:.3f}s."))
        return abs(off) <= 0.03

    def report(self) -> int:
        """Compare what the service reported with what was injected; 0 when both were found
        (and nothing else was reported)."""
        self.term.line("")
        expected = {
            (IncidentKind.SLOW_GPU, (13,), ()): "the injected slow GPU (rank 13)",
            (IncidentKind.SLOW_LINK, (), ("node-005",)): "the injected slow NIC (node-005)",
        }
        got = {
            (
                i["kind"],
                tuple(i["ranks"]),
                tuple(i["hosts"]) if i["kind"] == IncidentKind.SLOW_LINK else (),
            ): i
            for i in self.incidents
        }
        ok = True
        for key, what in expected.items():
            inc = got.get(key)
            if inc is None:
                ok = False
                self.term.line(self.term.c(RED, f"NOT FOUND: {what}"))
            else:
                d = (inc["detected_ns"] - inc["onset_ns"]) / 1e9
                self.term.line(
                    self.term.c(GREEN, f"OK: {what} was found {d:.1f} s after its onset.")
                )
        done = [a for a in self.actions if a["state"] == "succeeded" and a["kind"] != "notify"]
        for a in done:
            outcome = a.get("outcome") or {}
            gain = (
                f"; step time {outcome['step_time_during_s']:.3f}s -> "
                f"{outcome['step_time_after_s']:.3f}s"
                if outcome.get("step_time_during_s") and outcome.get("step_time_after_s")
                else ""
            )
            what = "restore equal shares" if a["params"].get("restore") else a["kind"]
            self.term.line(self.term.c(GREEN, f"ACTED: {what} {a['target']}{gain}"))
        ok = self.check_undone(done) and ok
        others = [(k, v) for k, v in got.items() if k not in expected]
        if others:
            ok = False
            names = [f"{v['kind']} {v['ranks'] or v['hosts']}" for _, v in others]
            self.term.line(f"other incidents: {names}")
        self.term.line(
            "\nLook next (while it runs, or later with "
            f"`failslow serve --database-url sqlite:///{self.work}/failslow.db`):\n"
            f"  {self.url}/docs                       the API, live\n"
            f"  {self.url}/metrics                    Prometheus metrics\n"
            f"  failslow get incidents --url {self.url}\n"
            f"  failslow describe incident ID --url {self.url}   evidence, actions, timeline\n"
            f"  failslow get actions --url {self.url} -o wide    what the policy decided, and why\n"
            f"  curl {self.url}/v1/jobs/{JOB}/plan         the plan the job follows\n"
            f"  {self.url}/ui                         the status page (docs/operations.md: on call)"
        )
        return 0 if ok else 1
