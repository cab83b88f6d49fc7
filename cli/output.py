"""Output of the operator commands: ``table`` (the default), ``wide``, ``json`` and ``yaml``.
Tables show times in local time; json and yaml are what the service returned."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

OUTPUTS = ("table", "wide", "json", "yaml")


def local_time(ns: int | None) -> str:
    if not ns:
        return "-"
    return datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")


def _num(v: Any, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _where(r: dict[str, Any]) -> str:
    hosts = ",".join(r.get("hosts") or [])
    ranks = ",".join(str(x) for x in (r.get("ranks") or [])[:8])
    return f"{hosts} rank {ranks}" if ranks else hosts or "-"


Col = tuple[str, Callable[[dict[str, Any]], Any], bool]  # header, value, wide only
PART_COLUMNS: list[Col] = [
    ("PART", lambda r: r["part"], False),
    ("HOST", lambda r: r["host"], False),
    ("STATE", lambda r: r["state"], False),
    ("FLAGGED", lambda r: "yes" if r["flagged"] else "", False),
    ("SCORE", lambda r: _num(r["score"], "{:.3f}"), False),
    ("SLOWNESS", lambda r: _num(r["slowness"], "{:.3f}x"), False),
    ("JOBS", lambda r: r["jobs_seen"], False),
    ("INCIDENTS", lambda r: r["incidents"], False),
    ("COST", lambda r: _num(r["cost_s"], "{:.1f}s"), False),
    ("INTERVAL", lambda r: f"{r['slowness_low']:.3f}-{r['slowness_high']:.3f}", True),
    ("HOURS", lambda r: _num(r["observed_h"], "{:.2f}"), True),
    ("REASONS", lambda r: "; ".join(r["reasons"]) or "-", True),
]
COLUMNS: dict[str, list[Col]] = {
    "qualify": [
        ("HOST", lambda r: r["host"], False),
        ("VERDICT", lambda r: r["verdict"], False),
        ("COMPUTE", lambda r: _num(r.get("compute_s"), "{:.3f}s"), False),
        ("LINK", lambda r: _num(r["link_bps"] / 1e6 if r.get("link_bps") else None,
                                "{:.1f}MB/s"), False),  # fmt: skip
        ("REASONS", lambda r: "; ".join(r["reasons"]) or "-", False),
    ],
    "hosts": PART_COLUMNS,
    "gpus": PART_COLUMNS,
    "nics": PART_COLUMNS,
    "jobs": [
        ("JOB", lambda r: r["job"], False),
        ("STATE", lambda r: r["state"], False),
        ("WORLD", lambda r: r["world_size"], False),
        ("HOSTS", lambda r: r["hosts"], False),
        ("STEP", lambda r: r["step"], False),
        ("STEP TIME", lambda r: _num(r["step_time_s"], "{:.3f}s"), False),
        ("SLOWDOWN", lambda r: _num(r["slowdown"], "{:.2f}x"), False),
        ("OPEN", lambda r: r["open_incidents"], False),
        ("BASELINE", lambda r: _num(r["baseline_step_time_s"], "{:.3f}s"), True),
        ("LAST SEEN", lambda r: local_time(r["last_seen_ns"]), True),
    ],
    "incidents": [
        ("ID", lambda r: r["id"], False),
        ("JOB", lambda r: r["job"], False),
        ("KIND", lambda r: r["kind"], False),
        ("STATE", lambda r: r["resolution"] or r["state"], False),
        ("WHERE", _where, False),
        ("SEVERITY", lambda r: r["severity"], False),
        ("SINCE", lambda r: local_time(r["onset_ns"]), False),
        ("SLOWDOWN", lambda r: _num(r["slowdown"], "{:.2f}x"), True),
        ("CONFIDENCE", lambda r: _num(r["confidence"]), True),
        ("SUMMARY", lambda r: r["summary"], True),
    ],
    "actions": [
        ("ID", lambda r: r["id"], False),
        ("JOB", lambda r: r["job"], False),
        ("KIND", lambda r: r["kind"], False),
        ("TARGET", lambda r: r["target"], False),
        ("STATE", lambda r: r["state"], False),
        ("MODE", lambda r: r["mode"], False),
        ("CREATED", lambda r: local_time(r["created_ns"]), False),
        ("INCIDENT", lambda r: r["incident"] or "-", True),
        ("DECIDED BY", lambda r: r["decided_by"] or "-", True),
        ("REASON", lambda r: r["reason"], True),
    ],
    "ranks": [
        ("RANK", lambda r: r["rank"], False),
        ("HOST", lambda r: r["host"], False),
        ("GPU", lambda r: r["gpu"], False),
        ("STATE", lambda r: r["state"], False),
        ("SCORE", lambda r: _num(r["score"]), False),
        ("LATENESS", lambda r: _num(r["lateness_s"], "{:.4f}s"), False),
    ],
    "audit": [
        ("AT", lambda r: local_time(r["at_ns"]), False),
        ("ACTOR", lambda r: r["actor"], False),
        ("VERB", lambda r: r["verb"], False),
        ("JOB", lambda r: r["job"] or "*", False),
        ("TARGET", lambda r: r["target"] or "-", False),
        ("REASON", lambda r: r["reason"], False),
        ("DETAIL", lambda r: json.dumps(r["detail"]), True),
    ],
    "config": [
        ("KEY", lambda r: r["key"], False),
        ("VALUE", lambda r: json.dumps(r["value"]), False),
        ("SOURCE", lambda r: r["source"], False),
        ("ENV", lambda r: r["env"], True),
        ("TUNABLE", lambda r: "yes" if r["tunable"] else "", True),
    ],
    "contexts": [
        ("NAME", lambda r: r["name"], False),
        ("URL", lambda r: r["url"], False),
        ("TOKEN", lambda r: r["token"], False),
        ("CURRENT", lambda r: r["current"], False),
    ],
}


def table(rows: list[dict[str, Any]], cols: list[Col], wide: bool) -> str:
    cols = [c for c in cols if wide or not c[2]]
    cells = [[str(c[0]) for c in cols]] + [
        ["-" if (v := c[1](r)) is None else str(v) for c in cols] for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _incident_text(inc: dict[str, Any]) -> str:
    lines = [
        f"Incident:    {inc['id']}  ({inc['kind']}, {inc['severity']}, {inc['state']}"
        + (f", {inc['resolution']}" if inc.get("resolution") else "")
        + ")",
        f"Job:         {inc['job']}",
        f"Where:       {_where(inc)}",
        f"Since:       {local_time(inc['onset_ns'])} (step {inc['onset_step']})",
        f"Detected:    {local_time(inc['detected_ns'])} (step {inc['detected_step']})",
    ]
    if inc.get("resolved_ns"):
        lines.append(f"Resolved:    {local_time(inc['resolved_ns'])}")
    lines += [
        f"Impact:      job step time {_num(inc['slowdown'], '{:.2f}x')}, subject "
        f"{_num(inc['subject_slowdown'], '{:.2f}x')}, confidence {_num(inc['confidence'])}",
        f"Summary:     {inc['summary']}",
        "Evidence:",
        *(f"  {k}: {json.dumps(v)[:160]}" for k, v in sorted(inc["evidence"].items())),
        "Hardware:" if inc.get("hardware") else "Hardware:    none marked (yet)",
        *(
            f"  {h['kind']} {h['part']}"
            + (f" ({h['id_source']})" if h.get("id_source") else "")
            + f" on {h['host']}: {h['state']} in the fleet"
            for h in inc.get("hardware", [])
        ),
        "Actions:" if inc.get("actions") else "Actions:     none",
        *(
            f"  {a['id']}  {a['kind']} {a['target']}  {a['state']}  {a['reason'][:80]}"
            for a in inc.get("actions", [])
        ),
        "Timeline:",
        *(f"  {e['at']}  {e['what']}" for e in inc.get("timeline", [])),
    ]
    return "\n".join(lines)


def _yaml(data: Any) -> str:
    import yaml  # noqa: PLC0415 - only for -o yaml

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip()


def emit(kind: str, data: Any, fmt: str) -> None:
    if fmt == "json":
        text = json.dumps(data, indent=2)
    elif fmt == "yaml":
        text = _yaml(data)
    elif kind in COLUMNS:
        text = table(data, COLUMNS[kind], fmt == "wide") if data else f"No {kind}."
    elif kind == "incident":
        text = _incident_text(data)
    else:  # one object: key: value
        text = "\n".join(
            f"{k}: {json.dumps(v) if isinstance(v, dict | list) else v}" for k, v in data.items()
        )
    print(text, file=sys.stdout)
