"""The discrete-event engine: ranks run their per-step programs; collectives rendezvous.

Each rank executes compute segments, tensor-parallel collectives, pipeline send/recv (GPipe
order) and data-parallel collectives. A collective (or a send/recv pair) completes when its last
member arrives, plus a transfer time from the message size and the slowest link its ring crosses;
members then leave with a little exit jitter. Records carry each host's own clock (offset).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from failslow.harness.simulator.faults import Fault, FaultKind
from failslow.harness.simulator.layout import CommSpec, Layout
from failslow.harness.simulator.model import Costs, Network, Noise, PlanState, Workload
from failslow.harness.simulator.program import step_program


@dataclass(slots=True)
class _Rank:
    rank: int
    host: int
    step: int = -1
    ops: list[tuple[Any, ...]] = field(default_factory=list)
    pc: int = 0
    step_start: float = 0.0
    seq: dict[str, int] = field(default_factory=dict)
    blocked: tuple[Any, ...] | None = None  # (comm, seq, op, nbytes, arrival, peer)
    inflight_reported: bool = False
    dead: bool = False
    spike: tuple[int, int] | None = None  # (step, op index) of a noise spike
    hiccup: tuple[int, int] | None = None  # (step, op index) of a stall (Noise.hiccup_prob)
    work: float = 1.0  # this step's work relative to the usual (Noise.work_spread)
    epoch: int = 0  # bumped by a restart: events of an earlier epoch are dropped
    restarting: bool = False


class Simulation(Costs):
    """Run with :meth:`run_until` and collect records with :meth:`drain`."""

    def __init__(
        self,
        layout: Layout,
        *,
        steps: int,
        workload: Workload | None = None,
        network: Network | None = None,
        noise: Noise | None = None,
        faults: tuple[Fault, ...] = (),
        seed: int = 0,
        t0_ns: int = 1_780_000_000_000_000_000,
        inflight_after_s: float = 0.25,
    ) -> None:
        self.layout = layout
        self.steps = steps
        self.work = workload or Workload()
        self.net = network or Network()
        self.noise = noise if noise is not None else Noise()
        self.faults = faults
        self.rng = np.random.default_rng(seed)
        self._work: dict[tuple[int, int], float] = {}  # (step, replica) -> its work
        self._work_log: dict[int, float] = {}  # replica -> log of its latest work (AR(1))
        self.t0_ns = t0_ns
        self.inflight_after_s = inflight_after_s
        n = layout.world
        self.static = np.clip(1 + self.rng.normal(0, self.noise.static_spread, n), 0.9, 1.1)
        off = self.noise.clock_offset_s
        self.offset_ns = (self.rng.uniform(-off, off, layout.n_hosts) * 1e9).astype(np.int64)
        self.ranks = [_Rank(r, layout.host_index(r)) for r in range(n)]
        self.arrivals: dict[tuple[str, int], dict[int, tuple[float, tuple[Any, ...]]]] = {}
        self.heap: list[tuple[float, int, int, int]] = []
        self.out: list[tuple[float, int, int, tuple[Any, ...]]] = []  # (emit_t, tie, host, record)
        self._tie = 0
        self.now = 0.0
        self.finished = 0
        self.host_dead_at: dict[int, float] = {}
        self.fault_onset: dict[int, float] = {}  # fault index -> sim time its first step began
        self.fault_end: dict[int, float] = {}
        # Closed loop: plans the job follows, from a step on; comms re-created in a new ring
        # order (a re-plan makes NCCL build a new communicator, under a new id); hosts replaced
        # by a spare after an isolation + restart (the spare reports under the same name).
        self.plans: list[tuple[int, PlanState]] = [(0, PlanState())]
        self.extra_comms: dict[str, CommSpec] = {}
        self.replaced: set[str] = set()
        self.restarts: list[tuple[float, int]] = []  # (sim time, resume step)
        self.restart_epoch = 0
        for r in self.ranks:
            self._push(0.0, r.rank)

    # -- helpers -------------------------------------------------------------------------------
    def _push(self, t: float, rank: int) -> None:
        self._tie += 1
        heapq.heappush(self.heap, (t, self._tie, rank, self.ranks[rank].epoch))

    def _emit(self, t: float, host: int, record: tuple[Any, ...]) -> None:
        self._tie += 1
        heapq.heappush(self.out, (t, self._tie, host, record))

    def ns(self, t: float, host: int) -> int:
        return self.t0_ns + int(round(t * 1e9)) + int(self.offset_ns[host])

    # -- the closed loop: plans, re-created comms, restarts ---------------------------------------
    def plan_at(self, step: int) -> PlanState:
        for start, plan in reversed(self.plans):
            if start <= step:
                return plan
        return self.plans[0][1]

    def comm_spec(self, name: str) -> CommSpec:
        return self.extra_comms.get(name) or self.layout.comm(name)

    def comms(self) -> list[CommSpec]:
        """Every communicator the job has created so far (re-created ones included)."""
        return [*self.layout.comms, *self.extra_comms.values()]

    def comms_of_host(self, host: str) -> list[CommSpec]:
        mine = set(self.layout.ranks_of_host(host))
        return [c for c in self.comms() if mine & set(c.ranks)]

    def next_boundary(self) -> int:
        """The first step no rank has started yet: where a new plan can take effect."""
        return max(r.step for r in self.ranks) + 1

    def apply_plan(
        self,
        *,
        version: int,
        shares: tuple[int, ...] | None = None,
        rank_order: dict[str, tuple[int, ...]] | None = None,
        excluded_hosts: tuple[str, ...] = (),
        restart_epoch: int = 0,
        restart_s: float = 30.0,
    ) -> int:
        """Follow a published plan from the next step boundary; returns that step.

        Shares change each data-parallel replica's micro-batches; a new ring order re-creates
        the communicator (new id, new order, so its ring crosses other links); a higher restart
        epoch restarts the job after ``restart_s`` with excluded hosts replaced by spares.
        """
        if shares is not None and len(shares) != self.layout.dp:
            raise ValueError(f"{len(shares)} shares for {self.layout.dp} data-parallel ranks")
        names = dict(self.plans[-1][1].comm_names)
        for comm, order in (rank_order or {}).items():
            base = comm.split("@v", 1)[0]
            if base not in {c.comm for c in self.layout.comms}:
                continue
            spec = self.layout.comm(base)
            if sorted(order) != sorted(spec.ranks):
                raise ValueError(f"rank order for {comm} is not a permutation of its members")
            new = f"{base}@v{version}"
            self.extra_comms[new] = CommSpec(new, spec.kind, tuple(order))
            names[base] = new
        plan = PlanState(
            version=version,
            shares=tuple(shares) if shares is not None else self.plans[-1][1].shares,
            comm_names=tuple(sorted(names.items())),
        )
        if restart_epoch > self.restart_epoch:
            self.restart_epoch = restart_epoch
            step = self.restart(excluded_hosts, restart_s)
        else:
            step = self.next_boundary()
        self.plans.append((step, plan))
        return step

    def restart(self, excluded_hosts: tuple[str, ...], pause_s: float) -> int:
        """Stop every rank now, replace the excluded hosts, resume after ``pause_s`` (checkpoint
        reload) at the next step number (the lost work is in the pause)."""
        t = self.now
        resume = self.next_boundary()
        self.replaced |= set(excluded_hosts)
        for h in excluded_hosts:
            if h in self.layout.hosts:
                self.host_dead_at.pop(self.layout.hosts.index(h), None)
        seqs: dict[str, int] = {}
        for r in self.ranks:
            for comm, n in r.seq.items():
                seqs[comm] = max(seqs.get(comm, 0), n)
        self.arrivals.clear()
        for r in self.ranks:
            r.epoch += 1
            r.seq = dict(seqs)
            r.blocked = None
            r.dead = False
            r.ops, r.pc = [], 0
            r.spike = None
            r.step = resume - 1
            r.restarting = True
            self._push(t + pause_s, r.rank)
        self.restarts.append((t, resume))
        return resume

    def _next_step(self, r: _Rank, t: float) -> bool:
        """Start the rank's next step at time t; False when the run is over for it."""
        if r.restarting:
            r.restarting = False
        elif r.step >= 0:
            rec: tuple[Any, ...] = (
                "s", r.rank, r.step, self.ns(r.step_start, r.host), self.ns(t, r.host)
            )  # fmt: skip
            if self.noise.work_spread:
                rec += (round(r.work * self.noise.work_tokens),)
            self._emit(t, r.host, rec)
        r.step += 1
        if r.step >= self.steps:
            self.finished += 1
            return False
        for i, fault in enumerate(self.faults):
            if fault.active(r.step) and i not in self.fault_onset:
                self.fault_onset[i] = t
            if fault.end_step is not None and r.step == fault.end_step and i not in self.fault_end:
                self.fault_end[i] = t
        r.ops = step_program(self.layout, self.work, self.plan_at(r.step), r.rank)
        if self.noise.work_spread:
            r.work = self._replica_work(r.rank, r.step)
        r.pc = 0
        r.step_start = t
        ck = self.noise.checkpoint_every
        if ck and r.step > 0 and r.step % ck == 0:
            r.ops.append(("compute_fixed", self.noise.checkpoint_s))
        if self.noise.hiccup_prob and self.rng.random() < self.noise.hiccup_prob:
            computes = [i for i, op in enumerate(r.ops) if op[0] == "compute"]
            r.hiccup = (r.step, computes[int(self.rng.integers(0, len(computes)))])
        if r.rank == 0 and self.noise.spike_prob and self.rng.random() < self.noise.spike_prob:
            victim = self.ranks[int(self.rng.integers(0, len(self.ranks)))]
            victim.spike = (victim.step + 1, 0)
        return True

    def _replica_work(self, rank: int, step: int) -> float:
        """One draw per (step, data-parallel replica): its tensor- and pipeline-parallel ranks
        process the same batch."""
        replica = self.layout.coords(rank)[1]
        key = (step, replica)
        w = self._work.get(key)
        if w is None:
            rho = self.noise.work_corr
            x = float(self.rng.normal(0, self.noise.work_spread)) * math.sqrt(1 - rho * rho)
            x += rho * self._work_log.get(replica, 0.0)
            self._work_log[replica] = x
            w = self._work[key] = math.exp(x)
            if len(self._work) > 4 * self.layout.world:
                self._work.pop(next(iter(self._work)))
        return w

    # -- execution -----------------------------------------------------------------------------
    def run_until(self, t_end: float) -> None:
        while self.heap and self.heap[0][0] <= t_end:
            t, _, rank, epoch = heapq.heappop(self.heap)
            if epoch == self.ranks[rank].epoch:
                self._advance(self.ranks[rank], t)
        self.now = max(self.now, t_end)

    def _advance(self, r: _Rank, t: float) -> None:
        lay = self.layout
        host = lay.hosts[r.host]
        while True:
            if (r.step < 0 or r.pc >= len(r.ops)) and not self._next_step(r, t):
                return
            if self._stuck(r.rank, host, r.step):
                r.dead = True
                for fault in self.faults:
                    if fault.kind == FaultKind.DEAD_HOST and host in fault.hosts:
                        self.host_dead_at.setdefault(r.host, t)
                return
            op = r.ops[r.pc]
            r.pc += 1
            if op[0] == "compute":
                self._push(t + self._segment_s(r, host, op[1]), r.rank)
                return
            if op[0] == "compute_fixed":
                self._push(t + op[1], r.rank)
                return
            self._arrive(r, t, op)
            return

    def _arrive(self, r: _Rank, t: float, op: tuple[Any, ...]) -> None:
        comm = op[1]
        seq = r.seq.get(comm, 0)
        r.seq[comm] = seq + 1
        peer = op[4] if op[0] == "p2p" else None
        r.blocked = (comm, seq, op[2], op[3], t, peer)
        r.inflight_reported = False
        key = (comm, seq)
        members = self.comm_spec(comm).ranks
        got = self.arrivals.setdefault(key, {})
        got[r.rank] = (t, op)
        if len(got) < len(members):
            return
        del self.arrivals[key]
        last = max(a for a, _ in got.values())
        step = max(self.ranks[m].step for m in members)
        coll_op = "send" if op[0] == "p2p" else op[2]
        end = last + self._transfer(members, coll_op, op[3], step)
        for m in members:
            arrival, mop = got[m]
            mr = self.ranks[m]
            exit_t = end + (
                abs(self.rng.normal(0, self.noise.exit_jitter_s))
                if self.noise.exit_jitter_s
                else 0.0
            )
            mpeer = mop[4] if mop[0] == "p2p" else None
            rec = (
                "c",
                m,
                comm,
                seq,
                mop[2],
                mop[3],
                self.ns(arrival, mr.host),
                self.ns(exit_t, mr.host),
                mpeer,
            )
            self._emit(exit_t, mr.host, rec)
            mr.blocked = None
            self._push(exit_t, m)

    # -- output --------------------------------------------------------------------------------
    def drain(self, t: float) -> list[tuple[int, tuple[Any, ...]]]:
        """Records whose event happened by sim time ``t``, plus in-flight reports, by host."""
        items: list[tuple[int, tuple[Any, ...]]] = []
        while self.out and self.out[0][0] <= t:
            emit_t, _, host, rec = heapq.heappop(self.out)
            dead = self.host_dead_at.get(host)
            if dead is not None and emit_t > dead:
                continue
            items.append((host, rec))
        for r in self.ranks:
            if r.blocked is not None and not r.inflight_reported:
                comm, seq, opname, nbytes, arrival, peer = r.blocked
                if t - arrival >= self.inflight_after_s and r.host not in self.host_dead_at:
                    items.append(
                        (
                            r.host,
                            (
                                "c",
                                r.rank,
                                comm,
                                seq,
                                opname,
                                nbytes,
                                self.ns(arrival, r.host),
                                None,
                                peer,
                            ),
                        )
                    )
                    r.inflight_reported = True
        return items

    @property
    def done(self) -> bool:
        return self.finished == len(self.ranks) and not self.out

    @property
    def stalled(self) -> bool:
        """Nothing can make progress any more (a hang): no events left, not finished."""
        return not self.heap and self.finished < len(self.ranks)

    def host_alive(self, host: int, t: float) -> bool:
        dead = self.host_dead_at.get(host)
        return dead is None or t <= dead
