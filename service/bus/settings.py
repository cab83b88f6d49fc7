"""The bus (``FAILSLOW_BUS__*``). ``url`` unset: the embedded single process, no bus."""

from __future__ import annotations

from pydantic import BaseModel, Field


class BusSettings(BaseModel):
    url: str | None = Field(
        default=None,
        description="NATS server(s), comma-separated (nats://a:4222,nats://b:4222). Set: ingest "
        "replicas publish to JetStream and each job is applied by the one replica that owns "
        "its partition. Unset: one process applies what it receives (the default).",
    )
    stream: str = Field(default="FAILSLOW", description="The JetStream stream of envelopes.")
    subject: str = Field(
        default="failslow.ingest", description="Subject prefix; partition p is <subject>.<p>."
    )
    partitions: int = Field(
        default=8, ge=1, le=1024,
        description="Jobs are hashed onto this many partitions; a partition is the unit of "
        "ownership. Fixed for the life of a stream.",
    )  # fmt: skip
    stream_replicas: int = Field(
        default=1, ge=1, le=5, description="JetStream replicas of the stream and buckets (3 in "
        "a 3-node cluster)."
    )  # fmt: skip
    max_age_s: float = Field(
        default=3600.0, gt=0,
        description="How long the stream keeps envelopes. A partition whose owner falls this "
        "far behind loses what expired (counted in failslow_bus_expired_total).",
    )  # fmt: skip
    duplicate_window_s: float = Field(
        default=120.0, gt=0,
        description="JetStream deduplicates re-sent batches (agent, batch_seq) within this "
        "window; older re-sends are caught by the owner's per-agent positions.",
    )  # fmt: skip
    owner_ttl_s: float = Field(
        default=5.0, gt=0.5,
        description="A partition's owner renews its claim every third of this; when it stops, "
        "another replica takes the partition over after at most this long (plus one renewal).",
    )  # fmt: skip
    snapshot_every_s: float = Field(
        default=5.0, gt=0,
        description="How often an owned job's state (stream and detector state) is written "
        "with its stream position; a new owner restores it and replays only what came after.",
    )  # fmt: skip
    fetch_batch: int = Field(
        default=1024, ge=1, description="Envelopes an owner takes from the stream at once."
    )
    commit_interval_s: float = Field(
        default=0.5, ge=0, le=10,
        description="Least time between two commits of an owned partition: what was applied "
        "meanwhile is written by one transaction (answers do not wait for it: the stream holds "
        "the batches; a new owner replays what was not committed).",
    )  # fmt: skip
    replica_id: str | None = Field(
        default=None, description="This replica's name (default host:pid:random)."
    )
    publish_timeout_s: float = Field(
        default=5.0, gt=0, description="How long ingest waits for the stream to hold a batch."
    )
    shutdown_timeout_s: float = Field(
        default=20.0, gt=0,
        description="The most a clean shutdown waits to hand its partitions over (commit with "
        "snapshots, release the claims) and to drain the connection. Past it the replica exits "
        "anyway: the next owner takes the partitions when the claims expire and replays what "
        "was not committed. With or without a bus, it also bounds the wait for the service's "
        "cancelled background tasks (detection, commits, snapshots, ownership).",
    )  # fmt: skip
