"""REST shapes of the fleet ledger (docs/fleet.md)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from failslow.detectors.fleet import IdSource, PartKind, PartState


class PartSort(StrEnum):
    """How a fleet list is ordered."""

    COST = "cost"  # job time lost to it, most first
    SCORE = "score"  # least healthy first
    JOBS = "jobs"  # most jobs first
    NAME = "name"


class PartOut(BaseModel):
    part: str = Field(description="The part's identity (a host name, a GPU UUID, host/NIC).")
    kind: PartKind
    host: str = Field(description="The host it was last seen on.")
    label: str = Field(description="The local device index, or the NIC's name.")
    id_source: IdSource | None = Field(
        default=None, description="GPUs: where the identity comes from (uuid, pci, index)."
    )
    state: PartState
    state_since: str | None
    state_reason: str
    flagged: bool = Field(description="The pooled evidence says slow or a repeat offender.")
    score: float = Field(description="0..1, 1 = healthy: its peers' speed it keeps.")
    slowness: float = Field(description="Pooled compute time against its peers (1.06 = 6% slower).")
    slowness_low: float = Field(description="The credible interval's lower end.")
    slowness_high: float
    jobs: int = Field(
        description="Jobs with a speed reading of it (a NIC: its link checks and the jobs whose "
        "passive data could judge its link)."
    )
    jobs_seen: int = Field(description="Jobs it was seen in.")
    observed_h: float = Field(description="Hours of job time it was observed.")
    incidents: int = Field(description="Incidents that named it, ever.")
    incident_jobs: int = Field(description="Distinct jobs whose recent incidents named it.")
    cost_s: float = Field(description="Job time lost to it: incidents' lost time + its slowness.")
    reasons: list[str]
    first_seen: str | None
    last_seen: str | None
    hint: str | None = Field(
        default=None,
        description="drain / return: the drain (undrain) action proposed for its host and its "
        "state (approve it to have the actuator drain the host, or put it back in service); "
        "none when no job has run on it.",
    )
    hint_skipped: str | None = Field(
        default=None,
        description="return: why no undrain was proposed (another part on its host is still "
        "unfit).",
    )


class ReadingSource(StrEnum):
    """What a reading of a part was taken from."""

    JOB = "job"  # a job's own data: compute against role peers; a NIC's, its passive link speed
    LINK_CHECK = "link_check"  # a qualification run's or a probe campaign's link tests (a NIC)


class ReadingOut(BaseModel):
    job: str = Field(description="The job, or the link check's run or campaign id.")
    source: ReadingSource
    frames: int = Field(description="Frames of the job that judged it (0: observed, no reading).")
    ratio: float = Field(
        description="Its compute time against its role peers in that job; a NIC's: its link's "
        "slowness against the job's other hosts, or against the check's reference."
    )
    observed_s: float
    lost_s: float = Field(
        description="Job time its own slowness cost there, as measured (a NIC's: what its "
        "transfers lost against the job's other hosts; 0 where not measured)."
    )
    first_seen: str | None
    last_seen: str | None


class MarkOut(BaseModel):
    incident: str
    job: str
    kind: str
    severity: str
    at: str | None
    lost_s: float
    hard: bool


class IncidentPart(BaseModel):
    """A part an incident named, as the fleet ledger knows it."""

    part: str = Field(description="Its identity: GPU UUID (or host/PCI id, host/index), host, "
                      "host/NIC.")  # fmt: skip
    kind: PartKind
    host: str
    label: str
    id_source: IdSource | None
    state: PartState
    lost_s: float = Field(description="Job time the incident cost, this part's share.")


class PartDetail(PartOut):
    readings: list[ReadingOut] = Field(description="Per job, newest first (the history).")
    marks: list[MarkOut] = Field(description="Incidents that named it, newest first.")


class GpuIn(BaseModel):
    index: int = Field(ge=0, le=1023, description="Local device index.")
    uuid: str | None = Field(default=None, max_length=128, description="NVML's UUID.")
    pci_bus_id: str | None = Field(default=None, max_length=64)
    name: str | None = Field(default=None, max_length=128, description="The model.")


class NicIn(BaseModel):
    name: str = Field(min_length=1, max_length=64, description="mlx5_0, eth0, ...")
    address: str | None = Field(default=None, max_length=128, description="MAC or GUID.")
    kind: str | None = Field(default=None, max_length=32, description="infiniband, ethernet.")


class InventoryIn(BaseModel):
    gpus: list[GpuIn] = Field(default_factory=list, max_length=1024)
    nics: list[NicIn] = Field(default_factory=list, max_length=256)
    note: str = Field(default="", max_length=512, description="How the agent read it.")


class InventoryOut(InventoryIn):
    host: str
    reported: str | None
