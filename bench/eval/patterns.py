"""Patterns of real-world noise and real layouts (issue 16), as eval cases, with precision and
recall reported per pattern.

Healthy patterns (every incident is false): hiccups (a rank's compute segment stalls 2-4x, 0.2%
and 0.4% per rank per step, the step's last segment included, so stalls cross step boundaries;
checkpoints every 50 steps), drifting heterogeneity (3 ranks at 1.07 +- 0.035 over 120 steps),
stable heterogeneity (3 ranks at a constant 1.07), and a Megatron layout with an embedding group
(kind ``other``) and expert-parallel groups (``ep``), and variable work (each data-parallel
replica's tokens per step lognormal with sigma 0.25, correlated 0.9 from step to step,
reported in the step records). Fault
patterns: a 1.2x GPU among drifting ranks, 1.2x and 1.5x GPUs in the Megatron layout (on ranks
of the embedding group), a 1.1x GPU in 5% compute noise, and a 1.2x GPU under variable work.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from failslow.harness.simulator import Fault, Layout
from failslow.harness.simulator.model import Noise

PREFIX = "pattern:"
HEALTHY_PATTERNS = frozenset(
    PREFIX + p
    for p in ("hiccups", "hiccups-2x", "drift", "stable-hetero", "megatron", "variable-work")
)
VARIABLE_WORK = Noise(work_spread=0.25, work_corr=0.9)
L64 = Layout(tp=4, pp=2, dp=8, gpus_per_host=8)
L32DP = Layout(tp=1, pp=1, dp=32, gpus_per_host=8)
MEGATRON = Layout(tp=2, pp=2, dp=4, gpus_per_host=4, embedding=True, ep=2)
ONSET = 60


def hiccups(rate: float) -> Noise:
    return Noise(hiccup_prob=rate, checkpoint_every=50, checkpoint_s=1.0)


def cases(
    add: Callable[..., None], *, quick: bool, seeds: int, long_steps: int, rng: random.Random
) -> None:
    """Add the pattern cases through the suite's ``add(family, name, layout, faults, **kw)``."""
    healthy_steps = 500 if quick else long_steps
    for seed in range(seeds):
        add(PREFIX + "hiccups", "hiccups-64r", L64, (), steps=healthy_steps, seed=seed,
            noise=hiccups(0.002))  # fmt: skip
        add(PREFIX + "hiccups-2x", "hiccups2x-64r", L64, (), steps=healthy_steps, seed=seed,
            noise=hiccups(0.004))  # fmt: skip
        drifting = tuple(rng.sample(range(L32DP.world), 3))
        add(PREFIX + "drift", "drift-32r", L32DP, (), steps=healthy_steps, seed=seed,
            noise=Noise(drift_ranks=drifting))  # fmt: skip
        add(PREFIX + "stable-hetero", "stable-hetero-32r", L32DP, (), steps=healthy_steps,
            seed=seed, noise=Noise(drift_ranks=drifting, drift_amplitude=0.0))  # fmt: skip
        victim = rng.choice([r for r in range(L32DP.world) if r not in drifting])
        add(PREFIX + "drift+gpu", "drift-gpu-1.2x-32r", L32DP,
            (Fault("slow_gpu", ONSET, factor=1.2, ranks=(victim,)),), factor=1.2, seed=seed,
            noise=Noise(drift_ranks=drifting))  # fmt: skip
        add(PREFIX + "megatron", "megatron-16r", MEGATRON, (), steps=healthy_steps, seed=seed)
        ends = [r for r in range(MEGATRON.world) if MEGATRON.embedding_comm(r)]
        for factor in (1.2, 1.5):
            rank = rng.choice(ends)
            add(PREFIX + "megatron+gpu", f"megatron-gpu-{factor}x-16r", MEGATRON,
                (Fault("slow_gpu", ONSET, factor=factor, ranks=(rank,)),), factor=factor,
                seed=seed)  # fmt: skip
        rank = rng.randrange(L64.world)
        add(PREFIX + "1.1x-in-5%-noise", "gpu-1.1x-noise5-64r", L64,
            (Fault("slow_gpu", ONSET, factor=1.1, ranks=(rank,)),), factor=1.1, seed=seed,
            noise=Noise(jitter=0.05))  # fmt: skip
        # its own random stream: the cases above keep the ranks they always had
        own = random.Random(1000 + seed)
        add(PREFIX + "variable-work", "variable-work-64r", L64, (), steps=healthy_steps,
            seed=seed, noise=VARIABLE_WORK)  # fmt: skip
        rank = own.randrange(L64.world)
        add(PREFIX + "variable-work+gpu", "variable-work-gpu-1.2x-64r", L64,
            (Fault("slow_gpu", ONSET, factor=1.2, ranks=(rank,)),), factor=1.2, seed=seed,
            noise=VARIABLE_WORK)  # fmt: skip


def summary(results: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """Per pattern: cases, faults, recall (found and localised), false incidents, precision
    (true incidents of all incidents) and the median delay in steps."""
    by: dict[str, list[Any]] = defaultdict(list)
    for r in results:
        if r.family.startswith(PREFIX):
            by[r.family.removeprefix(PREFIX)].append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in sorted(by.items()):
        faulty = [r for r in rs if PREFIX + name not in HEALTHY_PATTERNS]
        incidents = sum(len(r.incidents) for r in rs)
        false = sum(r.false_incidents for r in rs)
        delays = [r.delay_steps for r in faulty if r.delay_steps is not None]
        out[name] = {
            "cases": len(rs),
            "steps": sum(r.steps for r in rs),
            "faults": len(faulty),
            "recall": round(sum(r.localized for r in faulty) / len(faulty), 4) if faulty else None,
            "false_incidents": false,
            "precision": round((incidents - false) / incidents, 4) if incidents else None,
            "median_delay_steps": float(np.median(delays)) if delays else None,
            "max_delay_steps": max(delays) if delays else None,
        }
    return out
