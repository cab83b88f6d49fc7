"""Parallel layout: rank <-> (tp, dp, pp) coordinates, hosts, and the job's communicators.

Megatron-LM's default order: tensor-parallel rank varies fastest, then data-parallel, then
pipeline stage: ``rank = tp + TP * (dp + DP * pp)``. Consecutive ranks share a host.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True, slots=True)
class CommSpec:
    comm: str
    kind: str
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    tp: int = 4
    pp: int = 2
    dp: int = 8
    gpus_per_host: int = 8
    host_prefix: str = "node-"
    # Megatron's extra groups: ``embedding`` joins each first-stage rank with its last-stage
    # counterpart (kind ``other``: the embedding-gradient all-reduce across stages); ``ep`` > 1
    # splits each data-parallel group into expert-parallel groups of that size (kind ``ep``: an
    # all-to-all after every forward and backward chunk, MoE token dispatch).
    embedding: bool = False
    ep: int = 1

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.dp, self.gpus_per_host, self.ep) < 1:
            raise ValueError("tp, pp, dp, ep and gpus_per_host must be >= 1")
        if self.dp % self.ep:
            raise ValueError(f"ep {self.ep} does not divide dp {self.dp}")
        if self.world % self.gpus_per_host:
            raise ValueError(
                f"world size {self.world} is not a multiple of {self.gpus_per_host} GPUs per host"
            )

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def n_hosts(self) -> int:
        return self.world // self.gpus_per_host

    def rank(self, tp: int, dp: int, pp: int) -> int:
        return tp + self.tp * (dp + self.dp * pp)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(tp, dp, pp)`` of a rank."""
        return rank % self.tp, (rank // self.tp) % self.dp, rank // (self.tp * self.dp)

    def host_index(self, rank: int) -> int:
        return rank // self.gpus_per_host

    def host(self, rank: int) -> str:
        return f"{self.host_prefix}{self.host_index(rank):03d}"

    def gpu(self, rank: int) -> int:
        return rank % self.gpus_per_host

    @cached_property
    def hosts(self) -> tuple[str, ...]:
        return tuple(f"{self.host_prefix}{h:03d}" for h in range(self.n_hosts))

    def ranks_of_host(self, host: str) -> list[int]:
        idx = self.hosts.index(host)
        return list(range(idx * self.gpus_per_host, (idx + 1) * self.gpus_per_host))

    @cached_property
    def comms(self) -> tuple[CommSpec, ...]:
        out: list[CommSpec] = []
        for pp in range(self.pp):
            for dp in range(self.dp):
                members = tuple(self.rank(t, dp, pp) for t in range(self.tp))
                if self.tp > 1:
                    out.append(CommSpec(f"tp-{pp}-{dp}", "tp", members))
        for pp in range(self.pp):
            for t in range(self.tp):
                members = tuple(self.rank(t, d, pp) for d in range(self.dp))
                if self.dp > 1:
                    out.append(CommSpec(f"dp-{pp}-{t}", "dp", members))
        for s in range(self.pp - 1):
            for dp in range(self.dp):
                for t in range(self.tp):
                    a, b = self.rank(t, dp, s), self.rank(t, dp, s + 1)
                    out.append(CommSpec(f"pp-{s}-{dp}-{t}", "pp", (a, b)))
        if self.ep > 1:
            for pp in range(self.pp):
                for t in range(self.tp):
                    for g in range(self.dp // self.ep):
                        members = tuple(self.rank(t, g * self.ep + i, pp) for i in range(self.ep))
                        out.append(CommSpec(f"ep-{pp}-{t}-{g}", "ep", members))
        if self.embedding and self.pp > 1:
            for dp in range(self.dp):
                for t in range(self.tp):
                    ends = (self.rank(t, dp, 0), self.rank(t, dp, self.pp - 1))
                    out.append(CommSpec(f"emb-{dp}-{t}", "other", ends))
        return tuple(out)

    def comm(self, name: str) -> CommSpec:
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, CommSpec]:
        return {c.comm: c for c in self.comms}

    def tp_comm(self, rank: int) -> str | None:
        t, d, p = self.coords(rank)
        return f"tp-{p}-{d}" if self.tp > 1 else None

    def dp_comm(self, rank: int) -> str | None:
        t, d, p = self.coords(rank)
        return f"dp-{p}-{t}" if self.dp > 1 else None

    def ep_comm(self, rank: int) -> str | None:
        t, d, p = self.coords(rank)
        return f"ep-{p}-{t}-{d // self.ep}" if self.ep > 1 else None

    def embedding_comm(self, rank: int) -> str | None:
        """The embedding group of a first- or last-stage rank (None for the others)."""
        t, d, p = self.coords(rank)
        on_end = p in (0, self.pp - 1)
        return f"emb-{d}-{t}" if self.embedding and self.pp > 1 and on_end else None

    def pp_comm(self, rank: int, stage: int) -> str:
        """The p2p comm between ``rank``'s position at ``stage`` and ``stage + 1``."""
        t, d, _ = self.coords(rank)
        return f"pp-{stage}-{d}-{t}"

    def comms_of_host(self, host: str) -> list[CommSpec]:
        mine = set(self.ranks_of_host(host))
        return [c for c in self.comms if mine & set(c.ranks)]
