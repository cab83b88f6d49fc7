"""Run a simulated scenario through the real ingest state and detection pipeline, in-process."""

from __future__ import annotations

from dataclasses import dataclass

from agents.simulator import Scenario
from detectors.pipeline import Finding, JobPipeline
from service.detection.engine import peer_groups
from service.ingest.validate import parse_envelope
from service.jobs.state import JobState
from service.settings import DetectionSettings, StateSettings


@dataclass
class Run:
    findings: list[tuple[int, Finding]]  # (rank, finding)
    frames: int
    state: JobState
    pipeline: JobPipeline

    def opened(self, kind: str = "slow_gpu") -> list[tuple[int, Finding]]:
        return [(r, f) for r, f in self.findings if f.status == "opened" and f.kind == kind]

    def resolved(self) -> list[tuple[int, Finding]]:
        return [(r, f) for r, f in self.findings if f.status == "resolved"]


def run(
    scenario: Scenario, *, strip_steps: bool = False, detection: DetectionSettings | None = None
) -> Run:
    d = detection or DetectionSettings()
    state = JobState(scenario.job, StateSettings())
    pipe = JobPipeline(
        late_fraction=d.late_fraction,
        compute_ratio=d.compute_ratio,
        window=d.window,
        open_after=d.open_after,
        resolve_after=d.resolve_after,
        warmup_frames=d.warmup_frames,
        baseline_frames=d.baseline_frames,
    )
    findings: list[tuple[int, Finding]] = []
    frames = 0

    def drain(flush: bool = False) -> None:
        nonlocal frames
        state.frames.add_collectives(state.assembler.take_ready())
        closed = state.frames.advance(
            state.watermark_ns, state.topology.n_slots, flush=flush, world=state.topology.world_size
        )
        groups = peer_groups(state)
        for fr in closed:
            frames += 1
            for f in pipe.process(fr, groups):
                findings.append((state.topology.slot_rank[f.slots[0]], f))

    for env in scenario.envelopes():
        if strip_steps:
            env["steps"] = []
        result = state.apply(parse_envelope(env))
        assert not result.rejected, result.rejected[:3]
        drain()
    drain(flush=True)
    return Run(findings, frames, state, pipe)
