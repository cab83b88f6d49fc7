"""``failslow lab``'s faults: inject one into a rank, wait for the service to find it, recover,
wait for the incident to resolve (a mix-in of :class:`~failslow.harness.lab.run.Lab`, whose
processes, network, service client and progress files it uses)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from failslow.detectors.vocab import IncidentKind
from failslow.harness.lab.report import EXPECTED, FaultResult, LabFault
from failslow.harness.lab.system import CpuQuota


class FaultRunner:
    """Needs, from the lab: ``args``, ``net``, ``quota``, ``http``, ``url``, ``n``,
    ``agents_in_ns``, ``step_time_s`` and the methods ``say``, ``host``, ``step``,
    ``steps_between``, ``wait_steps``, ``check_alive``, ``incidents``, ``slow_file``,
    ``trainer_pid``."""

    args: Any
    net: Any
    quota: CpuQuota | None
    http: Any
    url: str | None
    n: int
    agents_in_ns: bool
    step_time_s: float
    cpu_quota: float

    @staticmethod
    def matches(fault: str, inc: dict[str, Any], rank: int, host: str) -> bool:
        if fault == LabFault.LINK and FaultRunner.link_or_gpu(inc, host):
            return True
        if inc["kind"] != EXPECTED[fault]:
            return False
        if fault == LabFault.LINK:  # a NIC or a host pair; longer lists (ambiguous) are not
            return host in inc.get("hosts", []) and len(inc.get("hosts", [])) <= 2
        return list(inc.get("ranks", [])) == [rank]

    @staticmethod
    def link_or_gpu(inc: dict[str, Any], host: str) -> bool:
        """A ``slow_gpu`` that says passive data cannot tell it from its host's slow link (agents
        outside the namespaces run no probes to tell): right for a link fault of that host."""
        candidates = (inc.get("evidence") or {}).get("candidates") or []
        return inc["kind"] == IncidentKind.SLOW_GPU and any(
            c.get("kind") == IncidentKind.SLOW_LINK and host in c.get("hosts", [])
            for c in candidates
        )

    # -- faults --------------------------------------------------------------------------------
    def inject(self, fault: str, i: int) -> None:
        if fault == LabFault.COMPUTE:
            self.quota = CpuQuota(f"{self.args.prefix}-rank{i}", self.cpu_quota).__enter__()
            self.quota.add(self.trainer_pid(i))
        elif fault == LabFault.LINK:
            self.net.throttle(i, rate=self.args.link_rate)
        elif fault == LabFault.HANG:
            os.kill(self.trainer_pid(i), signal.SIGSTOP)
        elif fault == LabFault.SLOW:
            tmp = self.slow_file(i).with_suffix(".tmp")
            tmp.write_text(f"{self.args.slow_factor}\n")
            tmp.rename(self.slow_file(i))

    def recover(self, fault: str, i: int) -> None:
        if fault == LabFault.COMPUTE and self.quota is not None:
            self.quota.close()
            self.quota = None
        elif fault == LabFault.LINK:
            self.net.unthrottle(i)
        elif fault == LabFault.HANG:
            os.kill(self.trainer_pid(i), signal.SIGCONT)
        elif fault == LabFault.SLOW:
            self.slow_file(i).unlink(missing_ok=True)

    def await_probes(self, incident: str, timeout_s: float = 60.0) -> dict[str, Any]:
        """A slow link's incident once the service's probe campaign has written its conclusion
        (the fault stays on meanwhile), or as it is after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            inc: dict[str, Any] = self.http.get(f"{self.url}/v1/incidents/{incident}").json()
            probes = (inc.get("evidence") or {}).get("probes")
            if probes or time.monotonic() > deadline or inc.get("state") != "open":
                self.say(f"  probes: {probes.get('reason') if probes else 'no conclusion'}")
                return inc
            self.check_alive()
            time.sleep(0.5)

    def run_fault(self, fault: str) -> FaultResult:
        i = self.args.target
        other = (i + 1) % self.n  # a healthy rank's progress counts the steps
        res = FaultResult(fault, i, self.host(i), self.step(), time.time_ns())
        how = {
            LabFault.COMPUTE: f"cgroup cpu quota {self.cpu_quota:g} CPU "
            f"({self.args.cpu_quota:.0%} of its healthy share)",
            LabFault.LINK: f"tc tbf {self.args.link_rate} on its veth, both ways",
            LabFault.HANG: "SIGSTOP",
            LabFault.SLOW: f"compute x{self.args.slow_factor:g}",
        }[fault]
        self.say(f"inject {fault} on rank {i} ({self.host(i)}) at step {res.injected_step}: {how}")
        self.inject(fault, i)
        deadline = time.monotonic() + self.args.detect_timeout
        found = None
        while time.monotonic() < deadline and found is None:
            time.sleep(0.25)
            self.check_alive()
            for inc in self.incidents():
                if inc["detected_ns"] >= res.injected_ns - int(5e9) and self.matches(
                    fault, inc, i, self.host(i)
                ):
                    found = inc
                    break
        if found is not None:
            res.detected = res.localized = True
            res.incident, res.kind = found["id"], found["kind"]
            res.ranks, res.hosts = list(found["ranks"]), list(found["hosts"])
            res.summary = found["summary"]
            det = int(found["detected_ns"])
            res.delay_s = round(max(0, det - res.injected_ns) / 1e9, 2)
            if fault == LabFault.HANG:  # no steps are completed during a hang: count step times
                res.delay_steps = round(res.delay_s / self.step_time_s, 1)
            else:
                res.delay_steps = self.steps_between(other, res.injected_ns, det)
            self.say(f"  found after {res.delay_s} s / {res.delay_steps} steps: {found['summary']}")
        else:
            self.say(f"  NOT found within {self.args.detect_timeout:.0f} s")
        if found is not None and fault != LabFault.HANG and self.args.hold_steps:
            # keep the fault a while: the incident must stay put (one incident, one subject)
            self.wait_steps(self.args.hold_steps, 120.0)
            if fault == LabFault.LINK and self.agents_in_ns:
                found = self.await_probes(found["id"])
            found = self.http.get(f"{self.url}/v1/incidents/{found['id']}").json()
            res.summary, res.hosts = found["summary"], list(found["hosts"])
            if fault == LabFault.SLOW:
                res.injected_slowdown = self.args.slow_factor
                res.reported_slowdown = found.get("subject_slowdown")
                self.say(f"  reported {res.reported_slowdown}x for {res.injected_slowdown}x")
            probes = (found.get("evidence") or {}).get("probes") or {}
            res.probes = probes.get("component") or probes.get("reason")
        self.recover(fault, i)
        recovered_ns = time.time_ns()
        res.recovered_step = self.step()
        self.say(f"  recovered at step {res.recovered_step}")
        if found is not None:
            deadline = time.monotonic() + self.args.resolve_timeout
            while time.monotonic() < deadline:
                time.sleep(0.5)
                self.check_alive()
                r = self.http.get(f"{self.url}/v1/incidents/{found['id']}").json()
                if r["state"] == "resolved":
                    res.resolved = True
                    res.resolve_s = round((int(r["resolved_ns"]) - recovered_ns) / 1e9, 2)
                    self.say(f"  incident resolved {res.resolve_s} s after the recovery")
                    break
            else:
                self.say("  incident still open after the recovery")
        self.wait_steps(self.args.settle_steps, 120.0)
        return res
