"""NCCL RAS (``ncclras``, NCCL >= 2.24): who is missing, dead or behind, as hang evidence.

Three shapes (samples in ``../shared/fixtures/telemetry``): the JSON status (``ncclras -f json``:
per communicator the ranks that reported, with per-op collective counts, and the missing ranks,
``unresponsive`` / ``considered_dead``), monitor events (``PEER_DEAD`` ...), and the text status,
whose *Errors*/*Warnings* sections name mismatching communicators ("26 ranks have launched up to
operation 6650 / 6 ranks have launched up to operation 6649", followed by the minority's
ranks), missing ranks ("The missing rank: 21") and dead processes. Unknown keys are ignored; bad
input raises :class:`RasError` with a short reason, never anything else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any


class RasError(ValueError):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class RasRank:
    rank: int
    host: str
    pid: int | None
    cuda_dev: int | None
    collectives: int | None  # all collective operations it launched (None when missing)
    unresponsive: bool = False
    dead: bool = False


@dataclass(frozen=True, slots=True)
class RasComm:
    hash: str
    size: int
    ranks: tuple[RasRank, ...]  # those that reported
    missing: tuple[RasRank, ...]

    def lagging(self) -> tuple[int, ...]:
        """Ranks that launched fewer collectives than the others (the ones being waited for)."""
        counts = [r.collectives for r in self.ranks if r.collectives is not None]
        if len(set(counts)) <= 1:
            return ()
        top = max(counts)
        return tuple(
            r.rank for r in self.ranks if r.collectives is not None and r.collectives < top
        )


@dataclass(frozen=True, slots=True)
class RasStatus:
    timestamp: str
    comms: tuple[RasComm, ...]

    def suspects(self) -> dict[int, str]:
        """Global view for a hang: rank -> why (dead, unresponsive, missing, lagging)."""
        out: dict[int, str] = {}
        for c in self.comms:
            for r in c.missing:
                out[r.rank] = "dead" if r.dead else "unresponsive" if r.unresponsive else "missing"
            for rank in c.lagging():
                out.setdefault(rank, "lagging")
        return out


@dataclass(frozen=True, slots=True)
class RasEvent:
    timestamp: str
    group: str
    event: str
    host: str
    pid: int | None
    cuda_devs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class RasFinding:
    """One block of the text status' Errors/Warnings sections."""

    kind: str  # MISMATCH, INCOMPLETE, DEAD, TIMEOUT, ...
    comm: str | None  # "#0-0 (hash)" for per-communicator findings
    message: str
    groups: tuple[tuple[str, tuple[int, ...]], ...] = ()  # ("6 ranks ... 6649", ranks listed)
    missing_ranks: tuple[int, ...] = ()
    processes: tuple[tuple[int, str, int], ...] = ()  # (pid, host, gpu)
    lines: tuple[str, ...] = field(default_factory=tuple)


def _json(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except ValueError as exc:
        raise RasError("bad_json", str(exc)[:200]) from exc


def _opt_int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _rank(d: Any, *, missing: bool) -> RasRank:
    if not isinstance(d, dict) or not isinstance(d.get("rank"), int):
        raise RasError("bad_field", "rank entry without an integer rank")
    st = d.get("status") if isinstance(d.get("status"), dict) else {}
    counts = d.get("collective_counts")
    total = None
    if not missing and isinstance(counts, dict):
        total = sum(int(v) for v in counts.values() if isinstance(v, int | float))
    return RasRank(
        rank=d["rank"],
        host=str(d.get("host", "")),
        pid=_opt_int(d.get("pid")),
        cuda_dev=_opt_int(d.get("cuda_dev")),
        collectives=total,
        unresponsive=bool(st.get("unresponsive", False)),
        dead=bool(st.get("considered_dead", False)),
    )


def parse_status(data: bytes | str) -> RasStatus:
    raw = _json(data)
    if not isinstance(raw, dict) or not isinstance(raw.get("communicators"), list):
        raise RasError("not_a_status", "no communicators list")
    comms = []
    for c in raw["communicators"]:
        if not isinstance(c, dict):
            raise RasError("bad_field", "communicator is not a mapping")
        comms.append(
            RasComm(
                hash=str(c.get("hash", "")),
                size=_opt_int(c.get("size")) or 0,
                ranks=tuple(_rank(r, missing=False) for r in c.get("ranks") or []),
                missing=tuple(_rank(r, missing=True) for r in c.get("missing_ranks") or []),
            )
        )
    return RasStatus(timestamp=str(raw.get("timestamp", "")), comms=tuple(comms))


def parse_event(data: bytes | str) -> RasEvent:
    raw = _json(data)
    if not isinstance(raw, dict) or "event" not in raw:
        raise RasError("not_an_event", "no event")
    peer = raw.get("peer") if isinstance(raw.get("peer"), dict) else {}
    return RasEvent(
        timestamp=str(raw.get("timestamp", "")),
        group=str(raw.get("group", "")),
        event=str(raw["event"]),
        host=str(peer.get("host", "")),
        pid=_opt_int(peer.get("pid")),
        cuda_devs=tuple(int(x) for x in peer.get("cuda_devs") or [] if isinstance(x, int)),
    )


_HEAD = re.compile(r"^(#\d+-\d+ \(([0-9a-fA-F]+)\) )?([A-Z_]+)\s*$")
_GROUP = re.compile(r"^\d+ ranks? have .*$")
_RANK = re.compile(r"^Rank (\d+) -- GPU (\d+) managed by process (\d+) on node (\S+)")
_PROC = re.compile(r"^Process (\d+) on node (\S+) managing GPU (\d+)")
_MISSING = re.compile(r"^The missing ranks?: ([\d, ]+)")


def parse_text(text: str) -> list[RasFinding]:
    """The findings of a text status report's Errors and Warnings sections."""
    if not isinstance(text, str):
        raise RasError("not_text", type(text).__name__)
    findings: list[RasFinding] = []
    block: list[str] | None = None
    head: re.Match[str] | None = None

    def close() -> None:
        if head is None or block is None:
            return
        groups: list[tuple[str, list[int]]] = []
        missing: list[int] = []
        procs: list[tuple[int, str, int]] = []
        message = []
        for line in block:
            if _GROUP.match(line):
                groups.append((line, []))
            elif (m := _RANK.match(line)) and groups:
                groups[-1][1].append(int(m.group(1)))
            elif m := _MISSING.match(line):
                missing += [int(x) for x in m.group(1).replace(" ", "").split(",") if x]
            elif m := _PROC.match(line):
                procs.append((int(m.group(1)), m.group(2), int(m.group(3))))
            else:
                message.append(line)
        findings.append(
            RasFinding(
                kind=head.group(3),
                comm=head.group(1).strip() if head.group(1) else None,
                message=" ".join(message),
                groups=tuple((g, tuple(r)) for g, r in groups),
                missing_ranks=tuple(missing),
                processes=tuple(procs),
                lines=tuple(block),
            )
        )

    for raw_line in text.splitlines():
        line = raw_line.rstrip()
        if not line.strip() or line.startswith("# ----") or set(line.strip()) <= {"="}:
            close()
            block, head = None, None
            continue
        stripped = line.strip()
        m = _HEAD.match(stripped) if not raw_line.startswith(" ") else None
        if m and stripped not in ("Errors", "Warnings"):
            close()
            head, block = m, []
            continue
        if block is not None and raw_line.startswith(" "):
            block.append(stripped)
    close()
    return findings
