"""``failslow agent`` without ``--job``: one agent process for every job on the node
(:mod:`failslow.agents.multi`), as a Kubernetes DaemonSet or a node's systemd unit runs it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def default_shared_socket() -> str:
    """The socket every job's training processes send to (FAILSLOW_SOCKET in their
    environment)."""
    return os.path.join(os.environ.get("XDG_RUNTIME_DIR") or "/tmp", "failslow.sock")


def cmd_agents(args: argparse.Namespace) -> int:
    from failslow.agents.agent import NodeAgent
    from failslow.agents.multi import JobAgents

    for flag, value in (("--input-dir", args.input_dir), ("--nccl-inspector-dir",
                        args.nccl_inspector_dir), ("--archive", args.archive)):  # fmt: skip
        if value:
            print(f"failslow agent: {flag} needs --job (one job's files)", file=sys.stderr)
            return 2
    host = args.host or os.uname().nodename
    token = args.token or os.environ.get("FAILSLOW_TOKEN")
    socket_path = args.socket or default_shared_socket()
    state_root = Path(args.state_dir or os.path.join("var", "agent", f"all-{host}"))

    def make_agent(job: str, state_dir: Path) -> NodeAgent:
        return NodeAgent(
            service=args.service, job=job, host=host, socket_path=None, input_dir=None,
            state_dir=str(state_dir), token=token, flush_interval_s=args.flush_interval,
            heartbeat_s=args.heartbeat, fsync=not args.no_fsync, backoff_cap_s=args.max_backoff,
            protocol=args.protocol,
        )  # fmt: skip

    echo = None
    make_probes = None
    if args.probe_listen or args.flight_recorder_dumps or args.nccl_ras_cmd:
        from failslow.agents.probe import EchoServer, ProbeWorker

        try:
            echo = EchoServer(args.probe_listen) if args.probe_listen else None
        except OSError as exc:
            print(f"failslow agent: cannot listen on {args.probe_listen}: {exc}", file=sys.stderr)
            return 2
        if echo is not None:
            echo.start()
        advertise = args.probe_advertise or (echo.addr if echo is not None else None)

        def make_probes(job: str, agent: NodeAgent) -> Any:
            return ProbeWorker(
                service=args.service, job=job, host=host, listen=None, advertise=advertise,
                token=token, poll_s=args.task_poll, ranks=lambda: sorted(agent.ranks),
                dump_prefix=args.flight_recorder_dumps, pipe_prefix=args.flight_recorder_pipe,
                ras_cmd=args.nccl_ras_cmd,
            ).start()  # fmt: skip

    agents = JobAgents(socket_path=socket_path, state_root=state_root, make_agent=make_agent,
                       make_probes=make_probes, max_jobs=args.max_jobs,
                       socket_mode=args.socket_mode)  # fmt: skip
    from failslow.agents.health import serve_health

    health = serve_health(agents, args.metrics_listen)  # before the agents start
    agents.start()
    inventory = None
    if not args.no_hardware_report:  # the node's hardware, once for all its jobs
        from failslow.agents.hardware import InventoryReporter
        from failslow.agents.transport import Sender

        sender = Sender(args.service, token=args.token or os.environ.get("FAILSLOW_TOKEN"))
        inventory = InventoryReporter(sender, host).start()
    from failslow.agents.cli import start_qualify

    qualify = start_qualify(args, host)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    logging.info("agent for every job on %s: reading %s, sending to %s", host, socket_path,
                 args.service)  # fmt: skip
    try:
        while not stop.wait(2.0):
            agents.write_stats()
    finally:
        if health is not None:
            health.stop()
        if inventory is not None:
            inventory.stop()
            inventory.sender.close()
        if qualify is not None:
            qualify.stop()
        agents.stop(drain_timeout_s=args.drain_timeout)
        if echo is not None:
            echo.close()
        logging.info("agents stopped: %s", json.dumps(agents.health()[1], default=str))
    return 0
