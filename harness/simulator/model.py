"""What the simulated job is made of: its workload, network and noise, the plan it runs
under, and the costs of its compute segments and transfers under the injected faults."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from failslow.harness.simulator.faults import Fault, FaultKind
from failslow.harness.simulator.layout import Layout

ALG_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
    "barrier": lambda n: 0.0,
}


@dataclass(frozen=True)
class Workload:
    microbatches: int = 4
    tp_per_chunk: int = 2  # TP collectives per forward (and per backward) chunk of a microbatch
    fwd_s: float = 0.012  # one forward compute segment
    bwd_s: float = 0.024  # one backward compute segment
    optimizer_s: float = 0.02
    tp_bytes: int = 16 << 20
    pp_bytes: int = 8 << 20
    dp_bytes: int = 256 << 20
    dp_buckets: int = 1


@dataclass(frozen=True)
class Network:
    nvlink_bytes_s: float = 200e9
    nic_bytes_s: float = 25e9
    latency_s: float = 20e-6


@dataclass(frozen=True)
class Noise:
    jitter: float = 0.02  # lognormal sigma of each compute segment
    static_spread: float = 0.01  # per-rank fixed speed spread (sigma)
    net_jitter: float = 0.05  # lognormal sigma of transfer times
    exit_jitter_s: float = 20e-6  # spread of members' exit from one collective
    spike_prob: float = 0.01  # per step: one random rank gets one very slow segment
    spike_factor: tuple[float, float] = (2.0, 5.0)
    checkpoint_every: int = 0  # steps between job-wide stalls (0 = none)
    checkpoint_s: float = 1.0
    clock_offset_s: float = 0.002  # per-host clock offsets drawn from U(-x, x)
    # Hiccups (no fault): per rank and step, the chance that one of its compute segments (any,
    # the step's last included: the stall then crosses the step boundary) takes 2-4x as long
    hiccup_prob: float = 0.0
    hiccup_factor: tuple[float, float] = (2.0, 4.0)
    # Drifting heterogeneity (no fault): these ranks compute ``drift_level`` x slower than the
    # others, wandering by +-``drift_amplitude`` with period ``drift_period`` steps (each rank
    # in its own phase), as some workers of real clusters do for hours.
    drift_ranks: tuple[int, ...] = ()
    drift_level: float = 1.07
    drift_amplitude: float = 0.035
    drift_period: int = 120
    # Data-dependent step time (no fault): each data-parallel replica's work per step (its
    # batch's tokens: variable sequence lengths) is lognormal with this sigma around
    # ``work_tokens``, correlated from step to step by ``work_corr`` (AR(1) in log space:
    # length-bucketed sampling gives a replica long batches for a stretch of steps); its ranks'
    # compute scales with it and their step records say it.
    work_spread: float = 0.0
    work_corr: float = 0.0
    work_tokens: int = 4096

    @staticmethod
    def none() -> Noise:
        return Noise(0.0, 0.0, 0.0, 0.0, 0.0, (1.0, 1.0), 0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class PlanState:
    """What the simulated job runs under from a step on (a published failslow plan)."""

    version: int = 0
    shares: tuple[int, ...] | None = None  # micro-batches per data-parallel index
    comm_names: tuple[tuple[str, str], ...] = ()  # layout comm -> re-created comm (new order)


class Costs:
    """Compute factors, stuck ranks and transfer times under the faults (a part of
    :class:`~failslow.harness.simulator.engine.Simulation`)."""

    if TYPE_CHECKING:
        layout: Layout
        faults: tuple[Fault, ...]
        replaced: set[str]
        net: Network
        noise: Noise
        rng: np.random.Generator
        ranks: list
        static: np.ndarray

    def _gone(self, fault: Fault) -> bool:
        """The fault's hardware left the job (its host was replaced after an isolation)."""
        if not self.replaced:  # the common case, on every compute segment: no set building
            return False
        hosts = set(fault.hosts) | {self.layout.host(r) for r in fault.ranks}
        return bool(hosts) and hosts <= self.replaced

    def _segment_s(self, r: Any, host: str, base_s: float) -> float:
        """How long one compute segment of rank ``r`` (at ``r.pc - 1``) takes: its static
        speed, the faults, jitter, and the noise's spikes and hiccups."""
        seconds = base_s * self.static[r.rank] * self._compute_factor(r.rank, host, r.step)
        seconds *= r.work
        nz = self.noise
        if nz.jitter:
            seconds *= math.exp(self.rng.normal(0, nz.jitter))
        if r.spike is not None and r.spike[0] == r.step:
            seconds *= float(self.rng.uniform(*nz.spike_factor))
            r.spike = None
        if r.hiccup == (r.step, r.pc - 1):
            seconds *= float(self.rng.uniform(*nz.hiccup_factor))
            r.hiccup = None
        return seconds

    def _compute_factor(self, rank: int, host: str, step: int) -> float:
        f = 1.0
        nz = self.noise
        if nz.drift_ranks and rank in nz.drift_ranks:
            phase = 2 * math.pi * (step / nz.drift_period + 0.37 * rank)
            f = nz.drift_level + nz.drift_amplitude * math.sin(phase)
        for fault in self.faults:
            if not fault.active(step) or self._gone(fault):
                continue
            hits = (
                (fault.kind == FaultKind.SLOW_GPU and rank in fault.ranks)
                or (fault.kind == FaultKind.SLOW_NODE and host in fault.hosts)
                or fault.kind == FaultKind.JOB_SLOWDOWN
            )
            if hits:
                f *= fault.factor
        return f

    def _stuck(self, rank: int, host: str, step: int) -> bool:
        for fault in self.faults:
            if self._gone(fault):
                continue
            if fault.kind == FaultKind.HANG and rank in fault.ranks and fault.active(step):
                return True
            if fault.kind == FaultKind.DEAD_HOST and host in fault.hosts and fault.active(step):
                return True
        return False

    def _link_bw(self, a: int, b: int, step: int) -> float:
        if a == b:
            return self.net.nvlink_bytes_s
        hosts = self.layout.hosts
        bw_a = bw_b = self.net.nic_bytes_s
        pair = 1.0
        for fault in self.faults:
            if not fault.active(step) or self._gone(fault):
                continue
            if fault.kind == FaultKind.SLOW_NIC:
                if hosts[a] in fault.hosts:
                    bw_a /= fault.factor
                if hosts[b] in fault.hosts:
                    bw_b /= fault.factor
            elif fault.kind == FaultKind.SLOW_LINK and {hosts[a], hosts[b]} == set(fault.hosts):
                pair *= fault.factor
        return min(bw_a, bw_b) / pair

    def _transfer(self, members: tuple[int, ...], op: str, nbytes: int, step: int) -> float:
        n = len(members)
        if n < 2:
            return self.net.latency_s
        hosts = [self.ranks[m].host for m in members]
        if op in ("send", "recv"):
            bw = self._link_bw(hosts[0], hosts[1], step)
            factor = 1.0
        else:
            bw = min(self._link_bw(hosts[i], hosts[(i + 1) % n], step) for i in range(n))
            factor = ALG_FACTOR[op](n)
        t = self.net.latency_s * (n - 1 if op not in ("send", "recv") else 1) + factor * nbytes / bw
        if self.noise.net_jitter:
            t *= math.exp(self.rng.normal(0, self.noise.net_jitter))
        return t
