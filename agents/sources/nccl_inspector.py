"""NCCL Inspector (NCCL >= 2.28 profiler plugin): tail its JSONL dumps, map them to v1 records.

``NCCL_PROFILER_PLUGIN=inspector NCCL_INSPECTOR_ENABLE=1 NCCL_INSPECTOR_DUMP_DIR=<dir>`` makes
every process write ``<dir>/<hostname>-pid<PID>.log``: one compact JSON object per line with a
``header`` (communicator hash ``id``, ``comm_name``, the rank *within the communicator*,
``n_ranks``), ``metadata`` (``dump_timestamp_us``, ``hostname``, ``pid``) and either
``coll_perf`` (``coll``, ``coll_sn``, bytes, ``coll_exec_time_us`` — int or float) or
``p2p_perf``, optionally with ``event_trace_ts`` (kernel start/stop times, µs).

Caveats handled here (see ``../shared/fixtures/telemetry/README.md``): ``coll_sn`` counts per
communicator *and per collective type*, so the v1 comm id includes the type; NCCL 2.28/2.29
write only the latest collective per communicator at each dump, so sequence numbers have gaps
(fine: a collective is joined on identical numbers, missing ones are simply absent); unknown
keys are ignored; files rotate and lines arrive partially written. Bad lines are counted by
reason, never raised.

Inspector knows ranks only within a communicator: a :class:`RankMap` (from the SDK's
``register_comm`` calls, or explicit) turns them into global ranks. Without a kernel timestamp
a record's end is its dump time; only durations matter to lateness, and they come from
``coll_exec_time_us`` on the rank's own clock.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from failslow.detectors.vocab import CommKind

MAX_LINE = 1 << 20


class InspectorError(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class InspectorRecord:
    comm_hash: str
    comm_name: str
    comm_rank: int
    n_ranks: int
    host: str
    pid: int | None
    dump_us: int
    p2p: bool
    op: str  # v1 spelling: allreduce, reducescatter, send, recv, ...
    sn: int
    nbytes: int
    exec_us: float
    kernel_start_us: int | None = None
    kernel_stop_us: int | None = None
    peer: int | None = None  # p2p: the other side's rank within the communicator


def _num(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InspectorError("bad_field", what)
    return float(v)


def parse_obj(doc: Any) -> InspectorRecord:
    if not isinstance(doc, dict):
        raise InspectorError("not_an_object")
    h, m = doc.get("header"), doc.get("metadata")
    if not isinstance(h, dict) or not isinstance(m, dict):
        raise InspectorError("no_header")
    perf, p2p = doc.get("coll_perf"), False
    if perf is None and isinstance(doc.get("p2p_perf"), dict):
        perf, p2p = doc["p2p_perf"], True
    if not isinstance(perf, dict):
        raise InspectorError("no_perf")
    pre = "p2p" if p2p else "coll"
    op = perf.get(pre)
    if not isinstance(op, str) or not op:
        raise InspectorError("bad_field", f"{pre}")
    kernel_start = kernel_stop = None
    ts = perf.get("event_trace_ts")
    if isinstance(ts, dict) and isinstance(ts.get("kernel_events"), list) and ts["kernel_events"]:
        starts = [k.get("kernel_start_ts") for k in ts["kernel_events"] if isinstance(k, dict)]
        stops = [k.get("kernel_stop_ts") for k in ts["kernel_events"] if isinstance(k, dict)]
        if all(isinstance(x, int) for x in starts + stops) and starts and stops:
            kernel_start, kernel_stop = min(starts), max(stops)
    peer = perf.get("p2p_peer") if p2p else None
    return InspectorRecord(
        comm_hash=str(h.get("id", "")),
        comm_name=str(h.get("comm_name", "")),
        comm_rank=int(_num(h.get("rank"), "header.rank")),
        n_ranks=int(_num(h.get("n_ranks"), "header.n_ranks")),
        host=str(m.get("hostname", "")),
        pid=int(m["pid"]) if isinstance(m.get("pid"), int) else None,
        dump_us=int(_num(m.get("dump_timestamp_us"), "dump_timestamp_us")),
        p2p=p2p,
        op=op.lower(),
        sn=int(_num(perf.get(f"{pre}_sn"), f"{pre}_sn")),
        nbytes=int(_num(perf.get(f"{pre}_msg_size_bytes"), f"{pre}_msg_size_bytes")),
        exec_us=_num(perf.get(f"{pre}_exec_time_us"), f"{pre}_exec_time_us"),
        kernel_start_us=kernel_start,
        kernel_stop_us=kernel_stop,
        peer=int(peer) if isinstance(peer, int) else None,
    )


def parse_line(line: str | bytes) -> InspectorRecord:
    if len(line) > MAX_LINE:
        raise InspectorError("line_too_long")
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise InspectorError("bad_json", str(exc)[:100]) from exc
    return parse_obj(doc)


@dataclass
class _File:
    inode: int
    offset: int = 0
    partial: bytes = b""


@dataclass
class Tailer:
    """Follows every ``*.log`` in a dump directory: new files, appended lines, rotation
    (a new inode, or a file shorter than what was read), partial last lines (kept until their
    newline arrives). ``rejected`` counts bad lines by reason."""

    directory: Path
    pattern: str = "*.log"
    files: dict[str, _File] = field(default_factory=dict)
    rejected: Counter[str] = field(default_factory=Counter)
    read_lines: int = 0

    def poll(self) -> list[InspectorRecord]:
        out: list[InspectorRecord] = []
        try:
            paths = sorted(Path(self.directory).glob(self.pattern))
        except OSError:
            return out
        for path in paths:
            out.extend(self._read(path))
        return out

    def _read(self, path: Path) -> Iterator[InspectorRecord]:
        try:
            st = path.stat()
        except OSError:
            return
        state = self.files.get(str(path))
        if state is None or state.inode != st.st_ino or st.st_size < state.offset:
            state = self.files[str(path)] = _File(st.st_ino)  # new or rotated: from the start
        if st.st_size == state.offset:
            return
        try:
            with open(path, "rb") as fh:
                fh.seek(state.offset)
                chunk = fh.read(st.st_size - state.offset)
        except OSError:
            return
        state.offset += len(chunk)
        data = state.partial + chunk
        *lines, state.partial = data.split(b"\n")
        if len(state.partial) > MAX_LINE:
            self.rejected["line_too_long"] += 1
            state.partial = b""
        for line in lines:
            if not line.strip():
                continue
            self.read_lines += 1
            try:
                yield parse_line(line)
            except InspectorError as exc:
                self.rejected[exc.reason] += 1


Resolve = Callable[[InspectorRecord], tuple[int, ...] | None]


@dataclass
class RankMap:
    """Communicator -> global ranks in communicator order, by hash or by ``comm_name``.

    Fill it from what the training script registers (``Recorder.register_comm``) or by hand;
    a communicator as large as the world with no entry is taken to be the world itself.
    """

    by_hash: dict[str, tuple[int, ...]] = field(default_factory=dict)
    by_name: dict[str, tuple[int, ...]] = field(default_factory=dict)
    world_size: int | None = None

    def members(self, rec: InspectorRecord) -> tuple[int, ...] | None:
        got = self.by_hash.get(rec.comm_hash) or self.by_name.get(rec.comm_name)
        if got is not None and len(got) == rec.n_ranks:
            return got
        if self.world_size is not None and rec.n_ranks == self.world_size:
            return tuple(range(self.world_size))
        return None


_KIND_WORDS = (
    (CommKind.EP, ("EXPERT", "EP ")),
    (CommKind.TP, ("TENSOR", "TP ")),
    (CommKind.PP, ("PIPELINE", "PP ")),
    (CommKind.CP, ("CONTEXT", "CP ")),
    (CommKind.DP, ("DATA", "DP ")),
)


def kind_of(comm_name: str, size: int, world: int | None) -> CommKind:
    """A v1 comm kind from Megatron/PyTorch-style names ("DP Group 0", "TENSOR_MODEL_...")."""
    name = comm_name.upper() + " "
    for kind, words in _KIND_WORDS:
        if any(w in name for w in words):
            return kind
    return CommKind.WORLD if world is not None and size == world else CommKind.OTHER


def comm_id(rec: InspectorRecord) -> str:
    """The v1 comm id: one per communicator and collective type (``coll_sn`` counts per type);
    p2p records of one pair share one id."""
    h = rec.comm_hash.removeprefix("0x") or "unknown"
    return f"nccl-{h}-{'p2p' if rec.p2p else rec.op}"


def to_v1(rec: InspectorRecord, ranks: RankMap) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """``(comm announcement, collective record)`` in v1 form, or None if the communicator's
    global ranks are unknown. Kernel times are used when present; else the record ends at its
    dump time and lasts ``coll_exec_time_us``."""
    members = ranks.members(rec)
    if members is None or not 0 <= rec.comm_rank < len(members):
        return None
    if rec.kernel_start_us is not None and rec.kernel_stop_us is not None:
        start_ns, end_ns = rec.kernel_start_us * 1000, rec.kernel_stop_us * 1000
    else:
        end_ns = rec.dump_us * 1000
        start_ns = end_ns - int(round(rec.exec_us * 1000))
    cid = comm_id(rec)
    kind = CommKind.P2P if rec.p2p else kind_of(rec.comm_name, len(members), ranks.world_size)
    comm = {"comm": cid, "kind": kind, "ranks": list(members)}
    record: dict[str, Any] = {
        "rank": members[rec.comm_rank],
        "comm": cid,
        "seq": rec.sn,
        "op": rec.op,
        "bytes": rec.nbytes,
        "start_ns": start_ns,
        "end_ns": end_ns,
    }
    if rec.p2p:
        if rec.peer is None or not 0 <= rec.peer < len(members):
            return None
        record["peer"] = members[rec.peer]
        comm["ranks"] = sorted({members[rec.comm_rank], members[rec.peer]})
        comm["comm"] = record["comm"] = (
            f"{cid}-{min(record['rank'], record['peer'])}-{max(record['rank'], record['peer'])}"
        )
    return comm, record


def default_dir() -> Path | None:
    d = os.environ.get("NCCL_INSPECTOR_DUMP_DIR")
    return Path(d) if d else None


class InspectorSource:
    """What the node agent runs: tail the dump directory and hand back wire items
    (``["m", ...]`` announcements and ``["c", ...]`` collectives), each collective once.

    Inspector may write the same latest collective at several dumps (with different dump
    times); the first sighting wins, so a re-dump is never a conflicting re-send. Records of
    communicators the rank map cannot place are counted in ``unmapped``.
    """

    def __init__(self, directory: str | Path, ranks: RankMap, *, remember: int = 200_000) -> None:
        self.tailer = Tailer(Path(directory))
        self.ranks = ranks
        self.remember = remember
        self._seen: dict[tuple[str, int, int], None] = {}
        self._announced: set[str] = set()
        self._ranks_announced: set[int] = set()
        self.unmapped = 0
        self.records = 0

    def poll(self) -> list[list[Any]]:
        items: list[list[Any]] = []
        for rec in self.tailer.poll():
            mapped = to_v1(rec, self.ranks)
            if mapped is None:
                self.unmapped += 1
                continue
            comm, c = mapped
            key = (c["comm"], c["seq"], c["rank"])
            if key in self._seen:
                continue
            self._seen[key] = None
            if len(self._seen) > self.remember:
                self._seen.pop(next(iter(self._seen)))
            if c["rank"] not in self._ranks_announced:
                # this rank's records are on this host: announce it here (its device index is
                # not in Inspector's output)
                self._ranks_announced.add(c["rank"])
                items.append(["r", c["rank"], None, self.ranks.world_size])
            if comm["comm"] not in self._announced:
                self._announced.add(comm["comm"])
                items.append(["m", comm["comm"], comm["kind"], comm["ranks"]])
            items.append(
                [
                    "c",
                    c["rank"],
                    c["comm"],
                    c["seq"],
                    c["op"],
                    c["bytes"],
                    c["start_ns"],
                    c["end_ns"],
                    c.get("peer"),
                ]
            )
            self.records += 1
        return items

    @staticmethod
    def load_rank_map(path: str | Path) -> RankMap:
        """``{"by_name": {"DP Group 0": [0, 1]}, "by_hash": {...}, "world_size": 64}``."""
        doc = json.loads(Path(path).read_text())
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: a JSON object expected")
        return RankMap(
            by_hash={str(k): tuple(int(x) for x in v) for k, v in doc.get("by_hash", {}).items()},
            by_name={str(k): tuple(int(x) for x in v) for k, v in doc.get("by_name", {}).items()},
            world_size=int(doc["world_size"]) if doc.get("world_size") else None,
        )
