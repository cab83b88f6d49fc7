"""``failslow bench e2e``: a large job's v2 telemetry, at real-time pace, through real HTTP into a
service, and how far behind detection stays.

Simulated node agents (one per host of 8 ranks) register their topology once, then each sends
one envelope per step shortly after the step ends (spread over the first half of the next step,
as agents' flush timers are), built from a per-host template (harness/load/job.py). The service
is started here (``--service`` to use another one, e.g. a replica set behind a load balancer). A
poller reads the newest analysed step to time each frame's detection; with ``--fault slow_gpu``
one GPU becomes 1.5x slower at its tensor-parallel all-reduces from step K/2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import json
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from failslow.harness.load.client import Connection, HttpError
from failslow.harness.load.fleet import Fleet
from failslow.harness.load.job import HostTemplate, JobLayout, host_name, ranks_argument
from failslow.wire import topology, v2

JOB = "e2e"


@dataclass
class Run:
    args: argparse.Namespace
    job: JobLayout
    hosts: list[HostTemplate]
    url: str  # the first service: the poller reads it
    urls: list[str] = field(default_factory=list)  # where connections go, spread over them:
    # every service, or the relays in front of it
    services: int = 1
    t0_ns: int = 0
    records: int = 0
    envelopes: int = 0
    behind_s: float = 0.0  # the most an envelope went out after its time (the generator's lag)
    errors: list[str] = field(default_factory=list)
    polls: list[tuple[float, int | None]] = field(default_factory=list)  # (wall s, step)
    incidents: list[dict[str, Any]] = field(default_factory=list)


async def _wait_ready(url: str, timeout_s: float = 60.0) -> None:
    conn = Connection(url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status, _ = await conn.request("GET", "/readyz")
            if status == 200:
                await conn.close()
                return
        except (OSError, HttpError):
            await conn.close()
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the service at {url} is not ready after {timeout_s:.0f} s")


async def _register(run: Run, conns: list[Connection]) -> None:
    async def worker(i: int) -> None:
        for h in range(i, len(run.hosts), len(conns)):
            body = orjson.dumps({"sent_ns": time.time_ns(), **run.hosts[h].registration})
            path = f"/v2/jobs/{JOB}/topology/{host_name(h)}"
            json_type = {"Content-Type": "application/json"}
            for _ in range(10):  # 429 / 503 (shedding, a relay's queue): again, as agents do
                status, answer = await conns[i].request("PUT", path, body, json_type)
                if status not in (429, 503):
                    break
                await asyncio.sleep(1.0)
            if status != 200:
                raise RuntimeError(f"registering {host_name(h)}: {status} {answer[:300]!r}")

    await asyncio.gather(*(worker(i) for i in range(len(conns))))


def _header(run: Run, h: int, step: int, digest: str, sealed_ns: int) -> dict[str, Any]:
    # sent_ns is when the batch was sealed, as a real agent stamps it (agents/agent.py seal):
    # an envelope waiting in a backlog does not claim a later "now" than its records. Stamping it
    # at send time made the job's event time run ahead of its data whenever the service fell
    # behind, closing frames before their records came and showing collectives as blocked.
    return {"job": JOB, "host": host_name(h), "sent_ns": sealed_ns,
            "agent": f"{host_name(h)}-e2e", "batch_seq": step, "topology": digest}  # fmt: skip


def _units(hosts: int, bundle: int) -> list[list[int]]:
    """The hosts whose envelopes go out in one request: one each, or ``bundle`` consecutive
    hosts per ``POST /v2/ingest/bundle`` (as a relay in front of them would send them)."""
    size = max(1, bundle)
    return [list(range(lo, min(lo + size, hosts))) for lo in range(0, hosts, size)]


async def _send(
    run: Run, conns: list[Connection], digests: list[str], units: list[list[int]]
) -> None:
    """Every host's envelope of each step at its time (a bundle: when its last host's is due).
    Bodies are encoded (and gzipped) while the step before runs, in slices that leave the
    senders their turn: what the generator does at a step's end is only writing what was
    ready, as agents whose batches are sealed do."""
    S = run.job.step_ns / 1e9
    spread = min(0.5 * S, 0.5)
    n = len(run.hosts)
    bundled = run.args.bundle > 1
    path = "/v2/ingest/bundle" if bundled else "/v2/ingest"
    headers = {"Content-Type": v2.BUNDLE_MEDIA_TYPE if bundled else v2.MEDIA_TYPE}
    if run.args.gzip:
        headers["Content-Encoding"] = "gzip"
    bodies: dict[int, list[bytes]] = {}
    ready = [asyncio.Event() for _ in range(run.args.steps)]
    sending = [len(conns)] * run.args.steps  # workers still sending each step's bodies

    def due(step: int, h: int) -> float:
        return run.t0_ns / 1e9 + (step + 1) * S + spread * h / n

    async def encoder() -> None:
        for step in range(run.args.steps):
            start = run.t0_ns / 1e9 + step * S  # the step's records exist from its start on
            if start > time.time():
                await asyncio.sleep(start - time.time())
            out, encoded = [], 0
            for unit in units:
                raw = [run.hosts[h].body(step, run.t0_ns, _header(run, h, step, digests[h],
                                                                  int(due(step, h) * 1e9)))
                       for h in unit]  # fmt: skip
                body = v2.encode_bundle(raw) if bundled else raw[0]
                out.append(gzip.compress(body, compresslevel=1) if run.args.gzip else body)
                encoded += len(unit)
                if encoded >= 32:  # the senders' turn about every 32 hosts, bundled or not
                    encoded = 0
                    await asyncio.sleep(0)
            bodies[step] = out
            ready[step].set()

    def count(unit: list[int], step: int, status: int, answer: bytes) -> None:
        if status != 200:
            run.errors.append(f"{host_name(unit[0])} step {step}: {status} {answer[:200]!r}")
            return
        items = orjson.loads(answer)["items"] if bundled else [{}]
        for h, item in zip(unit, items, strict=True):
            if "status" in item:
                run.errors.append(f"{host_name(h)} step {step}: {item['status']} "
                                  f"{item.get('detail', '')[:200]}")  # fmt: skip
                continue
            run.envelopes += 1
            run.records += run.hosts[h].records

    async def worker(i: int) -> None:
        mine = list(range(i, len(units), len(conns)))
        for step in range(run.args.steps):
            await ready[step].wait()
            for u in mine:
                delay = due(step, units[u][-1]) - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    run.behind_s = max(run.behind_s, -delay)
                status, answer = await conns[i].request("POST", path, bodies[step][u], headers)
                count(units[u], step, status, answer)
            sending[step] -= 1
            if not sending[step]:
                del bodies[step]

    await asyncio.gather(encoder(), *(worker(i) for i in range(len(conns))))


async def _poll(run: Run, stop: asyncio.Event) -> None:
    conn = Connection(run.url, run.args.token)
    while not stop.is_set():
        with contextlib.suppress(OSError, HttpError, ValueError):
            status, body = await conn.request("GET", "/v1/jobs")  # what a dashboard polls
            if status == 200:
                mine = [j for j in orjson.loads(body) if j.get("job") == JOB]
                run.polls.append((time.time(), mine[0].get("step") if mine else None))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), min(0.25, run.job.step_ns / 4e9))
    status, body = await conn.request("GET", f"/v1/jobs/{JOB}/incidents")
    run.incidents = orjson.loads(body) if status == 200 else []
    await conn.close()


def _file_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def _span(items: list[Any]) -> str:
    """A short form of a long list: its size, first and last."""
    if len(items) <= 4:
        return str(items)
    return f"[{items[0]}, {items[1]}, ... {items[-1]}] ({len(items)})"


def _lags(run: Run) -> list[float]:
    """Per frame: event-time steps from its end to the first poll that saw it analysed."""
    S = run.job.step_ns / 1e9
    seen: dict[int, float] = {}
    for wall, step in run.polls:
        if step is not None:
            for k in range(max(seen, default=-1) + 1, step + 1):
                seen[k] = wall
    warm = 3
    return [max(0.0, (w - (run.t0_ns / 1e9 + (k + 1) * S)) / S)
            for k, w in seen.items() if k >= warm]  # fmt: skip


async def _main(run: Run, fleet: Fleet | None) -> dict[str, Any]:
    for url in run.urls:
        await _wait_ready(url)
    if fleet is not None:
        await asyncio.to_thread(fleet.wait_owned)
    units = _units(len(run.hosts), run.args.bundle)
    n = len(units) if run.args.connections <= 0 else min(run.args.connections, len(units))
    limit = _file_limit()
    if n + 64 > limit:
        raise SystemExit(f"{n} connections need more open files than this process may have "
                         f"({limit}): raise `ulimit -n` or pass --connections")  # fmt: skip
    conns = [await Connection(run.urls[i % len(run.urls)], run.args.token).open()
             for i in range(n)]  # fmt: skip
    print(f"registering {len(run.hosts)} hosts ...", file=sys.stderr, flush=True)
    t = time.monotonic()
    await _register(run, conns)
    print(f"registered in {time.monotonic() - t:.1f} s", file=sys.stderr, flush=True)
    digests = [topology.digest(h.registration["ranks"], h.registration["comms"]) for h in run.hosts]
    cpu0 = fleet.cpu_s() if fleet is not None else None
    relay0 = fleet.relay_cpu_s() if fleet is not None else 0.0
    own0 = time.process_time()
    run.t0_ns = time.time_ns() + 1_000_000_000
    stop = asyncio.Event()
    poller = asyncio.create_task(_poll(run, stop))
    started = time.monotonic()
    await _send(run, conns, digests, units)
    sending_s = time.monotonic() - started
    await asyncio.sleep(2.5 * run.job.step_ns / 1e9 + 1.0)  # the last frames close
    cpu_by = None
    if fleet is not None and cpu0 is not None:
        cpu_by = {k: round(v - cpu0.get(k, 0.0), 2) for k, v in fleet.cpu_s().items()}
    cpu = sum(cpu_by.values()) if cpu_by is not None else None
    relay_cpu = fleet.relay_cpu_s() - relay0 if fleet is not None else 0.0
    relays = fleet.relay_status() if fleet is not None and fleet.relays else []
    own = time.process_time() - own0
    stop.set()
    await poller
    for c in conns:
        await c.close()
    lags = _lags(run)
    out: dict[str, Any] = {
        "replicas": run.services,
        "bundle": run.args.bundle,
        "ranks": run.job.ranks,
        "hosts": len(run.hosts),
        "step_time_s": run.job.step_ns / 1e9,
        "steps": run.args.steps,
        "records": run.records,
        "envelopes": run.envelopes,
        "seconds": round(sending_s, 2),
        "records_per_s": round(run.records / sending_s),
        "records_per_s_needed": round(sum(h.records for h in run.hosts) / (run.job.step_ns / 1e9)),
        "behind_s_max": round(run.behind_s, 2),
        "lag_steps_p50": round(statistics.median(lags), 2) if lags else None,
        "lag_steps_max": round(max(lags), 2) if lags else None,
        "frames_timed": len(lags),
        "client_cpu_s": round(own, 2),  # this generator's own CPU (it shares the machine)
        "errors": len(run.errors),
        "first_errors": run.errors[:5],
    }
    if cpu is not None:
        out["service_cpu_s"] = round(cpu, 2)
        out["service_cpu_us_per_record"] = round(cpu / max(run.records, 1) * 1e6, 3)
        if cpu_by is not None and len(cpu_by) > 1:
            out["service_cpu_s_by_process"] = cpu_by
        out["rss_mib"] = round(fleet.rss_mib(), 1)  # type: ignore[union-attr]
        out["rss_kib_per_rank"] = round(out["rss_mib"] * 1024 / run.job.ranks, 2)
    if relays:  # the agents' requests went through relays: their CPU is not the service's
        bundles = sum(r["bundles"] for r in relays)
        out["relays"] = len(relays)
        out["relay_cpu_s"] = round(relay_cpu, 2)
        out["relay_cpu_us_per_record"] = round(relay_cpu / max(run.records, 1) * 1e6, 3)
        out["relay_bodies_per_bundle"] = round(run.envelopes / max(bundles, 1), 1)
    if run.job.slow is not None:
        hits = [i for i in run.incidents
                if i["kind"] == "slow_gpu" and i["ranks"] == [run.job.slow]]  # fmt: skip
        out["found"] = bool(hits)
        out["delay_steps"] = (
            hits[0]["detected_step"] - run.job.fault_step
            if hits and hits[0]["detected_step"] is not None
            else None
        )
    out["other_incidents"] = [
        f"{i['kind']} ranks {_span(i['ranks'])} hosts {_span(i['hosts'])}" for i in run.incidents
        if not (i["kind"] == "slow_gpu" and i["ranks"] == [run.job.slow])
    ]  # fmt: skip
    return out


def main(args: argparse.Namespace) -> int:
    slow = args.ranks // 3 if args.fault == "slow_gpu" else None
    job = JobLayout(args.ranks, int(args.step_time * 1e9), slow=slow,
                    fault_step=args.steps // 2 if slow is not None else None,
                    late_ns=int(args.step_time * 1e9 * 0.025))  # fmt: skip
    print(f"building {job.hosts} host templates ...", file=sys.stderr, flush=True)
    hosts = [HostTemplate(job, h) for h in range(job.hosts)]
    if args.relays and (args.service or args.bundle > 1):
        raise SystemExit("--relays needs a service started here (no --service) and no "
                         "--bundle: the relays make the bundles")  # fmt: skip
    if args.shards and args.service:
        raise SystemExit("--shards sets up the service started here: with --service, set "
                         "FAILSLOW_STATE__SHARDS on that service instead")  # fmt: skip
    fleet = None
    with tempfile.TemporaryDirectory(prefix="failslow-e2e-") as tmp, \
            open(Path(tmp) / "service.log", "wb") as log:  # fmt: skip
        try:
            if args.service:
                urls = [u.strip().rstrip("/") for u in args.service.split(",") if u.strip()]
                senders = urls
            else:
                fleet = Fleet(Path(tmp), log, replicas=args.replicas, shards=args.shards)
                urls = senders = fleet.start()
                if args.relays:
                    fleet.wait_ready(urls[0])
                    senders = fleet.start_relays(args.relays, args.relay_bundle,
                                                 args.relay_wait_ms)  # fmt: skip
            run = Run(args, job, hosts, urls[0], senders, services=len(urls))
            out = asyncio.run(_main(run, fleet))
        except Exception:
            if fleet is not None:  # what the service said is the first thing to read
                tail = (Path(tmp) / "service.log").read_bytes()[-4000:].decode(errors="replace")
                print(f"--- service log (last 4 KB) ---\n{tail}", file=sys.stderr)
            raise
        finally:
            if fleet is not None:
                fleet.stop()
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if not out["errors"] and out.get("found", True) else 1


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "e2e", help="a large job's v2 telemetry in real time through HTTP; detection lag"
    )
    p.add_argument("--ranks", type=ranks_argument, default=1024, help="a multiple of 32")
    p.add_argument("--step-time", type=float, default=1.0, help="seconds per training step")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--fault", choices=["slow_gpu"], help="a GPU 1.5x slower from step K/2")
    p.add_argument(
        "--service",
        help="use this service instead of starting one (several: comma-separated URLs, the "
        "connections spread over them, as replicas behind a load balancer)",
    )
    p.add_argument(
        "--replicas", type=int, default=1,
        help="start this many services sharing the job through a NATS JetStream server "
        "(docs/replicas.md; needs nats-server); 1: one embedded service, no bus",
    )  # fmt: skip
    p.add_argument("--token", help="bearer token for --service (ingest and read)")
    p.add_argument(
        "--connections", type=int, default=0,
        help="HTTP connections, each waiting for its answer as an agent does (default 0: one "
        "per host, as node agents have; the service and this generator each need that many "
        "file descriptors)",
    )  # fmt: skip
    p.add_argument(
        "--bundle", type=int, default=1,
        help="send this many consecutive hosts' envelopes in one POST /v2/ingest/bundle, as a "
        "relay in front of them would (one connection per bundle); 1: one request per host",
    )  # fmt: skip
    p.add_argument(
        "--relays", type=int, default=0,
        help="start this many `failslow relay` processes in front of the service and send "
        "every host's envelopes through them (hosts spread over them), as agents behind "
        "per-rack relays do; their CPU is reported apart (relay_cpu_s)",
    )  # fmt: skip
    p.add_argument("--relay-bundle", type=int, default=64, help="the relays' --max-bundle")
    p.add_argument("--relay-wait-ms", type=float, default=50.0,
                   help="the relays' --max-wait-ms")  # fmt: skip
    p.add_argument(
        "--shards", type=int, default=0,
        help="the service it starts splits the job's join and frames over this many shard "
        "processes (FAILSLOW_STATE__SHARDS); their CPU counts as the service's, and is shown "
        "by process",
    )  # fmt: skip
    p.add_argument("--no-gzip", dest="gzip", action="store_false", help="send bodies raw")
    p.add_argument("--json", help="write the result here")
    p.set_defaults(func=main)
