"""Service configuration from ``FAILSLOW_*`` environment variables (nested with ``__``).

Each domain owns its section (``auth``, ``ingest``, ``state``, ``detection``, ``actions``,
``probes``); this module composes them. Nothing here is read at import time: ``Settings()`` is
built by the CLI or by tests and handed to ``create_app``. Validators refuse unsafe set-ups instead
of warning about them.
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from failslow.service.actions.settings import ActionsSettings
from failslow.service.auth import AuthSettings, hash_token
from failslow.service.bus.settings import BusSettings
from failslow.service.detection.settings import DetectionSettings
from failslow.service.ingest.settings import IngestSettings
from failslow.service.probes.settings import ProbeSettings
from failslow.service.stream.settings import StateSettings

__all__ = [
    "ActionsSettings",
    "AuthSettings",
    "BusSettings",
    "DetectionSettings",
    "IngestSettings",
    "ProbeSettings",
    "Settings",
    "StateSettings",
    "hash_token",
    "is_loopback",
]

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    """All service settings. Environment: ``FAILSLOW_<FIELD>`` and ``FAILSLOW_<GROUP>__<FIELD>``."""

    model_config = SettingsConfigDict(
        env_prefix="FAILSLOW_", env_nested_delimiter="__", extra="ignore"
    )

    database_url: str = Field(
        default="sqlite:///./var/failslow.db",
        description="SQLAlchemy URL. SQLite by default; postgresql+psycopg://... for production.",
    )
    host: str = Field(default="127.0.0.1", description="Address `failslow serve` binds.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port `failslow serve` binds.")
    keep_alive_s: float = Field(
        default=75.0,
        gt=0,
        description="How long `failslow serve` keeps an idle HTTP connection open. Agents send "
        "an envelope per step or second over one connection; a step longer than this makes "
        "each of them reconnect (at 100K ranks, 12,800 connects per step).",
    )
    allocator_keep_mib: int = Field(
        default=512,
        ge=0,
        description="`failslow serve` on glibc: freed memory, up to this much, stays in the "
        "process for reuse instead of going back to the kernel, and blocks under 32 MiB are not "
        "mapped one by one. Otherwise the v2 core's array temporaries take fresh pages, and a "
        "page fault per 4 KiB, at every join (bench/v2_core.py at 10K ranks: 117K faults and "
        "0.54 us per record; with it 47K and 0.42). 0: glibc's defaults.",
    )
    gc_young_objects: int = Field(
        default=10_000,
        ge=0,
        description="`failslow serve`: allocations between two collections of Python's youngest "
        "garbage-collector generation (Python's default: 700). Per-envelope objects then die "
        "young instead of being promoted, so the full collections that traverse a large job's "
        "topology objects come rarely: at 10K ranks, 40 s of 1 s steps, 0.10 s of collections "
        "instead of 1.08 s, the service's CPU 9.9 s instead of 10.8-11.5 s. 0: Python's default.",
    )
    insecure: bool = Field(
        default=False, description="Allow a non-loopback bind without tokens (not recommended)."
    )
    migrate_on_start: bool = Field(
        default=True, description="Apply Alembic migrations when the service starts."
    )
    log_level: str = Field(default="info", description="Python log level for the service.")
    lease_ttl_s: float = Field(
        default=15.0,
        ge=0,
        description="One service per database: the lease a running service holds in it "
        "(service/lease.py) expires this long after its last renewal. 0 turns the check off "
        "(only where something else guarantees a single writer).",
    )
    auth: AuthSettings = Field(default_factory=AuthSettings, description="Bearer tokens.")
    ingest: IngestSettings = Field(default_factory=IngestSettings, description="Ingest limits.")
    state: StateSettings = Field(default_factory=StateSettings, description="Memory bounds.")
    detection: DetectionSettings = Field(
        default_factory=DetectionSettings, description="Detector parameters."
    )
    actions: ActionsSettings = Field(
        default_factory=ActionsSettings, description="Mitigation policy and actuators."
    )
    probes: ProbeSettings = Field(default_factory=ProbeSettings, description="Active probes.")
    bus: BusSettings = Field(
        default_factory=BusSettings,
        description="Replicas on NATS JetStream (docs/replicas.md); off by default. With a bus "
        "the database lease is not taken: the bus decides which replica writes which job.",
    )

    @model_validator(mode="after")
    def _refuse_open_bind(self) -> Settings:
        if not is_loopback(self.host) and not self.auth.enabled and not self.insecure:
            raise ValueError(
                f"refusing to bind {self.host!r} without auth tokens: set "
                "FAILSLOW_AUTH__INGEST_TOKENS / FAILSLOW_AUTH__READ_TOKENS, or pass --insecure"
            )
        return self
