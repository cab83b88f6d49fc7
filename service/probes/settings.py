"""Active link probe settings (``FAILSLOW_PROBES__*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ProbeSettings(BaseModel):
    """Active link probes (pairwise bandwidth tests run by the node agents)."""

    enabled: bool = Field(
        default=True, description="Probe ambiguous slow links (agents need --probe-listen)."
    )
    bytes: int = Field(
        default=4 << 20, ge=1024, le=64 << 20, description="Bytes sent each way per pair test."
    )
    min_interval_s: float = Field(
        default=300.0, ge=0, description="Rate limit: at most one campaign per job this often."
    )
    during_critical: bool = Field(
        default=False, description="Also probe while the job declares a critical phase."
    )
    task_timeout_s: float = Field(default=30.0, gt=0, description="A running test's deadline.")
    pickup_timeout_s: float = Field(
        default=60.0, gt=0, description="A test no agent picked up by then has failed."
    )
    endpoint_ttl_s: float = Field(
        default=60.0, gt=0, description="An agent's probe endpoint is known this long per poll."
    )
    slow_below: float = Field(
        default=0.5, gt=0, lt=1, description="A pair slower than this x the fast pairs is slow."
    )
    endpoint_wait_s: float = Field(
        default=10.0, ge=0, description="How long a campaign waits for every host's endpoint."
    )
    partners: int = Field(
        default=6,
        ge=0,
        le=64,
        description="Other hosts of the job tested with the ends of a single slow cable or NIC "
        "(to tell the cable from either end's NIC).",
    )
    incident_poll_s: float = Field(
        default=1.0,
        gt=0,
        description="How often the open hang and slow-link incidents are read from the "
        "database (campaigns start, and agents are asked for hang evidence, at most this much "
        "later). Read at every detection pass, it cost ~2 ms four times a second.",
    )
    keep_campaigns: int = Field(default=20, ge=1, description="Campaigns kept per job.")
    own_address_only: bool = Field(
        default=True,
        description="An agent may announce only a probe address on the IP its request comes "
        "from (other agents will send probe traffic there); turn off behind NAT or a proxy.",
    )
