"""Service configuration from ``FAILSLOW_*`` environment variables (nested with ``__``).

Nothing here is read at import time: ``Settings()`` is built by the CLI or by tests and handed to
``create_app``. Validators refuse unsafe set-ups instead of warning about them.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Annotated

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def hash_token(token: str) -> str:
    """The stored form of a bearer token: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def _normalise_token_list(value: object) -> list[str]:
    if value is None or value == "":
        return []
    items = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    out: list[str] = []
    for raw in items:
        item = str(raw).strip()
        if not item:
            continue
        # Accept plaintext for convenience, keep only its hash in memory.
        out.append(item if item.startswith("sha256:") else hash_token(item))
    return out


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


TokenList = Annotated[list[str], NoDecode]


class AuthSettings(BaseModel):
    """Bearer tokens per role. Values are ``sha256:<hex>`` hashes (or plaintext, hashed on load)."""

    ingest_tokens: TokenList = Field(
        default_factory=list,
        description="Tokens that may POST /v1/ingest (agents). Comma-separated in the environment.",
    )
    read_tokens: TokenList = Field(
        default_factory=list, description="Tokens that may read /v1/jobs, incidents and actions."
    )
    operator_tokens: TokenList = Field(
        default_factory=list,
        description="Tokens that may approve/reject actions and flush jobs; they can also read.",
    )
    metrics_public: bool = Field(
        default=True, description="Serve /metrics without a token (Prometheus scrapes it)."
    )

    @field_validator("ingest_tokens", "read_tokens", "operator_tokens", mode="before")
    @classmethod
    def _tokens(cls, value: object) -> list[str]:
        return _normalise_token_list(value)

    @property
    def enabled(self) -> bool:
        return bool(self.ingest_tokens or self.read_tokens or self.operator_tokens)


class IngestSettings(BaseModel):
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest envelope after decompression (413)."
    )
    max_concurrent_requests: int = Field(
        default=32, gt=0, description="Ingest requests processed at once; more get 429."
    )
    retry_after_s: int = Field(default=1, ge=1, description="Retry-After sent with a 429.")


class StateSettings(BaseModel):
    """Bounds on per-job in-memory state. See docs/memory.md for the arithmetic."""

    retention_s: float = Field(
        default=300.0, gt=0, description="Event-time window kept for assembly and idempotency."
    )
    max_pending_collectives: int = Field(
        default=200_000, gt=0, description="Per job: collectives being assembled at once."
    )
    max_done_collectives: int = Field(
        default=200_000, gt=0, description="Per job: completed collectives remembered for re-sends."
    )
    max_open_frames: int = Field(
        default=64, gt=0, description="Per job: steps (frames) being assembled at once."
    )
    max_ranks: int = Field(default=200_000, gt=0, description="Per job: largest world size.")
    max_comms: int = Field(default=100_000, gt=0, description="Per job: most communicators.")
    max_jobs: int = Field(default=1_000, gt=0, description="Jobs held in memory at once.")
    max_history_steps: int = Field(
        default=512, gt=0, description="Per rank: recent per-step values kept for detection."
    )
    frame_grace_s: float = Field(
        default=5.0,
        ge=0,
        description="Event time after a step's last record before it is closed with missing ranks.",
    )
    time_frame_s: float = Field(
        default=1.0, gt=0, description="Frame length for jobs that send no step records."
    )
    stale_after_s: float = Field(
        default=30.0, gt=0, description="A host with no envelope for this long is stale."
    )
    evict_after_s: float = Field(
        default=6 * 3600.0, gt=0, description="Wall time after which an idle job leaves memory."
    )


class DetectionSettings(BaseModel):
    interval_s: float = Field(default=0.25, gt=0, description="Period of the detection loop.")
    late_fraction: float = Field(
        default=0.02,
        gt=0,
        description="Lateness (peers' wait per step / step time) above which a rank is suspect.",
    )
    compute_ratio: float = Field(
        default=1.05, gt=1, description="Compute time vs role peers above which a rank is suspect."
    )
    link_ratio: float = Field(
        default=0.85,
        gt=0,
        lt=1,
        description="Bus bandwidth vs its references below which a communicator is suspect.",
    )
    job_slowdown_ratio: float = Field(
        default=1.1, gt=1, description="Job step time vs baseline that makes a job-wide slowdown."
    )
    hang_timeout_floor_s: float = Field(
        default=2.0, gt=0, description="Shortest time a collective may block before it is hung."
    )
    hang_startup_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="How long a communicator's first collective may block (waiting for the "
        "last rank to start, lazy connection set-up) before it is hung.",
    )
    dead_host_after_s: float = Field(
        default=5.0, gt=0, description="Event time without envelopes after which a host is dead."
    )
    window: int = Field(default=5, ge=1, description="Frames in the sliding decision window.")
    open_after: int = Field(
        default=4, ge=1, description="Suspect frames within the window before an incident opens."
    )
    resolve_after: int = Field(
        default=8, ge=1, description="Consecutive clean frames before an incident resolves."
    )
    warmup_frames: int = Field(
        default=5, ge=0, description="Frames ignored at job start (compilation, warm-up)."
    )
    baseline_frames: int = Field(
        default=500,
        ge=10,
        description="Baseline = fastest 10-step median step time within this many recent frames.",
    )
    top_k: int = Field(
        default=5, ge=0, description="Slowest ranks per job exported with a rank label."
    )
    history_every_steps: int = Field(
        default=10, ge=1, description="Steps per downsampled per-rank history row."
    )

    @model_validator(mode="after")
    def _window(self) -> DetectionSettings:
        if self.open_after > self.window:
            raise ValueError("detection.open_after must be <= detection.window")
        return self


ACTION_KINDS = ("notify", "rebalance", "replan", "isolate", "restart")
ACTUATORS = ("log", "plan", "webhook", "kubernetes", "slurm")


class ActionsSettings(BaseModel):
    """Mitigation: the policy's costs and budgets, approval modes and actuators."""

    enabled: bool = Field(default=True, description="Run the policy on open incidents.")
    actuators: list[str] = Field(
        default_factory=lambda: ["log", "plan"],
        description="Actuators switched on. `log` and `plan` have no effect outside failslow.",
    )
    actuator_for: dict[str, str] = Field(
        default_factory=lambda: {
            "notify": "log",
            "rebalance": "plan",
            "replan": "plan",
            "isolate": "log",
            "restart": "log",
        },
        description="Which actuator carries out each action kind (JSON in the environment).",
    )
    approval: dict[str, str] = Field(
        default_factory=lambda: {
            "notify": "auto",
            "rebalance": "auto",
            "replan": "auto",
            "isolate": "manual",
            "restart": "manual",
        },
        description="`auto` executes at once; `manual` waits for an operator's approval.",
    )
    dry_run: bool = Field(default=False, description="Actuators only say what they would do.")
    timeout_s: float = Field(default=30.0, gt=0, description="Deadline of one actuator call.")
    costs_s: dict[str, float] = Field(
        default_factory=lambda: {
            "notify": 0.0,
            "rebalance": 5.0,
            "replan": 30.0,
            "isolate": 0.0,
            "restart": 600.0,
        },
        description="Default cost of each action in seconds of job time, until outcomes teach "
        "better ones (ski rental: act once the time lost reaches the cost).",
    )
    max_isolations_per_hour: int = Field(default=2, ge=0, description="Per job.")
    min_world_size: int = Field(default=1, ge=1, description="Never isolate below this many ranks.")
    cooldown_s: float = Field(default=600.0, ge=0, description="Per target, between actions.")
    notify_below: float = Field(
        default=1.05, ge=1, description="Job slowdown under which incidents are only notified."
    )
    min_gain: float = Field(
        default=0.05, ge=0, le=1, description="Least predicted recovery for rebalance."
    )
    outcome_steps: int = Field(
        default=10,
        ge=2,
        description="Steps after an executed action before its outcome is measured.",
    )
    plan_ack_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A plan with new shares the job has not acknowledged (POST .../plan/ack) "
        "within this many seconds is assumed applied.",
    )
    outcome_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="Event time after which an action whose job made no progress is recorded "
        "as having recovered nothing.",
    )
    webhook_url: str = Field(default="", description="Receiver of the `webhook` actuator.")
    webhook_secret: str = Field(default="", description="HMAC-SHA256 key of webhook bodies.")
    kubernetes_namespace: str = Field(default="default", description="Namespace of job pods.")
    kubernetes_job_label: str = Field(
        default="failslow.dev/job", description="Pod label whose value is the failslow job id."
    )
    kubernetes_host: str = Field(default="", description="API server URL (else kubeconfig).")
    kubernetes_in_cluster: bool = Field(default=False, description="Use the pod's account.")
    slurm_scontrol: str = Field(default="scontrol", description="Path of `scontrol`.")
    slurm_conf: str = Field(default="", description="slurm.conf path (else Slurm's default).")

    @model_validator(mode="after")
    def _check(self) -> ActionsSettings:
        for name in self.actuators:
            if name not in ACTUATORS:
                raise ValueError(f"unknown actuator {name!r}; one of {ACTUATORS}")
        for kind, name in self.actuator_for.items():
            if kind not in ACTION_KINDS:
                raise ValueError(f"unknown action kind {kind!r} in actuator_for")
            if name not in ACTUATORS:
                raise ValueError(f"unknown actuator {name!r} for {kind}")
        for kind, mode in self.approval.items():
            if kind not in ACTION_KINDS or mode not in ("auto", "manual"):
                raise ValueError(f"approval[{kind!r}] must be auto or manual")
        if "webhook" in self.actuators and not (self.webhook_url and self.webhook_secret):
            raise ValueError("the webhook actuator needs actions.webhook_url and webhook_secret")
        return self


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
    keep_campaigns: int = Field(default=20, ge=1, description="Campaigns kept per job.")


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
    insecure: bool = Field(
        default=False, description="Allow a non-loopback bind without tokens (not recommended)."
    )
    migrate_on_start: bool = Field(
        default=True, description="Apply Alembic migrations when the service starts."
    )
    log_level: str = Field(default="info", description="Python log level for the service.")
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

    @model_validator(mode="after")
    def _refuse_open_bind(self) -> Settings:
        if not is_loopback(self.host) and not self.auth.enabled and not self.insecure:
            raise ValueError(
                f"refusing to bind {self.host!r} without auth tokens: set "
                "FAILSLOW_AUTH__INGEST_TOKENS / FAILSLOW_AUTH__READ_TOKENS, or pass --insecure"
            )
        return self
