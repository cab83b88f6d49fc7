"""The fleet in the operator's commands: ``get hosts|gpus|nics``, ``describe host|gpu|nic`` and
``drain``/``return``, ``qualify`` (docs/fleet.md). Each talks to the service's /v1/fleet REST."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any
from urllib.parse import quote

from failslow.cli.client import Client, ClientError, client_of
from failslow.cli.output import emit

KINDS = ("hosts", "gpus", "nics")  # list resources
ONE = {"host": "hosts", "gpu": "gpus", "nic": "nics"}  # describe resource -> list resource
SORTS = ("cost", "score", "jobs", "name")


def get(c: Client, args: argparse.Namespace) -> None:
    params: dict[str, Any] = {"sort": args.sort or "cost", "limit": args.limit or 10_000}
    if args.state:
        params["state"] = args.state
    if getattr(args, "flagged", False):
        params["flagged"] = "true"
    if getattr(args, "host", None):
        params["host"] = args.host
    emit(args.resource, c.get(f"/v1/fleet/{args.resource}", **params), args.output)


def describe(c: Client, args: argparse.Namespace) -> None:
    part = c.get(f"/v1/fleet/{ONE[args.resource]}/{quote(args.name, safe='/')}")
    if args.output in ("json", "yaml"):
        emit("part", part, args.output)
        return
    print(part_text(part), file=sys.stdout)


def part_text(p: dict[str, Any]) -> str:
    ident = p["part"] + (f" ({p['id_source']})" if p.get("id_source") else "")
    lines = [
        f"Part:        {ident}  [{p['kind']} on {p['host']}, label {p['label']}]",
        f"State:       {p['state']} since {p['state_since']}"
        + (f": {p['state_reason']}" if p["state_reason"] else ""),
        f"Health:      score {p['score']:.3f}, slowness {p['slowness']:.3f}x "
        f"[{p['slowness_low']:.3f}, {p['slowness_high']:.3f}]"
        + ("  FLAGGED" if p["flagged"] else ""),
        f"Seen:        {p['jobs_seen']} jobs ({p['jobs']} with a speed reading), "
        f"{p['observed_h']:.2f} h, {p['first_seen']} .. {p['last_seen']}",
        f"Incidents:   {p['incidents']} ever, {p['incident_jobs']} recent jobs; "
        f"job time lost {p['cost_s']:.1f} s",
        "Reasons:" if p["reasons"] else "Reasons:     none",
        *(f"  {r}" for r in p["reasons"]),
        "Readings (per job or link check):" if p.get("readings") else "Readings:    none",
        *(f"  {r['job']:<28} {r['ratio']:.4f}x  {r['frames']} frames  {r['observed_s']:.0f} s"
          + ("  (link check)" if r.get("source") == "link_check" else "")
          for r in p.get("readings", [])),  # fmt: skip
        "Incidents that named it:" if p.get("marks") else "Marks:       none",
        *(f"  {m['at']}  {m['kind']:<10} {m['severity']:<8} job {m['job']}  "
          f"lost {m['lost_s']:.1f} s" + ("  (hard)" if m["hard"] else "")
          for m in p.get("marks", [])),  # fmt: skip
    ]
    return "\n".join(lines)


def cmd_part_state(args: argparse.Namespace) -> int:
    """``drain`` or ``return`` a part (audited; the service says 409 on a wrong state)."""
    if args.resource not in ONE:
        raise ClientError(f"{args.verb} takes host, gpu or nic, not {args.resource!r}")
    c = client_of(args)
    path = f"/v1/fleet/{ONE[args.resource]}/{quote(args.name, safe='/')}/{args.verb}"
    out = c.post(path, {"reason": args.reason})
    emit(ONE[args.resource], [out], args.output)
    if out.get("hint"):  # the drain/undrain action proposed for its host
        action = str(out["hint"]).split(" ")[0]
        print(f"{args.verb} action for {out['host']}: {out['hint']}; if proposed: failslow "
              f"approve {action} --reason ...", file=sys.stderr)  # fmt: skip
    if out.get("hint_skipped"):
        print(f"no undrain proposed: {out['hint_skipped']}", file=sys.stderr)
    return 0


NO_GO_EXIT = 3  # `failslow qualify`: some host is no-go (a prolog's signal)


def cmd_qualify(args: argparse.Namespace) -> int:
    """Qualify hosts: start a run, follow it until done, print go / no-go with reasons."""
    hosts = [h for part in args.hosts for h in part.split(",") if h]
    if not hosts:
        raise ClientError("qualify needs --hosts")
    c = client_of(args)
    run = c.post("/v1/fleet/qualifications", {"hosts": hosts, "timeout_s": args.timeout,
                                              "bytes": args.bytes,
                                              "iterations": args.iterations})  # fmt: skip
    deadline = time.monotonic() + args.timeout + 30
    while run["state"] != "done" and time.monotonic() < deadline:
        if args.output == "table":
            waiting = sum(h["verdict"] == "pending" for h in run["hosts"])
            print(f"\rqualification {run['id']}: {waiting} host(s) pending", end="",
                  file=sys.stderr, flush=True)  # fmt: skip
        time.sleep(1.0)
        run = c.get(f"/v1/fleet/qualifications/{run['id']}")
    if args.output == "table":
        print(file=sys.stderr)
    if args.output in ("json", "yaml"):
        emit("qualification", run, args.output)
    else:
        emit("qualify", run["hosts"], args.output)
    return NO_GO_EXIT if run["no_go"] or run["state"] != "done" else 0


def register(sub: Any, connection: Any) -> None:
    p = sub.add_parser("qualify", help="qualify hosts before work: compute and link checks by "
                       "their agents against the fleet norm; go / no-go with reasons (exit 3 "
                       "if any is no-go)")  # fmt: skip
    p.add_argument("--hosts", nargs="+", required=True, help="host names (spaces or commas)")
    p.add_argument("--timeout", type=float, default=60.0, help="wait this long for the agents")
    p.add_argument("--bytes", type=int, default=8 << 20, help="link check size (bytes)")
    p.add_argument("--iterations", type=int, default=20,
                   help="compute check length: matrix multiplies per device (8192^2 bf16 on a "
                   "GPU, ~2 ms each on an H100; 512^2 float32 on a CPU); longer finds GPUs that "
                   "slow down as they heat")  # fmt: skip
    connection(p)
    p.set_defaults(func=cmd_qualify)

    for verb, what in (
        ("drain", "take a host, GPU or NIC out of the fleet (failed) with a reason"),
        ("return", "bring a drained or repaired part back: on probation until it runs clean"),
    ):
        p = sub.add_parser(verb, help=what)
        p.add_argument("resource", choices=tuple(ONE))
        p.add_argument("name", help="host name, GPU UUID (or host/index), host/NIC")
        p.add_argument("--reason", required=True, help="why (recorded in the audit trail)")
        connection(p)
        p.set_defaults(func=cmd_part_state, verb=verb)


__all__ = ["KINDS", "ONE", "SORTS", "describe", "get", "part_text", "register"]
