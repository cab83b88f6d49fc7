"""From v1 envelopes to what a v2 agent sends: a registration per host whenever its ranks or
communicators change, and binary bodies that name them by code (for replay, the simulator and the
benchmarks, which produce v1-shaped records)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from failslow.wire import topology, v2


@dataclass(slots=True)
class _Host:
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    comms: dict[str, dict[str, Any]] = field(default_factory=dict)  # in registration order
    digest: str | None = None
    codes: dict[str, int] = field(default_factory=dict)
    batch_seq: int = 0


@dataclass(frozen=True, slots=True)
class Converted:
    job: str
    host: str
    registration: dict[str, Any] | None  # PUT /v2/jobs/{job}/topology/{host} body, when new
    body: bytes  # POST /v2/ingest body
    records: int


class V2Converter:
    def __init__(self, agent_suffix: str = "v2") -> None:
        self.hosts: dict[tuple[str, str], _Host] = {}
        self.agent_suffix = agent_suffix

    def convert(self, env: dict[str, Any]) -> Converted:
        key = (env["job"], env["host"])
        h = self.hosts.setdefault(key, _Host())
        for r in env.get("ranks") or []:
            h.ranks[r["rank"]] = r
        for c in env.get("comms") or []:
            h.comms.setdefault(c["comm"], c)
        ranks, comms = list(h.ranks.values()), list(h.comms.values())
        digest = topology.digest(ranks, comms)
        registration = None
        if digest != h.digest:
            h.digest, h.codes = digest, {c["comm"]: i for i, c in enumerate(comms)}
            registration = {"sent_ns": env["sent_ns"], "ranks": ranks, "comms": comms}
        header = {
            "job": env["job"],
            "host": env["host"],
            "sent_ns": env["sent_ns"],
            "agent": env.get("agent") or f"{env['host']}-{self.agent_suffix}",
            "batch_seq": env["batch_seq"] if env.get("batch_seq") is not None else h.batch_seq,
            "topology": digest,
            **{k: env[k] for k in ("complete_ns", "inflight_after_ns") if env.get(k) is not None},
        }
        h.batch_seq = header["batch_seq"] + 1
        colls, steps = env.get("collectives") or [], env.get("steps") or []
        body = v2.encode_records(header, h.codes, colls, steps)
        return Converted(env["job"], env["host"], registration, body, len(colls) + len(steps))

    def registration(self, job: str, host: str) -> dict[str, Any]:
        """The current registration of a host (to send again after a 409)."""
        h = self.hosts[(job, host)]
        return {
            "sent_ns": time.time_ns(),
            "ranks": list(h.ranks.values()),
            "comms": list(h.comms.values()),
        }
