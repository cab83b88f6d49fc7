"""``failslow export``: incidents, actions or a job's per-rank history as CSV or Parquet, read
from a running service's REST API (every page), for spreadsheets, notebooks and tickets."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from failslow.cli.client import Client, ClientError, parse_duration, resolve_target

FORMATS = ("csv", "parquet")
WHAT = ("incidents", "actions", "history")


def _utc(ns: int | None) -> str | None:
    return None if not ns else datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def flat(row: dict[str, Any]) -> dict[str, Any]:
    """One row of scalars: nested values as JSON text, and each ``*_ns`` time beside it in UTC."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        out[k] = json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v
        if k.endswith("_ns") and (isinstance(v, int) or v is None):
            out[f"{k[:-3]}_utc"] = _utc(v)
    return out


def history_rows(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The history in long form: a row per (bucket, rank) with the job's step time beside it."""
    rows = []
    for i, b in enumerate(body["buckets"]):
        base = {
            "job": body["job"],
            "bucket": b["bucket"],
            "end_ns": b["end_ns"],
            "end_utc": _utc(b["end_ns"]),
            "steps": b["steps"],
            "step_time_s": b["step_time_s"],
            "step_time_max_s": b["step_time_max_s"],
        }
        for r in body["ranks"]:
            score = r["score"][i] if i < len(r["score"]) else None
            rows.append({**base, "rank": r["rank"], "score": score})
    return rows


def write(rows: list[dict[str, Any]], out: Path, fmt: str) -> None:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    if fmt == "csv":
        with open(out, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=columns)
            w.writeheader()
            w.writerows(rows)
        return
    try:
        import pyarrow as pa  # noqa: PLC0415 - optional
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError:
        raise ClientError(
            "Parquet needs pyarrow: pip install 'failslow[eval]' (or use --format csv)"
        ) from None
    table = pa.table({c: [r.get(c) for r in rows] for c in columns})
    pq.write_table(table, out)


def cmd_export(args: argparse.Namespace) -> int:
    c = Client(resolve_target(args.url, args.token, args.context))
    since = since_ns = None
    if args.since:
        since_ns = int((datetime.now(UTC).timestamp() - parse_duration(args.since)) * 1e9)
        since = _utc(since_ns)
    if args.what == "history":
        if not args.job:
            raise ClientError("export history needs --job JOB")
        body = c.get(f"/v1/jobs/{args.job}/history", buckets=2000, max_ranks=1_000_000)
        rows = [r for r in history_rows(body) if since_ns is None or r["end_ns"] >= since_ns]
    else:
        path = f"/v1/jobs/{args.job}/{args.what}" if args.job else f"/v1/{args.what}"
        rows = [flat(r) for r in c.listing(path, since=since, limit=1000)]
    out = Path(args.out or f"{args.what}{'-' + args.job if args.job else ''}.{args.format}")
    write(rows, out, args.format)
    print(f"wrote {len(rows)} rows of {args.what} to {out}", file=sys.stderr)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("export", help="incidents, actions or a job's history as CSV or Parquet")
    p.add_argument("what", choices=WHAT)
    p.add_argument("--job", help="one job (required for history)")
    p.add_argument("--since", help="incidents active, actions made, history buckets ended "
                   "within this long (7d)")  # fmt: skip
    p.add_argument("--format", choices=FORMATS, default="csv")
    p.add_argument("--out", help="file (default <what>[-<job>].<format>)")
    g = p.add_argument_group("connection")
    g.add_argument("--url")
    g.add_argument("--token")
    g.add_argument("--context")
    p.set_defaults(func=cmd_export)
