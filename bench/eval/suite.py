"""The scenario suite: every fault kind, several severities, world sizes and parallel layouts."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from bench.eval import concurrent, patterns
from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise, Workload

L16 = Layout(
    tp=2, pp=2, dp=4, gpus_per_host=4
)  # 4 hosts; node-000/001 stage 0, node-002/003 stage 1
L64 = Layout(tp=4, pp=2, dp=8, gpus_per_host=8)  # 8 hosts; node-000..003 stage 0
L32DP = Layout(tp=1, pp=1, dp=32, gpus_per_host=8)  # pure data parallel, 4 hosts
L32PP = Layout(tp=1, pp=4, dp=8, gpus_per_host=4)  # deep pipeline, 8 hosts
LAYOUTS = {"16r-tp2pp2dp4": L16, "64r-tp4pp2dp8": L64, "32r-dp32": L32DP, "32r-pp4dp8": L32PP}

NOISE = Noise()  # per-op jitter 2%, static spread 1%, 1% spikes, 2 ms clock offsets
NOISY = Noise(
    jitter=0.04, static_spread=0.02, spike_prob=0.05, checkpoint_every=50, checkpoint_s=1.5
)

ONSET = 60
# Steps of ~1.3-1.7 s (the default workload's compute x4) with agents flushing every 0.5 s (the
# SDK's default): a hang is named from the agents' in-flight reports, sent 1 s after an op
# began, so on the default ~0.4 s steps no hang can be named within 2 steps; on these it can.
LONG_STEPS = Workload(fwd_s=0.048, bwd_s=0.096, optimizer_s=0.08)
STEPS = 150
# families of cases without a fault: every incident there is false
HEALTHY_FAMILIES = frozenset({"healthy", "noisy-healthy"}) | patterns.HEALTHY_PATTERNS


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    scenario: Scenario
    factor: float | None = None  # severity of slow-downs (>= 1.2 counts for the targets)


def _pair_adjacent_in_pipeline(layout: Layout) -> tuple[str, str]:
    """Two hosts joined by pipeline send/recv (so a slow cable between them matters)."""
    r0 = layout.rank(0, 0, 0)
    r1 = layout.rank(0, 0, 1)
    return layout.host(r0), layout.host(r1)


def cases(*, quick: bool = False, seeds: int = 2, long_steps: int = 2000) -> list[Case]:
    rng = random.Random(2026)
    out: list[Case] = []
    layouts = {"16r-tp2pp2dp4": L16, "64r-tp4pp2dp8": L64} if quick else LAYOUTS

    def add(
        family: str,
        name: str,
        layout: Layout,
        faults: tuple[Fault, ...],
        *,
        factor: float | None = None,
        steps: int = STEPS,
        noise: Noise = NOISE,
        seed: int = 0,
        tail: float = 20.0,
        workload: Workload | None = None,
        batch_s: float = 1.0,
    ) -> None:
        job = f"{name}-s{seed}".replace(".", "p")
        sc = Scenario(
            job=job,
            layout=layout,
            steps=steps,
            noise=noise,
            faults=faults,
            seed=seed,
            hang_tail_s=tail,
            workload=workload or Workload(),
            batch_s=batch_s,
        )
        out.append(Case(job, family, sc, factor))

    out.append(
        Case(
            "healthy-64r",
            "healthy",
            Scenario(
                job="healthy-64r",
                layout=L64,
                steps=500 if quick else long_steps,
                noise=NOISE,
                seed=1,
            ),
        )
    )
    out.append(
        Case(
            "noisy-healthy-32r",
            "noisy-healthy",
            Scenario(
                job="noisy-healthy-32r",
                layout=L32PP,
                steps=500 if quick else long_steps,
                noise=NOISY,
                seed=2,
            ),
        )
    )
    for seed in range(seeds):
        for lname, lay in layouts.items():
            for factor in (1.1, 1.2, 1.5, 3.0):
                rank = rng.randrange(lay.world)
                add(
                    "slow_gpu",
                    f"gpu-{factor}x-{lname}",
                    lay,
                    (Fault("slow_gpu", ONSET, factor=factor, ranks=(rank,)),),
                    factor=factor,
                    seed=seed,
                )
            host = lay.hosts[rng.randrange(lay.n_hosts)]
            for factor in (1.2, 1.5):
                add(
                    "slow_node",
                    f"node-{factor}x-{lname}",
                    lay,
                    (Fault("slow_node", ONSET, factor=factor, hosts=(host,)),),
                    factor=factor,
                    seed=seed,
                )
            if lay.n_hosts >= 4 and lay.pp > 1:
                nic = lay.hosts[rng.randrange(lay.n_hosts)]
                add(
                    "slow_nic",
                    f"nic-3x-{lname}",
                    lay,
                    (Fault("slow_nic", ONSET, factor=3.0, hosts=(nic,)),),
                    factor=3.0,
                    seed=seed,
                )
                add(
                    "recovering",
                    f"recovering-nic-{lname}",
                    lay,
                    (Fault("slow_nic", ONSET, ONSET + 40, factor=3.0, hosts=(nic,)),),
                    factor=3.0,
                    seed=seed,
                )
                a, b = _pair_adjacent_in_pipeline(lay)
                add(
                    "slow_link",
                    f"link-3x-{lname}",
                    lay,
                    (Fault("slow_link", ONSET, factor=3.0, hosts=(a, b)),),
                    factor=3.0,
                    seed=seed,
                )
            add(
                "hang",
                f"stuck-rank-{lname}",
                lay,
                (Fault("hang", ONSET, ranks=(rng.randrange(lay.world),)),),
                seed=seed,
                steps=ONSET + 30,
            )
            add(
                "dead_host",
                f"dead-host-{lname}",
                lay,
                (Fault("dead_host", ONSET, hosts=(lay.hosts[rng.randrange(lay.n_hosts)],)),),
                seed=seed,
                steps=ONSET + 30,
            )
            add(
                "job_slowdown",
                f"job-1.3x-{lname}",
                lay,
                (Fault("job_slowdown", ONSET, factor=1.3),),
                factor=1.3,
                seed=seed,
            )
            rank = rng.randrange(lay.world)
            add(
                "intermittent",
                f"intermittent-gpu-{lname}",
                lay,
                (Fault("slow_gpu", ONSET, factor=1.5, ranks=(rank,), period=15),),
                factor=1.5,
                seed=seed,
            )
            rank = rng.randrange(lay.world)
            add(
                "recovering",
                f"recovering-gpu-{lname}",
                lay,
                (Fault("slow_gpu", ONSET, ONSET + 40, factor=1.5, ranks=(rank,)),),
                factor=1.5,
                seed=seed,
            )
    patterns.cases(add, quick=quick, seeds=seeds, long_steps=long_steps, rng=random.Random(2027))
    concurrent.cases(add, quick=quick, seeds=seeds)
    long_rng = random.Random(2028)  # its own draws: the cases above stay as they were
    for seed in range(seeds):
        for lname, lay in layouts.items():
            add(
                "hang",
                f"stuck-rank-long-steps-{lname}",
                lay,
                (Fault("hang", ONSET, ranks=(long_rng.randrange(lay.world),)),),
                seed=seed,
                steps=ONSET + 20,
                workload=LONG_STEPS,
                batch_s=0.5,
            )
    # stragglers far past the hang timeout's reach, with 1% hiccups: their peers wait in their
    # collectives for most of a step, which must be a slow GPU and never a hang
    straggler_rng = random.Random(2029)
    hiccups = replace(NOISE, hiccup_prob=0.01)
    for seed in range(seeds):
        for lname, lay in layouts.items():
            for factor in (5.0, 10.0):
                add(
                    "slow_gpu",
                    f"straggler-{factor}x-hiccups-{lname}",
                    lay,
                    (Fault("slow_gpu", ONSET, factor=factor,
                           ranks=(straggler_rng.randrange(lay.world),)),),
                    factor=factor,
                    seed=seed,
                    noise=hiccups,
                )  # fmt: skip
    return out


def with_seed(case: Case, seed: int) -> Case:
    return replace(case, scenario=replace(case.scenario, seed=seed))
