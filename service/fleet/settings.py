"""Fleet ledger settings (``FAILSLOW_FLEET__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from failslow.detectors.fleet import FleetModel
from failslow.service.fleet.qualify import Norms


class FleetSettings(BaseModel):
    """What the fleet ledger keeps and how it judges hardware across jobs (docs/fleet.md)."""

    enabled: bool = Field(default=True, description="Keep the fleet ledger.")
    flush_interval_s: float = Field(
        default=30.0, gt=0, description="How often the ledger takes what detection saw."
    )
    flag_ratio: float = Field(
        default=1.03, gt=1, le=2,
        description="A part confidently slower than its peers by this ratio is flagged slow.",
    )  # fmt: skip
    z: float = Field(default=3.0, gt=0, le=10, description="Confidence: the interval's width.")
    prior_sd: float = Field(
        default=0.02, gt=0, le=1, description="The fleet prior on a part's log slowness."
    )
    tau_floor: float = Field(
        default=0.01, ge=0, le=1,
        description="A healthy part's job-to-job spread of log slowness is never taken below "
        "this (one job is never trusted more than this).",
    )  # fmt: skip
    n_eff_cap: int = Field(
        default=30, ge=1, description="The most frames one job's reading counts for."
    )
    min_frames: int = Field(
        default=20, ge=1, description="Fewer frames of a part in a job say nothing of its speed."
    )
    half_life_s: float = Field(
        default=14 * 86400.0, gt=0, description="Incidents' weight halves every this long."
    )
    prior_hours: float = Field(
        default=24.0, gt=0, description="Pseudo-exposure of the incident-rate prior (hours)."
    )
    rate_factor: float = Field(
        default=3.0, gt=1, description="A repeat offender's incident rate against the fleet's."
    )
    min_incident_jobs: int = Field(
        default=2, ge=1, description="Distinct jobs whose incidents must name a repeat offender."
    )
    fail_on_hang: bool = Field(
        default=True,
        description="A hang on a host marks it failed (out until an operator returns it).",
    )
    probation_s: float = Field(
        default=6 * 3600.0, ge=0,
        description="A host back from repair is on probation until it ran this long in jobs, "
        "clean.",
    )  # fmt: skip
    probation_jobs: int = Field(default=2, ge=0, description="... and in at least this many jobs.")
    max_jobs_per_part: int = Field(
        default=100, ge=2,
        description="Per-job readings kept per part; older ones are pooled into one archive.",
    )  # fmt: skip
    qualify_link_ratio: float = Field(
        default=Norms.link_ratio, gt=0, lt=1,
        description="Qualification: a host whose best link is below this x the fleet norm is "
        "no-go.",
    )  # fmt: skip
    qualify_compute_ratio: float = Field(
        default=Norms.compute_ratio, gt=1,
        description="Qualification: a host whose compute check takes above this x the fleet norm "
        "is no-go.",
    )  # fmt: skip
    link_flag_ratio: float = Field(
        default=1.2, gt=1,
        description="A NIC whose link readings (qualification, probes, jobs' passive data), "
        "pooled, are confidently this much slower than their reference is slow.",
    )  # fmt: skip
    link_prior_sd: float = Field(
        default=0.3, gt=0, description="The fleet prior on a NIC's log link slowness."
    )
    link_tau_floor: float = Field(
        default=0.15, gt=0,
        description="A healthy NIC's check-to-check spread of log link speed is never taken "
        "below this.",
    )  # fmt: skip
    link_passive_tau_floor: float = Field(
        default=0.03, gt=0,
        description="A healthy NIC's job-to-job spread of its passive link reading (jobs' own "
        "collectives) is never taken below this.",
    )  # fmt: skip
    link_min_checks: int = Field(
        default=3, ge=1,
        description="Link readings (checks, jobs) of a NIC before it can be called slow.",
    )  # fmt: skip
    qualify_keep_runs: int = Field(
        default=1000, ge=1,
        description="Qualification runs kept in the database (the newest; older ones go, with "
        "their checks).",
    )  # fmt: skip
    gauges_top: int = Field(
        default=50, ge=0, le=1000,
        description="Per-part health gauges are exported for this many parts per kind (flagged "
        "first, then by job time lost): bounded cardinality.",
    )  # fmt: skip

    def link_model(self) -> FleetModel:
        """The model NICs are judged by (their readings are link checks and jobs' passive link
        readings)."""
        return self.model().links(flag_ratio=self.link_flag_ratio, prior_sd=self.link_prior_sd,
                                  tau_floor=self.link_tau_floor,
                                  passive_tau_floor=self.link_passive_tau_floor,
                                  min_checks=self.link_min_checks)  # fmt: skip

    def model(self) -> FleetModel:
        return FleetModel(
            flag_ratio=self.flag_ratio, z=self.z, prior_sd=self.prior_sd,
            tau_floor=self.tau_floor, n_eff_cap=self.n_eff_cap, min_frames=self.min_frames,
            half_life_s=self.half_life_s, prior_hours=self.prior_hours,
            rate_factor=self.rate_factor, min_incident_jobs=self.min_incident_jobs,
        )  # fmt: skip
