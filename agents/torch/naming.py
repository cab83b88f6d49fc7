"""Names and kinds of process groups, found without help from the training script.

A communicator id must be the same on every member and differ between groups, and a reader
should see what a group is for. The kind comes, first match wins, from:

1. a name given by hand (:meth:`Naming.register`);
2. the group's description: ``DeviceMesh`` creates each dimension's groups with
   ``group_desc="mesh_<dim name>"`` (``mesh_dp``, ``mesh_dp_shard``, ``mesh_tp``, ``mesh_pp``,
   ...) and Megatron-Core with ``group_desc="TENSOR_MODEL_PARALLEL_GROUP"`` and the like;
3. Megatron's ``parallel_state`` module, when it is imported: its group globals compared by
   identity;
4. the default group: ``world``; anything else ``other``.

The id is ``<kind>-<members>``: up to four members listed (``tp-4-5``), an arithmetic run as
``first..last`` with its stride (``dp-0..56s8``), anything else as ``first..last``, the count and
a short hash. Two groups with the same members and kind (``new_group`` twice over the same
ranks) are told apart by the order they were created in, which every member shares: the second
is ``...+1``. Ids fit the API's identifier rule (<= 128 characters of ``[A-Za-z0-9._:@+-]``).
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from failslow.detectors.vocab import CommKind

# DeviceMesh dimension names (after "mesh_") and Megatron group descriptions -> kind. Checked in
# order; the first pattern that matches the (lower-cased) name wins.
_KIND_PATTERNS: tuple[tuple[re.Pattern[str], CommKind], ...] = (
    (re.compile(r"^(expert_tensor|etp)"), CommKind.TP),
    (re.compile(r"^(ep|expert|moe)"), CommKind.EP),
    (re.compile(r"^(tp|tensor|model_parallel_tp)"), CommKind.TP),
    (re.compile(r"^(pp|pipe|pipeline)"), CommKind.PP),
    (re.compile(r"^(cp|context)"), CommKind.CP),
    (re.compile(r"^(dp|fsdp|hsdp|ddp|data|replicate|shard|dp_)"), CommKind.DP),
)

# Megatron-Core's parallel_state globals -> kind (group objects or lists of them)
_MEGATRON_GLOBALS: dict[str, CommKind] = {
    "_TENSOR_MODEL_PARALLEL_GROUP": CommKind.TP,
    "_PIPELINE_MODEL_PARALLEL_GROUP": CommKind.PP,
    "_DATA_PARALLEL_GROUP": CommKind.DP,
    "_DATA_PARALLEL_GROUP_WITH_CP": CommKind.DP,
    "_CONTEXT_PARALLEL_GROUP": CommKind.CP,
    "_EXPERT_MODEL_PARALLEL_GROUP": CommKind.EP,
    "_EXPERT_TENSOR_PARALLEL_GROUP": CommKind.TP,
    "_EXPERT_DATA_PARALLEL_GROUP": CommKind.DP,
}
_MEGATRON_MODULES = ("megatron.core.parallel_state", "megatron.core.mpu")


def kind_of_name(name: str) -> CommKind | None:
    """The kind a mesh dimension name or a group description stands for (None: unknown)."""
    text = name.lower()
    for prefix in ("mesh_", "mesh_dim_"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    for pattern, kind in _KIND_PATTERNS:
        if pattern.match(text):
            return kind
    return None


def megatron_kind(group: Any) -> CommKind | None:
    """The kind Megatron's ``parallel_state`` gives ``group``, when that module is imported."""
    for module_name in _MEGATRON_MODULES:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        for attr, kind in _MEGATRON_GLOBALS.items():
            value = getattr(module, attr, None)
            if value is group or (
                isinstance(value, list | tuple) and any(v is group for v in value)
            ):
                return kind
    return None


def members_form(ranks: Sequence[int]) -> str:
    """A short, stable spelling of a member list (see the module's docstring)."""
    n = len(ranks)
    if n <= 4:
        return "-".join(str(r) for r in ranks)
    stride = ranks[1] - ranks[0]
    if stride > 0 and all(ranks[i + 1] - ranks[i] == stride for i in range(n - 1)):
        return f"{ranks[0]}..{ranks[-1]}" + (f"s{stride}" if stride != 1 else "")
    digest = hashlib.blake2b(",".join(map(str, ranks)).encode(), digest_size=4).hexdigest()
    return f"{ranks[0]}..{ranks[-1]}n{n}-{digest}"


def comm_id(kind: str, ranks: Sequence[int], duplicate: int = 0) -> str:
    """``<kind>-<members>`` (``+k`` for the k-th other group over the same members)."""
    name = f"{kind}-{members_form(ranks)}"
    return name + (f"+{duplicate}" if duplicate else "")


@dataclass(slots=True)
class Group:
    """What the interception needs of a process group: its comm id and kind, and its global
    ranks in group order (``ranks[i]`` is group rank ``i``)."""

    comm: str
    kind: str
    ranks: tuple[int, ...]
    ref: Any  # weakref to the ProcessGroup (an id can be reused once the group is freed)


class Naming:
    """Comm ids of this process's groups, found on first use and announced once through
    ``announce(comm, kind, ranks)``."""

    def __init__(self, announce: Callable[[str, str, list[int]], None]) -> None:
        self._announce = announce
        self._groups: dict[int, Group] = {}  # id(ProcessGroup) -> Group
        self._given: dict[int, tuple[str, str, Any]] = {}  # id(pg) -> (name, kind, weakref)
        self._pairs: set[str] = set()
        self._lock = threading.Lock()

    def register(self, group: Any, name: str, kind: str) -> Group:
        """Name ``group`` by hand (None: the default group); announced at once."""
        pg = group if group is not None else dist.group.WORLD
        with self._lock:
            self._given[id(pg)] = (name, str(kind), weakref.ref(pg))
            self._groups.pop(id(pg), None)
        return self.of(pg)

    def of(self, pg: Any) -> Group:
        """The comm of a ``ProcessGroup`` (the object c10d's operators receive)."""
        group = self._groups.get(id(pg))
        if group is not None and group.ref() is pg:
            return group
        with self._lock:
            group = self._groups.get(id(pg))
            if group is None or group.ref() is not pg:
                group = self._describe(pg)
                self._groups[id(pg)] = group
        self._announce(group.comm, group.kind, list(group.ranks))
        return group

    def pair(self, me: int, peer: int, sending: bool) -> tuple[str, str]:
        """The two-member comm of a send or recv between global ranks, and the direction key
        ``a>b`` of the message (``a`` sends to ``b``)."""
        a, b = (me, peer) if sending else (peer, me)
        lo, hi = min(a, b), max(a, b)
        comm = f"p2p-{lo}-{hi}"
        if comm not in self._pairs:
            with self._lock:
                fresh = comm not in self._pairs
                self._pairs.add(comm)
            if fresh:
                self._announce(comm, CommKind.P2P, [lo, hi])
        return comm, f"{a}>{b}"

    def groups(self) -> list[Group]:
        return [g for g in list(self._groups.values()) if g.ref() is not None]

    # -- finding a group's name ------------------------------------------------------------
    def _describe(self, pg: Any) -> Group:
        ranks = tuple(_global_ranks(pg))
        given = self._given.get(id(pg))
        if given is not None and given[2]() is pg:
            return Group(given[0], given[1], ranks, weakref.ref(pg))
        kind = _kind(pg)
        if kind == CommKind.WORLD:
            return Group("world", kind, ranks, weakref.ref(pg))
        return Group(
            comm_id(kind, ranks, _duplicate(pg, kind, ranks)), kind, ranks, weakref.ref(pg)
        )


def _kind(pg: Any) -> str:
    desc = str(getattr(pg, "group_desc", "") or "")
    kind = kind_of_name(desc) if desc and desc not in ("default_pg", "undefined") else None
    kind = kind or megatron_kind(pg)
    if kind is not None:
        return kind
    return CommKind.WORLD if pg is dist.group.WORLD else CommKind.OTHER


def _global_ranks(pg: Any) -> list[int]:
    """Global ranks of ``pg`` in group order (c10d's own table; the size alone where absent)."""
    if pg is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    table = dist.distributed_c10d._world.pg_group_ranks.get(pg)
    if table is not None:  # global rank -> group rank
        return [g for g, _ in sorted(table.items(), key=lambda kv: kv[1])]
    return list(dist.get_process_group_ranks(pg))


def _duplicate(pg: Any, kind: str, ranks: tuple[int, ...]) -> int:
    """How many groups of the same kind over the same members were created before ``pg``
    (c10d's table keeps creation order, the same on every member)."""
    count = 0
    for other, table in list(dist.distributed_c10d._world.pg_group_ranks.items()):
        if other is pg:
            return count
        if other is dist.group.WORLD or len(table) != len(ranks):
            continue
        same = tuple(g for g, _ in sorted(table.items(), key=lambda kv: kv[1])) == ranks
        if same and _kind(other) == kind:
            count += 1
    return 0
