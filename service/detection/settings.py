"""Detector parameters (``FAILSLOW_DETECTION__*``); their defaults are the detectors' own."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pydantic import BaseModel, Field, model_validator

from failslow.detectors.defaults import DEFAULTS

# The thresholds an operator may set for one job at run time (``failslow config set --job``),
# by setting name (FAILSLOW_DETECTION__<NAME>), with the detectors' own name for each.
TUNABLE: Mapping[str, str] = MappingProxyType({
    "late_fraction": "late_fraction",
    "compute_ratio": "compute_ratio",
    "link_ratio": "link_ratio",
    "job_slowdown_ratio": "job_slowdown_ratio",
    "open_after": "open_after",
    "resolve_after": "resolve_after",
    "hang_timeout_floor_s": "hang_floor_s",
    "dead_host_after_s": "dead_after_s",
    "major_slowdown": "major_slowdown",
    "critical_slowdown": "critical_slowdown",
})  # fmt: skip


@dataclass(frozen=True, slots=True)
class JobTuning:
    """What operators set for one job that detection follows: paused (by hand or by a
    maintenance window: frames are consumed but not analysed), and threshold overrides (setting
    name -> value, keys of :data:`TUNABLE`)."""

    paused: bool = False
    overrides: Mapping[str, float] = field(default_factory=dict)


class DetectionSettings(BaseModel):
    interval_s: float = Field(default=0.25, gt=0, description="Period of the detection loop.")
    max_frames_per_pass: int = Field(
        default=128, gt=0,
        description="Frames one job may have analysed in one pass; the rest wait for the next "
        "passes, so that one job's burst (12,000 steps in one envelope) cannot hold detection "
        "up for every other job.",
    )  # fmt: skip
    max_backlog_rank_frames: int = Field(
        default=1_000_000, gt=0,
        description="Frames of one job waiting for analysis, times its ranks (~216 B each: "
        "1M frames of a one-rank job, 100 of a 10,000-rank job, never fewer than "
        "max_frames_per_pass); past it the oldest are skipped (failslow_frames_skipped_total).",
    )  # fmt: skip
    late_fraction: float = Field(
        default=DEFAULTS.late_fraction,
        gt=0,
        description="Lateness (peers' wait per step / step time) above which a rank is suspect.",
    )
    compute_ratio: float = Field(
        default=DEFAULTS.compute_ratio,
        gt=1,
        description="Compute time vs role peers above which a rank is suspect.",
    )
    link_ratio: float = Field(
        default=DEFAULTS.link_ratio,
        gt=0,
        lt=1,
        description="Bus bandwidth vs its references below which a communicator is suspect.",
    )
    job_slowdown_ratio: float = Field(
        default=DEFAULTS.job_slowdown_ratio,
        gt=1,
        description="Job step time vs baseline that makes a job-wide slowdown.",
    )
    hang_timeout_floor_s: float = Field(
        default=DEFAULTS.hang_floor_s,
        gt=0,
        description="Shortest time a collective may block before it is hung.",
    )
    hang_startup_timeout_s: float = Field(
        default=DEFAULTS.hang_startup_s,
        gt=0,
        description="How long a communicator's first collective may block (waiting for the "
        "last rank to start, lazy connection set-up) before it is hung.",
    )
    dead_host_after_s: float = Field(
        default=DEFAULTS.dead_after_s,
        gt=0,
        description="Event time without envelopes after which a host is dead.",
    )
    window: int = Field(
        default=DEFAULTS.window,
        ge=1,
        description="Frames in the sliding decision window.",
    )
    open_after: int = Field(
        default=DEFAULTS.open_after,
        ge=1,
        description="Suspect frames within the window before an incident opens.",
    )
    resolve_after: int = Field(
        default=DEFAULTS.resolve_after,
        ge=1,
        description="Consecutive clean frames before an incident resolves.",
    )
    warmup_frames: int = Field(
        default=DEFAULTS.warmup_frames,
        ge=0,
        description="Frames ignored at job start (compilation, warm-up).",
    )
    baseline_frames: int = Field(
        default=DEFAULTS.baseline_frames,
        ge=10,
        description="Baseline = fastest 10-step median step time within this many recent frames.",
    )
    major_slowdown: float = Field(
        default=DEFAULTS.major_slowdown,
        ge=1,
        description="Job slowdown (step time / baseline) from which an incident is major: the "
        "policy acts on major and critical incidents only (docs/mitigation.md).",
    )
    critical_slowdown: float = Field(
        default=DEFAULTS.critical_slowdown,
        ge=1,
        description="Job slowdown from which an incident is critical (a hang always is).",
    )
    close_stale_after_s: float = Field(
        default=900.0,
        ge=0,
        description="Open incidents of a job that sent nothing for this long (wall time) close "
        "as stale, saying when it stopped reporting. 0: never.",
    )
    top_k: int = Field(
        default=5, ge=0, description="Slowest ranks per job exported with a rank label."
    )
    history_every_steps: int = Field(
        default=10, ge=1, description="Steps per bucket of downsampled history."
    )
    history_rank_buckets: int = Field(
        default=1000,
        ge=1,
        description="Newest buckets of per-rank history kept per job (17-20 bytes per rank per "
        "bucket in SQLite: 1.7 MB a bucket at 100K ranks); older ones are deleted as new ones "
        "are written. The job's step-time history, a row per bucket, is kept whole.",
    )

    @model_validator(mode="after")
    def _window(self) -> DetectionSettings:
        if self.open_after > self.window:
            raise ValueError("detection.open_after must be <= detection.window")
        if self.major_slowdown > self.critical_slowdown:
            raise ValueError("detection.major_slowdown must be <= detection.critical_slowdown")
        return self

    def tuned(self, overrides: Mapping[str, object]) -> DetectionSettings:
        """These settings with ``overrides`` applied and validated like the environment's
        (ValueError naming the key: not tunable, or a bad value)."""
        unknown = sorted(set(overrides) - set(TUNABLE))
        if unknown:
            raise ValueError(
                f"{', '.join(unknown)}: not a per-job setting (those are: {', '.join(TUNABLE)})"
            )
        return DetectionSettings.model_validate({**self.model_dump(), **overrides})

    def detector_values(self) -> dict[str, float]:
        """The tunable values by the detectors' names (JobPipeline.tune)."""
        return {ours: float(getattr(self, name)) for name, ours in TUNABLE.items()}
