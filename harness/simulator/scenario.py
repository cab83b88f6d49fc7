"""A scenario: layout + workload + noise + faults, turned into v1 envelopes and labels."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from failslow.agents.urgency import URGENT_S, Urgency
from failslow.agents.wire import collective_dict, step_dict
from failslow.harness.simulator.engine import Simulation
from failslow.harness.simulator.faults import Fault, FaultKind
from failslow.harness.simulator.layout import Layout
from failslow.harness.simulator.model import Network, Noise, Workload


@dataclass(frozen=True)
class Scenario:
    job: str = "sim-job"
    layout: Layout = field(default_factory=Layout)
    steps: int = 200
    workload: Workload = field(default_factory=Workload)
    network: Network = field(default_factory=Network)
    noise: Noise = field(default_factory=Noise)
    faults: tuple[Fault, ...] = ()
    seed: int = 0
    batch_s: float = 1.0  # the agents' flush interval
    inflight_after_s: float = 0.25  # a call blocked this long is reported in flight (the SDK's)
    # envelopes vouch for what they carry (``complete_ns``, ``inflight_after_ns``: every call
    # that ended by the send was drained, every call blocked ``inflight_after_s`` reported), as
    # failslow's agents do; False: as instrumentation that does not say
    vouch: bool = True
    t0_ns: int = 1_780_000_000_000_000_000
    hang_tail_s: float = 30.0  # how long hosts keep sending heartbeats after a hang

    def simulation(self) -> Simulation:
        return Simulation(
            self.layout,
            steps=self.steps,
            workload=self.workload,
            network=self.network,
            noise=self.noise,
            faults=self.faults,
            seed=self.seed,
            t0_ns=self.t0_ns,
            inflight_after_s=self.inflight_after_s,
        )

    def with_faults(self, *faults: Fault) -> Scenario:
        return replace(self, faults=tuple(faults))

    # -- announcements ---------------------------------------------------------------------------
    def host_ranks(self, host: str) -> list[dict[str, Any]]:
        lay = self.layout
        return [
            {"rank": r, "gpu": lay.gpu(r), "world_size": lay.world} for r in lay.ranks_of_host(host)
        ]

    def host_comms(self, host: str, sim: Simulation | None = None) -> list[dict[str, Any]]:
        comms = sim.comms_of_host(host) if sim is not None else self.layout.comms_of_host(host)
        return [{"comm": c.comm, "kind": c.kind, "ranks": list(c.ranks)} for c in comms]

    # -- envelopes -------------------------------------------------------------------------------
    def envelopes(
        self,
        sim: Simulation | None = None,
        on_batch: Callable[[Simulation, float], None] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Envelopes in send order, one per live host per ``batch_s`` (heartbeats when idle),
        and while a host's call is blocked for longer than a step one per ``URGENT_S`` (where
        envelopes vouch: as failslow's agents do, agents/urgency.py).

        ``on_batch(sim, t)`` runs after the consumer took a batch's last envelope: the closed
        loop uses it to read the service's plan and make the simulated job follow it.
        """
        sim = sim or self.simulation()
        lay = self.layout
        # agents seal every ``batch_s``, and every URGENT_S while a call of theirs is blocked
        # for longer than a step, as failslow's node agent does (agents/urgency.py): ticks of
        # URGENT_S, each host's records pending until it sends
        per = max(1, round(self.batch_s / URGENT_S))
        tick = self.batch_s / per
        pending: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]] = [
            ([], []) for _ in lay.hosts
        ]
        urgency = [Urgency() for _ in lay.hosts]
        last_sent = [0.0] * lay.n_hosts
        n = 0
        stall_since: float | None = None
        while True:
            n += 1
            t = n * tick
            regular = n % per == 0
            sim.run_until(t)
            for host, rec in sim.drain(t):
                colls, steps = pending[host]
                if rec[0] == "c":
                    colls.append(d := collective_dict(list(rec)))
                    urgency[host].collective(d)
                else:
                    steps.append(d := step_dict(list(rec)))
                    urgency[host].step(d)
            for h, name in enumerate(lay.hosts):
                if not sim.host_alive(h, t):
                    continue
                sent = sim.ns(t, h)
                urgent = t - last_sent[h] >= URGENT_S - 1e-9 and urgency[h].due(sent)
                if not (regular or (urgent and self.vouch)):
                    continue
                last_sent[h] = t
                colls, steps = pending[h]
                pending[h] = ([], [])
                yield {
                    "job": self.job,
                    "host": name,
                    "sent_ns": sent,
                    **({"complete_ns": sent, "inflight_after_ns": int(self.inflight_after_s * 1e9)}
                       if self.vouch else {}),
                    "ranks": self.host_ranks(name),
                    "comms": self.host_comms(name, sim),
                    "collectives": colls,
                    "steps": steps,
                }
            if not regular:
                continue
            if on_batch is not None:
                on_batch(sim, t)
            if sim.done:
                return
            if sim.stalled and not sim.out:
                stall_since = t if stall_since is None else stall_since
                if t - stall_since >= self.hang_tail_s:
                    return

    def labels(self, sim: Simulation) -> dict[str, Any]:
        faults = []
        for i, f in enumerate(self.faults):
            d = f.label()
            if f.kind in (FaultKind.SLOW_GPU, FaultKind.HANG):
                d["hosts"] = [self.layout.host(f.ranks[0])]
            if f.kind in (FaultKind.SLOW_NODE, FaultKind.DEAD_HOST):
                d["ranks"] = self.layout.ranks_of_host(f.hosts[0])
            onset = sim.fault_onset.get(i)
            d["onset_ns"] = self.t0_ns + int(onset * 1e9) if onset is not None else None
            end = sim.fault_end.get(i)
            d["end_ns"] = self.t0_ns + int(end * 1e9) if end is not None else None
            faults.append(d)
        return {
            "job": self.job,
            "seed": self.seed,
            "t0_ns": self.t0_ns,  # the job's start: onsets minus it over their steps = step time
            "steps": self.steps,
            "layout": {
                "tp": self.layout.tp,
                "pp": self.layout.pp,
                "dp": self.layout.dp,
                "gpus_per_host": self.layout.gpus_per_host,
                "world": self.layout.world,
            },
            "noise": asdict(self.noise),
            "faults": faults,
        }


def parse_fault(spec: str) -> Fault:
    """``kind:key=value,...`` e.g. ``slow_gpu:rank=5,start=100,factor=1.5,end=200``."""
    kind, _, rest = spec.partition(":")
    kw: dict[str, Any] = {}
    ranks: list[int] = []
    hosts: list[str] = []
    for part in filter(None, rest.split(",")):
        key, _, value = part.partition("=")
        key = key.strip()
        if key == "rank":
            ranks.append(int(value))
        elif key == "host":
            hosts.extend(value.split("+"))
        elif key == "start":
            kw["start_step"] = int(value)
        elif key == "end":
            kw["end_step"] = int(value)
        elif key == "factor":
            kw["factor"] = float(value)
        elif key == "period":
            kw["period"] = int(value)
        else:
            raise ValueError(f"unknown fault key {key!r} in {spec!r}")
    kw.setdefault("start_step", 0)
    return Fault(kind=kind.strip(), ranks=tuple(ranks), hosts=tuple(hosts), **kw)
