"""PyTorch NCCL Flight Recorder dumps: load them safely and find where a hung job is stuck.

A dump (``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0; written on a watchdog timeout, to
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``, or on demand through ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``)
is a pickle — or JSON — of plain dicts, lists, strings and numbers: ``version``, ``pg_config``
(process group name -> desc, ranks), ``pg_status`` (last enqueued/started/completed collective
per group) and ``entries`` (the newest collectives of this rank: process group, per-group
``collective_seq_id``, op, sizes, ``state`` scheduled|started|completed, ``time_created_ns``).

Pickles are read with an unpickler that refuses *every* class, so a dump can never run code.
Bad input raises :class:`DumpError` with a short reason; nothing else escapes.

:func:`stuck_collectives` joins dumps across ranks on (process group, ``collective_seq_id``), as
PyTorch's ``fr_trace`` analyzer does: in every group whose members disagree, the first collective
some member never enqueued is stuck, and the members that did not enqueue it are *missing*. The
one created earliest is where the job got stuck first: its missing ranks are the hang's roots.
"""

from __future__ import annotations

import ast
import io
import json
import pickle
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_BYTES = 256 * 1024 * 1024


class DumpError(ValueError):
    """A dump that cannot be read; ``reason`` is a short code for counting."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D102
        raise pickle.UnpicklingError(f"refused to load {module}.{name}")


@dataclass(frozen=True, slots=True)
class Entry:
    group: str  # process group name (identical on every member)
    desc: str
    seq: int  # collective_seq_id (p2p_seq_id for p2p entries)
    is_p2p: bool
    op: str
    state: str
    created_ns: int
    started_ns: int | None
    completed_ns: int | None
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupStatus:
    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass(frozen=True, slots=True)
class Dump:
    rank: int | None
    version: str
    groups: dict[str, tuple[str, tuple[int, ...]]]  # name -> (desc, global ranks)
    status: dict[str, GroupStatus]
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Stuck:
    """A collective that some members of its group never enqueued."""

    group: str
    desc: str
    seq: int
    op: str
    sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    created_ns: int  # earliest enqueue among the members that have it
    missing: tuple[int, ...]  # global ranks that never enqueued it
    present: tuple[int, ...]


def _raw(data: bytes) -> Any:
    if len(data) > MAX_BYTES:
        raise DumpError("too_large", f"{len(data)} bytes")
    if not data:
        raise DumpError("empty", "no bytes")
    if data.lstrip()[:1] in (b"{", b"["):
        try:
            return json.loads(data)
        except ValueError as exc:
            raise DumpError("bad_json", str(exc)[:200]) from exc
    try:
        return _NoClasses(io.BytesIO(data)).load()
    except pickle.UnpicklingError as exc:
        raise DumpError("bad_pickle", str(exc)[:200]) from exc
    except (EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        raise DumpError("bad_pickle", f"{type(exc).__name__}: {str(exc)[:200]}") from exc


def _ranks(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):  # "[0, 1, 2]" in dumps written as strings
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError) as exc:
            raise DumpError("bad_field", f"ranks {value[:50]!r}") from exc
    if not isinstance(value, list | tuple) or not all(isinstance(r, int) for r in value):
        raise DumpError("bad_field", f"ranks {str(value)[:50]}")
    return tuple(value)


def _int(value: Any, default: int | None = None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DumpError("bad_field", f"not a number: {str(value)[:50]}")
    return int(value)


def _entry(e: Any) -> Entry:
    if not isinstance(e, dict):
        raise DumpError("bad_field", "entry is not a mapping")
    pg = e.get("process_group")
    if not isinstance(pg, list | tuple) or len(pg) < 2:
        raise DumpError("bad_field", "process_group")
    is_p2p = bool(e.get("is_p2p", False))
    seq = _int(e.get("p2p_seq_id") if is_p2p else e.get("collective_seq_id"))
    if seq is None:
        raise DumpError("bad_field", "collective_seq_id")
    return Entry(
        group=str(pg[0]),
        desc=str(pg[1]),
        seq=seq,
        is_p2p=is_p2p,
        op=str(e.get("profiling_name", "")),
        state=str(e.get("state", "")),
        created_ns=_int(e.get("time_created_ns"), 0) or 0,
        started_ns=_int(e.get("time_discovered_started_ns")),
        completed_ns=_int(e.get("time_discovered_completed_ns")),
        sizes=tuple(tuple(int(x) for x in s) for s in e.get("input_sizes") or ()),
        dtypes=tuple(str(t) for t in e.get("input_dtypes") or ()),
    )


def parse(data: bytes, *, rank: int | None = None) -> Dump:
    """One rank's dump from its bytes (pickle or JSON). Raises :class:`DumpError`."""
    raw = _raw(data)
    if not isinstance(raw, dict) or "entries" not in raw:
        raise DumpError("not_a_dump", "no entries")
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, cfg in (raw.get("pg_config") or {}).items():
        if isinstance(cfg, dict):
            groups[str(name)] = (str(cfg.get("desc", "")), _ranks(cfg.get("ranks", [])))
    status: dict[str, GroupStatus] = {}
    for name, st in (raw.get("pg_status") or {}).items():
        if isinstance(st, dict):
            status[str(name)] = GroupStatus(
                _int(st.get("last_enqueued_collective"), -1) or 0,
                _int(st.get("last_started_collective"), -1) or 0,
                _int(st.get("last_completed_collective"), -1) or 0,
            )
    entries = raw["entries"]
    if not isinstance(entries, list):
        raise DumpError("bad_field", "entries is not a list")
    return Dump(
        rank=rank,
        version=str(raw.get("version", "")),
        groups=groups,
        status=status,
        entries=tuple(_entry(e) for e in entries),
    )


def load(path: str | Path, *, rank: int | None = None) -> Dump:
    """A dump file; the rank defaults to the trailing number of the name (``..._dump_12``)."""
    p = Path(path)
    if rank is None:
        m = re.search(r"(\d+)$", p.name)
        rank = int(m.group(1)) if m else None
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise DumpError("unreadable", str(exc)) from exc
    return parse(data, rank=rank)


def stuck_collectives(dumps: Mapping[int, Dump]) -> list[Stuck]:
    """Per process group whose members disagree: the first collective some member never
    enqueued. Sorted by when it was first enqueued (the first is where the job got stuck)."""
    last: dict[str, dict[int, int]] = {}
    seen: dict[tuple[str, int], list[tuple[int, Entry]]] = {}
    groups: dict[str, tuple[str, tuple[int, ...]]] = {}
    for rank, dump in dumps.items():
        for name, cfg in dump.groups.items():
            groups.setdefault(name, cfg)
        for e in dump.entries:
            if e.is_p2p:
                continue
            mine = last.setdefault(e.group, {})
            mine[rank] = max(mine.get(rank, -1), e.seq)
            seen.setdefault((e.group, e.seq), []).append((rank, e))
    out: list[Stuck] = []
    for name, per_rank in last.items():
        desc, members = groups.get(name, ("", tuple(sorted(per_rank))))
        members = tuple(r for r in members if r in dumps) or tuple(sorted(per_rank))
        values = [per_rank.get(r, -1) for r in members]
        if len(set(values)) <= 1:
            continue
        seq = min(values) + 1
        have = seen.get((name, seq), [])
        if not have:
            continue  # the entry rings no longer hold it: nothing to say
        # described as the lowest member that has it sees it (sizes of an all_to_all differ
        # per rank), as PyTorch's analyzer prints it; dated by the earliest enqueue
        first = min(have, key=lambda re: re[0])[1]
        created = min(e.created_ns for _, e in have)
        out.append(
            Stuck(
                group=name,
                desc=desc or first.desc,
                seq=seq,
                op=first.op,
                sizes=first.sizes,
                dtypes=first.dtypes,
                created_ns=created,
                missing=tuple(r for r in members if per_rank.get(r, -1) < seq),
                present=tuple(sorted(r for r, _ in have)),
            )
        )
    return sorted(out, key=lambda s: s.created_ns)


def last_collectives(dumps: Iterable[Dump]) -> dict[int, dict[str, GroupStatus]]:
    """Per rank, per process group: its last enqueued, started and completed collective (what
    a hang incident shows for each rank)."""
    return {d.rank: dict(d.status) for d in dumps if d.rank is not None}
