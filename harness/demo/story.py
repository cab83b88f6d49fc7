"""The demo's story: a 64-rank job, a slow GPU that recovers, then a slow NIC."""

from __future__ import annotations

from failslow.harness.simulator import Fault, Layout, Scenario
from failslow.harness.simulator.model import Noise, Workload

JOB = "demo-llm-64"
MICROBATCHES = 8


def story(fast: bool) -> Scenario:
    layout = Layout(tp=4, pp=2, dp=8, gpus_per_host=8)
    if fast:
        steps, gpu, nic = 90, (20, 64), (68, None)
    else:
        steps, gpu, nic = 200, (30, 90), (120, 180)
    return Scenario(
        job=JOB,
        layout=layout,
        steps=steps,
        # 8 micro-batches per data-parallel rank (64 per step): fine enough to rebalance
        workload=Workload(microbatches=MICROBATCHES, fwd_s=0.006, bwd_s=0.012),
        noise=Noise(checkpoint_every=50, checkpoint_s=1.0, spike_prob=0.02),
        faults=(
            Fault("slow_gpu", gpu[0], gpu[1], factor=1.6, ranks=(13,)),
            Fault("slow_nic", nic[0], nic[1], factor=6.0, hosts=("node-005",)),
        ),
        seed=7,
    )
