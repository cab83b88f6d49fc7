"""Service configuration from ``FAILSLOW_*`` environment variables (nested with ``__``).

Each domain owns its section (``auth``, ``ingest``, ``state``, ``detection``, ``actions``,
``probes``); this module composes them. Nothing here is read at import time: ``Settings()`` is
built by the CLI or by tests and handed to ``create_app``. Validators refuse unsafe set-ups instead
of warning about them.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import os
from collections.abc import Mapping

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from failslow.service.actions.settings import ActionsSettings
from failslow.service.auth import AuthSettings, hash_token
from failslow.service.bus.settings import BusSettings
from failslow.service.detection.settings import DetectionSettings
from failslow.service.fleet.settings import FleetSettings
from failslow.service.ingest.settings import IngestSettings
from failslow.service.otel import OtelSettings
from failslow.service.probes.settings import ProbeSettings
from failslow.service.stream.settings import StateSettings

__all__ = [
    "ActionsSettings",
    "AuthSettings",
    "BusSettings",
    "DetectionSettings",
    "FleetSettings",
    "IngestSettings",
    "ProbeSettings",
    "Settings",
    "StateSettings",
    "SettingsError",
    "from_environment",
    "hash_token",
    "is_loopback",
]

# FAILSLOW_* variables that other failslow programs read (the agent and the SDK in training
# jobs, the client commands, deployment scripts): a service started beside them accepts them.
OTHER_VARIABLES = frozenset({
    "FAILSLOW_JOB", "FAILSLOW_SOCKET", "FAILSLOW_SPOOL_DIR", "FAILSLOW_TOKEN", "FAILSLOW_URL",
    "FAILSLOW_CONTEXT", "FAILSLOW_CLIENT_CONFIG", "FAILSLOW_TORCH", "FAILSLOW_INFLIGHT_AFTER_S",
    "FAILSLOW_JIT", "FAILSLOW_DEMO_PORT", "FAILSLOW_SHARED_DIR", "FAILSLOW_SERVICE",
    "FAILSLOW_IMAGE", "FAILSLOW_PG_PASSWORD", "FAILSLOW_PORT_2", "FAILSLOW_RELAY_PORT",
})  # fmt: skip

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
    fleet: FleetSettings = Field(
        default_factory=FleetSettings, description="The fleet ledger: hardware across jobs."
    )
    otel: OtelSettings = Field(
        default_factory=OtelSettings,
        description="Metrics and events to an OpenTelemetry collector over OTLP/HTTP.",
    )
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


class SettingsError(ValueError):
    """Settings that cannot start the service: one line per problem, each naming the variable."""


def variables(
    model: type[BaseModel] | None = None, prefix: str = "FAILSLOW_"
) -> dict[str, tuple[str, ...]]:
    """Every environment variable of the settings -> its field path."""
    out: dict[str, tuple[str, ...]] = {}
    for name, info in (model or Settings).model_fields.items():
        var = f"{prefix}{name.upper()}"
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out |= {k: (name, *v) for k, v in variables(sub, f"{var}__").items()}
        else:
            out[var] = (name,)
    return out


def _not_json(env: Mapping[str, str], message: str) -> list[str]:
    """The variables behind pydantic-settings' 'error parsing value for field "auth"'."""
    field = message.split('"')[1].upper() if message.count('"') >= 2 else ""
    out = []
    for name, value in env.items():
        upper = name.upper()
        if field and (upper == f"FAILSLOW_{field}" or upper.startswith(f"FAILSLOW_{field}__")):
            try:
                json.loads(value)
            except ValueError as exc:
                if value.lstrip()[:1] in "[{":
                    out.append(f"{name}={value}: not valid JSON ({exc})")
    return out or [f"{message} (a FAILSLOW_{field}__* variable is not valid JSON)"]


def from_environment(environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """``Settings()`` from the environment, refusing what it cannot use: an unknown
    ``FAILSLOW_*`` variable (a misspelt one is otherwise ignored silently) or a bad value, each
    named (:class:`SettingsError`, one line per problem)."""
    env = os.environ if environ is None else environ
    known = variables()
    problems = []
    for name in sorted(env):
        upper = name.upper()
        if upper.startswith("FAILSLOW_") and upper not in known and upper not in OTHER_VARIABLES:
            near = difflib.get_close_matches(upper, list(known), n=1, cutoff=0.8)
            hint = f" (did you mean {near[0]}?)" if near else ""
            problems.append(f"{name}: not a failslow setting{hint}")
    by_path = {v: k for k, v in known.items()}
    try:
        settings = Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        for e in exc.errors():
            loc = tuple(str(p) for p in e["loc"])
            var = next((by_path[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in by_path),
                       None)  # fmt: skip
            msg = e["msg"].removeprefix("Value error, ")
            if var is None:
                problems.append(msg)
            else:
                shown = env.get(var, overrides.get(loc[0], "")) if len(loc) else ""
                problems.append(f"{var}={shown!s}: {msg}")
        settings = None  # type: ignore[assignment]
    except ValueError as exc:  # pydantic-settings: a value that is not JSON where JSON is due
        problems += _not_json(env, str(exc))
        settings = None  # type: ignore[assignment]
    if problems:
        raise SettingsError("\n".join(problems))
    return settings
