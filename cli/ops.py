"""Operator commands in kubectl's habits: ``get``, ``describe``, ``approve``/``reject``,
``mute``/``unmute``, ``pause``/``resume``, ``maintenance``, ``resolve``, ``config``, ``status``
and ``context``. Each talks to a running service over its REST API (cli/client.py); changes
carry a reason, and the service records the actor from the token."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import Any

from failslow.cli import fleet
from failslow.cli.client import (
    ClientError,
    client_of,
    load_config,
    parse_duration,
    save_config,
)
from failslow.cli.output import OUTPUTS, emit, local_time

RESOURCES = ("jobs", "incidents", "actions", "ranks", "audit", *fleet.KINDS)


_client = client_of


def _since_ns(args: argparse.Namespace) -> int | None:
    if not getattr(args, "since", None):
        return None
    return time.time_ns() - int(parse_duration(args.since) * 1e9)


def cmd_get(args: argparse.Namespace) -> int:
    c = _client(args)
    what = args.resource
    if what in fleet.KINDS:
        fleet.get(c, args)
        return 0
    if args.sort or args.flagged or args.host:
        raise ClientError("--sort, --flagged and --host are for hosts, gpus and nics")
    if what == "ranks" and not args.job:
        raise ClientError("get ranks needs --job JOB")
    since_ns = _since_ns(args)
    since = None if since_ns is None else rfc3339(since_ns)
    if what == "jobs":
        rows = c.listing("/v1/jobs", most=args.limit)
    elif what in ("incidents", "actions"):
        path = f"/v1/jobs/{args.job}/{what}" if args.job else f"/v1/{what}"
        state = args.state or ("all" if what == "incidents" else None)
        rows = c.listing(path, most=args.limit, state=state, since=since)
    elif what == "ranks":
        rows = c.listing(f"/v1/jobs/{args.job}/ranks", most=args.limit, state=args.state,
                         limit=10_000)  # fmt: skip
    else:
        rows = c.get("/v1/audit", job=args.job, limit=args.limit or 100)
        if since_ns is not None:
            rows = [r for r in rows if r["at_ns"] >= since_ns]
    emit(what, rows, args.output)
    return 0


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat()


def cmd_describe(args: argparse.Namespace) -> int:
    c = _client(args)
    if args.resource in fleet.ONE:
        fleet.describe(c, args)
        return 0
    if args.resource == "job":
        job = c.get(f"/v1/jobs/{args.name}")
        job["control"] = c.get(f"/v1/jobs/{args.name}/control")
        job["incidents"] = c.get(f"/v1/jobs/{args.name}/incidents", state="open")
        emit("job", job, args.output)
        return 0
    inc = c.get(f"/v1/incidents/{args.name}")
    acts = [a for a in c.get(f"/v1/jobs/{inc['job']}/actions") if a["incident"] == inc["id"]]
    for a in acts:
        a["events"] = c.get(f"/v1/actions/{a['id']}/events")
    audit = [
        e
        for e in c.get("/v1/audit", job=inc["job"], limit=1000)
        if e["target"] == inc["id"] or e["target"] in {a["id"] for a in acts}
    ]
    inc["actions"] = acts
    inc["audit"] = audit
    inc["hardware"] = c.get(f"/v1/fleet/incidents/{inc['id']}")  # the parts it named
    inc["timeline"] = timeline(inc, acts, audit)
    emit("incident", inc, args.output)
    return 0


def timeline(
    inc: dict[str, Any], acts: list[dict[str, Any]], audit: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The incident's story in time order: onset, detection, actions' transitions, operators'
    changes, resolution (event-time fields from the job's clock, the others the service's)."""
    ev = [
        {"at_ns": inc["onset_ns"], "what": f"onset (step {inc['onset_step']})"},
        {"at_ns": inc["detected_ns"], "what": f"detected (step {inc['detected_step']})"},
    ]
    for a in acts:
        for e in a.get("events", []):
            who = f" by {e['actor']}" if e.get("actor") else ""
            ev.append(
                {
                    "at_ns": e["at_ns"],
                    "what": f"{a['kind']} {a['id']}: {e['from_state'] or 'new'} -> "
                    f"{e['to_state']}{who}",
                }
            )
    for e in audit:
        ev.append({"at_ns": e["at_ns"], "what": f"{e['verb']} by {e['actor']}: {e['reason']}"})
    if inc.get("resolved_ns"):
        ev.append({"at_ns": inc["resolved_ns"], "what": f"resolved ({inc.get('resolution')})"})
    for e in ev:
        e["at"] = local_time(e["at_ns"])
    return sorted(ev, key=lambda e: e["at_ns"])


def _decide(args: argparse.Namespace, verb: str) -> int:
    out = _client(args).post(f"/v1/actions/{args.action}/{verb}", {"reason": args.reason})
    emit("actions", [out], args.output)
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, "approve")


def cmd_reject(args: argparse.Namespace) -> int:
    return _decide(args, "reject")


def cmd_mute(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"reason": args.reason}
    if getattr(args, "for_", None):
        body["for_s"] = parse_duration(args.for_)
    emit("control", _client(args).post(f"/v1/jobs/{args.job}/{args.verb}", body), args.output)
    return 0


def cmd_maintenance(args: argparse.Namespace) -> int:
    c = _client(args)
    if args.end_window:
        out = c.request(
            "DELETE",
            f"/v1/jobs/{args.job}/maintenance/{args.end_window}",
            params={"reason": args.reason},
        )
    else:
        body: dict[str, Any] = {"reason": args.reason, "for_s": parse_duration(args.for_)}
        if args.start:
            body["start"] = datetime.fromisoformat(args.start).astimezone().isoformat()
        out = c.post(f"/v1/jobs/{args.job}/maintenance", body)
    emit("control", out, args.output)
    return 0


def cmd_resolve(args: argparse.Namespace) -> int:
    out = _client(args).post(f"/v1/incidents/{args.incident}/resolve", {"reason": args.reason})
    emit("incidents", [out], args.output)
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    if args.action != "get" and not (args.key and args.reason):
        raise ClientError(
            f"config {args.action} needs KEY{' VALUE' if args.action == 'set' else ''} and --reason"
        )
    c = _client(args)
    base = f"/v1/jobs/{args.job}/config" if args.job else "/v1/config"
    if args.action == "get":
        rows = c.get(base)
        if args.key:
            rows = [r for r in rows if r["key"] in (args.key, f"detection.{args.key}")]
            if not rows:
                raise ClientError(f"no setting {args.key!r} (`failslow config get` lists them)")
    elif args.action == "set":
        if args.value is None:
            raise ClientError("config set needs KEY VALUE")
        try:
            value = float(args.value)
        except ValueError:
            raise ClientError(f"{args.value!r} is not a number") from None
        rows = c.request("PUT", f"{base}/{args.key}", json={"value": value, "reason": args.reason})
        rows = [r for r in rows if r["key"] in (args.key, f"detection.{args.key}")]
    else:
        rows = c.request("DELETE", f"{base}/{args.key}", params={"reason": args.reason})
        rows = [r for r in rows if r["key"] in (args.key, f"detection.{args.key}")]
    emit("config", rows, args.output)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    c = _client(args)
    info = c.get("/openapi.json")["info"]
    status: dict[str, Any] = {
        "url": c.target.url,
        "context": c.target.context,
        "version": info.get("version"),
    }
    status["healthy"] = c.get("/healthz").get("status") == "ok"
    try:
        status["ready"] = c.get("/readyz").get("status")
    except ClientError as exc:
        status["ready"] = str(exc).removeprefix("failslow: ")
    status["replica"] = replica = c.get("/v1/replica")
    if replica.get("bus"):
        owned = replica.get("owned", {})
        status["partitions_owned"] = len(owned)
        # behind: stream sequences between the partition's newest message and what is applied
        status["lag_max_seq"] = max((p.get("behind") or 0 for p in owned.values()), default=0)
    jobs = c.get("/v1/jobs")
    status["jobs"] = len(jobs)
    status["jobs_by_state"] = {
        s: sum(1 for j in jobs if j["state"] == s) for s in sorted({j["state"] for j in jobs})
    }
    status["open_incidents"] = sum(j["open_incidents"] for j in jobs)
    emit("status", status, args.output)
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    cfg = load_config()
    if args.action == "list":
        rows = [
            {
                "name": n,
                "url": c.get("url"),
                "token": "set" if c.get("token") else "",
                "current": "*" if n == cfg.get("current") else "",
            }
            for n, c in sorted(cfg["contexts"].items())
        ]
        emit("contexts", rows, args.output)
        return 0
    if not args.name:
        raise ClientError(f"context {args.action} needs a NAME")
    if args.action == "set":
        entry = cfg["contexts"].setdefault(args.name, {})
        if args.url_value:
            entry["url"] = args.url_value
        if args.token_value:
            entry["token"] = args.token_value
        if "url" not in entry:
            raise ClientError("a new context needs --url")
        if cfg.get("current") is None:
            cfg["current"] = args.name
    elif args.action == "use":
        if args.name not in cfg["contexts"]:
            raise ClientError(f"no context {args.name!r}; add it with `failslow context set`")
        cfg["current"] = args.name
    elif args.action == "delete":
        cfg["contexts"].pop(args.name, None)
        if cfg.get("current") == args.name:
            cfg["current"] = None
    path = save_config(cfg)
    print(
        f"{args.action}: {args.name} ({path}); current context: {cfg.get('current')}",
        file=sys.stderr,
    )
    return 0


def _connection(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("connection")
    g.add_argument("--url", help="service URL (else FAILSLOW_URL, the context, 127.0.0.1:8000)")
    g.add_argument("--token", help="bearer token (else FAILSLOW_TOKEN, the context)")
    g.add_argument("--context", help="a context of the client configuration")
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table", help="output format")


def register(sub: Any) -> None:
    from failslow.cli.export import register as register_export  # noqa: PLC0415

    p = sub.add_parser("get", help="list jobs, incidents, actions, ranks, the audit trail, or "
                       "the fleet's hosts, gpus and nics")  # fmt: skip
    p.add_argument("resource", choices=RESOURCES)
    p.add_argument("--job", help="only this job (required for ranks)")
    p.add_argument("--state", help="open|resolved|all for incidents; an action or rank state")
    p.add_argument("--since", help="incidents active, actions made, changes within this long "
                   "(15m, 2h, 1d)")  # fmt: skip
    p.add_argument("--limit", type=int, default=None, help="at most this many")
    p.add_argument("--sort", choices=fleet.SORTS, help="hosts|gpus|nics: order (default cost)")
    p.add_argument("--flagged", action="store_true", help="hosts|gpus|nics: only flagged ones")
    p.add_argument("--host", help="gpus|nics: only this host's")
    _connection(p)
    p.set_defaults(func=cmd_get)

    p = sub.add_parser(
        "describe",
        help="one incident (what, where, since when, evidence, actions, timeline), one job, or "
        "one host, gpu or nic of the fleet (health, history, incidents)",
    )
    p.add_argument("resource", choices=("incident", "job", *fleet.ONE))
    p.add_argument("name", help="incident id, job id, host name, GPU UUID, host/NIC")
    _connection(p)
    p.set_defaults(func=cmd_describe)

    for verb, fn, what in (
        ("approve", cmd_approve, "approve a proposed action"),
        ("reject", cmd_reject, "reject a proposed action"),
    ):
        p = sub.add_parser(verb, help=what)
        p.add_argument("action", help="action id")
        p.add_argument("--reason", required=True, help="why (recorded in the audit trail)")
        _connection(p)
        p.set_defaults(func=fn)

    for verb, what in (
        ("mute", "detect, but neither act nor notify"),
        ("unmute", "undo mute"),
        ("pause", "pause a job's detection"),
        ("resume", "resume detection"),
    ):
        p = sub.add_parser(verb, help=what)
        p.add_argument("job")
        if verb == "mute":
            p.add_argument("--for", dest="for_", help="for this long (2h); default until unmuted")
        p.add_argument("--reason", required=True, help="why (recorded in the audit trail)")
        _connection(p)
        p.set_defaults(func=cmd_mute, verb=verb)

    fleet.register(sub, _connection)

    p = sub.add_parser("maintenance", help="a maintenance window: detection paused, nothing done")
    p.add_argument("job")
    p.add_argument("--for", dest="for_", default="1h", help="length (default 1h)")
    p.add_argument("--start", help="local ISO time (default now)")
    p.add_argument("--end-window", help="end this window (its id) instead")
    p.add_argument("--reason", required=True, help="why (recorded in the audit trail)")
    _connection(p)
    p.set_defaults(func=cmd_maintenance)

    p = sub.add_parser("resolve", help="resolve an open incident by hand")
    p.add_argument("incident")
    p.add_argument("--reason", required=True, help="why (recorded in the audit trail)")
    _connection(p)
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("config", help="the effective configuration; set or unset thresholds")
    p.add_argument("action", choices=("get", "set", "unset"))
    p.add_argument("key", nargs="?", help="e.g. detection.compute_ratio")
    p.add_argument("value", nargs="?", help="the value (set)")
    p.add_argument("--job", help="for this job only (else the whole fleet)")
    p.add_argument("--reason", help="why (required to set or unset)")
    _connection(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("status", help="the service: version, health, replicas, partitions, jobs")
    _connection(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("context", help="contexts of the client: list, set, use, delete")
    p.add_argument("action", choices=("list", "set", "use", "delete"))
    p.add_argument("name", nargs="?")
    p.add_argument("--url", dest="url_value", help="the service URL (set)")
    p.add_argument("--token", dest="token_value", help="the bearer token (set)")
    p.add_argument("-o", "--output", choices=OUTPUTS, default="table")
    p.set_defaults(func=cmd_context)
    register_export(sub)
