"""The node agent's command of the ``failslow`` CLI (``failslow agent``). Imports are lazy."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from typing import Any


def octal_mode(text: str) -> int:
    """``--socket-mode``: permission bits in octal (660, 0666)."""
    mode = int(text, 8)
    if not 0 <= mode <= 0o777:
        raise ValueError(text)
    return mode


def start_qualify(args: argparse.Namespace, host: str) -> Any:
    """The node's qualification worker (agents/qualify.py), with ``--qualify-listen``."""
    if not args.qualify_listen:
        return None
    from failslow.agents.compute import ComputeDevice
    from failslow.agents.qualify import QualifyWorker

    return QualifyWorker(service=args.service, host=host, listen=args.qualify_listen,
                         token=args.token or os.environ.get("FAILSLOW_TOKEN"),
                         compute=ComputeDevice(args.qualify_compute)).start()  # fmt: skip


def cmd_agent(args: argparse.Namespace) -> int:
    from failslow.agents.agent import NodeAgent
    from failslow.agents.sdk import default_socket

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s agent: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per POST is noise
    if args.job is None:  # every job on the node, the job from each payload
        from failslow.agents.multicli import cmd_agents

        return cmd_agents(args)
    socket_path = args.socket
    if socket_path is None and args.input_dir is None:
        socket_path = default_socket(args.job)
    state_dir = args.state_dir or os.path.join(
        "var", "agent", f"{args.job}-{args.host or os.uname().nodename}"
    )
    inspector = None
    if args.nccl_inspector_dir:
        from failslow.agents.sources.nccl_inspector import InspectorSource, RankMap

        try:
            ranks = InspectorSource.load_rank_map(args.comm_map) if args.comm_map else RankMap()
        except (OSError, ValueError, TypeError) as exc:
            print(f"failslow agent: cannot read --comm-map: {exc}", file=sys.stderr)
            return 2
        inspector = InspectorSource(args.nccl_inspector_dir, ranks)
    agent = NodeAgent(
        service=args.service,
        job=args.job,
        host=args.host,
        socket_path=socket_path,
        input_dir=args.input_dir,
        state_dir=state_dir,
        token=args.token or os.environ.get("FAILSLOW_TOKEN"),
        flush_interval_s=args.flush_interval,
        heartbeat_s=args.heartbeat,
        fsync=not args.no_fsync,
        backoff_cap_s=args.max_backoff,
        inspector=inspector,
        archive=args.archive,
        protocol=args.protocol,
        socket_mode=args.socket_mode,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    from failslow.agents.health import serve_health

    health = serve_health(agent, args.metrics_listen)  # before the agent starts: nothing to undo
    agent.start()
    inventory = None
    if not args.no_hardware_report:
        from failslow.agents.hardware import InventoryReporter

        inventory = InventoryReporter(agent.sender, agent.host).start()
    qualify = start_qualify(args, agent.host)
    probes = None
    if args.probe_listen or args.flight_recorder_dumps or args.nccl_ras_cmd:
        from failslow.agents.probe import ProbeWorker

        try:
            probes = ProbeWorker(
                service=args.service,
                job=args.job,
                host=agent.host,
                listen=args.probe_listen,
                advertise=args.probe_advertise,
                token=args.token or os.environ.get("FAILSLOW_TOKEN"),
                poll_s=args.task_poll,
                ranks=lambda: sorted(agent.ranks),
                dump_prefix=args.flight_recorder_dumps,
                pipe_prefix=args.flight_recorder_pipe,
                ras_cmd=args.nccl_ras_cmd,
            ).start()
        except OSError as exc:
            print(f"failslow agent: cannot listen on {args.probe_listen}: {exc}", file=sys.stderr)
            agent.stop(drain_timeout_s=args.drain_timeout)
            return 2
        logging.info("service tasks: probes at %s", probes.advertise or "(not listening)")
    where = f"socket {socket_path}" if socket_path else f"spool {args.input_dir}"
    logging.info(
        "agent %s for job %s on %s: reading %s, sending to %s",
        agent.agent_id,
        args.job,
        agent.host,
        where,
        args.service,
    )
    try:
        while not stop.wait(2.0):
            agent.write_stats()
    finally:
        if probes is not None:
            probes.stop()
        if inventory is not None:
            inventory.stop()
        if qualify is not None:
            qualify.stop()
        if health is not None:
            health.stop()
        agent.stop(drain_timeout_s=args.drain_timeout)
        logging.info("agent stopped: %s", json.dumps(dataclasses.asdict(agent.stats)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from failslow.agents.compute import ComputeDevice  # (no numpy, no torch: an enum)

    p = sub.add_parser("agent", help="run a node agent")
    p.add_argument("--service", required=True, help="service URL, e.g. http://10.0.0.5:8000")
    p.add_argument(
        "--job",
        help="the one job to report for; without it, every job whose processes send to the "
        "socket (default $XDG_RUNTIME_DIR/failslow.sock), each from its own outbox",
    )
    p.add_argument("--max-jobs", type=int, default=64, help="without --job: jobs at once")
    p.add_argument("--host", help="this node's name (default: hostname)")
    p.add_argument(
        "--socket", help="Unix datagram socket to read (default $XDG_RUNTIME_DIR or /tmp)"
    )
    p.add_argument(
        "--socket-mode",
        type=octal_mode,
        default=0o660,
        help="who may send to the socket, in octal (default 660: the agent's user and group; "
        "666: any local user, e.g. training pods under other uids)",
    )
    p.add_argument("--input-dir", help="read SDK spool files from this directory instead")
    p.add_argument("--state-dir", help="outbox and state (default var/agent/<job>-<host>)")
    p.add_argument(
        "--metrics-listen",
        help="HOST:PORT for the agent's own /healthz and /metrics (default: not served)",
    )
    p.add_argument("--token", help="bearer token (or FAILSLOW_TOKEN)")
    p.add_argument("--flush-interval", type=float, default=1.0, help="seconds per envelope")
    p.add_argument(
        "--heartbeat", type=float, default=5.0, help="seconds of silence before a heartbeat"
    )
    p.add_argument(
        "--drain-timeout", type=float, default=5.0, help="seconds to deliver on shutdown"
    )
    p.add_argument(
        "--no-fsync", action="store_true", help="faster, but a power loss may lose a batch"
    )
    p.add_argument(
        "--max-backoff", type=float, default=10.0, help="longest wait between retries (s)"
    )
    p.add_argument(
        "--nccl-inspector-dir",
        help="also tail NCCL Inspector dumps here (NCCL_INSPECTOR_DUMP_DIR of the job)",
    )
    p.add_argument(
        "--comm-map",
        help='JSON {"by_name": {"DP Group 0": [global ranks...]}, "by_hash": {}, '
        '"world_size": N}: places Inspector communicators in the job',
    )
    p.add_argument(
        "--probe-listen",
        help="ADDR:PORT for active link probes (the address peers reach this node at); "
        "without it this agent runs no probes",
    )
    p.add_argument("--probe-advertise", help="ADDR:PORT peers should connect to, if different")
    p.add_argument(
        "--flight-recorder-dumps",
        help="TORCH_NCCL_DEBUG_INFO_TEMP_FILE of the job: dumps are <this><rank>",
    )
    p.add_argument(
        "--flight-recorder-pipe",
        help="TORCH_NCCL_DEBUG_INFO_PIPE_FILE of the job: on a hang, ask for dumps through "
        "<this><rank>.pipe",
    )
    p.add_argument(
        "--nccl-ras-cmd", help='on a hang, run this for NCCL RAS (e.g. "ncclras -f json")'
    )
    p.add_argument(
        "--task-poll", type=float, default=5.0, help="seconds between polls for service tasks"
    )
    p.add_argument(
        "--archive", help="append every delivered envelope to this JSONL file (for replay)"
    )
    p.add_argument(
        "--protocol",
        choices=["v2", "v1"],
        default="v2",
        help="v2: binary columns, the topology registered once (default); v1: JSON envelopes",
    )
    p.add_argument(
        "--qualify-listen",
        help="ADDR:PORT for qualification link checks (`failslow qualify`); without it this "
        "node answers no qualification",
    )
    p.add_argument(
        "--qualify-compute",
        choices=[d.value for d in ComputeDevice],
        default=ComputeDevice.AUTO.value,
        help="where the qualification compute check runs: auto (default) on the GPUs where "
        "PyTorch sees CUDA devices, else on the CPU",
    )
    p.add_argument(
        "--no-hardware-report",
        action="store_true",
        help="do not report this node's GPUs and NICs to the fleet ledger (default: at start "
        "and hourly)",
    )
    p.add_argument("--log-level", default="info")
    p.set_defaults(func=cmd_agent)

    from failslow.agents.launch import register as register_launch

    register_launch(sub)
