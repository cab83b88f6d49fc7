"""``failslow demo``: a real service, real agents (one per host), and a simulated 64-rank job
streamed in real time, with a slow GPU and later a slow NIC injected. Ctrl-C stops everything.

The service and the agents run as separate processes, exactly as in production; this process
plays the training job: it runs the simulator against the wall clock and hands each host's
records to that host's agent through the SDK.
"""

from __future__ import annotations

import argparse
import os
import time

from failslow.harness.demo.play import Demo

__all__ = ["Demo", "register", "run"]


def run(args: argparse.Namespace) -> int:
    demo = Demo(args)
    interrupted = False
    try:
        demo.start()
        demo.play()
        code = demo.report()
        if args.linger:
            demo.term.line(f"\nThe service stays up for {args.linger:.0f} s (Ctrl-C to stop now).")
            time.sleep(args.linger)
        return code
    except KeyboardInterrupt:
        interrupted = True
        demo.term.line("\ninterrupted: stopping the agents and the service...")
        return 130
    finally:
        demo.stop()
        if interrupted:
            demo.term.line("stopped cleanly.")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "demo", help="service + agents + a simulated 64-rank job with injected faults, live"
    )
    p.add_argument("--port", type=int, default=int(os.environ.get("FAILSLOW_DEMO_PORT", "8000")))
    p.add_argument(
        "--workdir", default="var/demo", help="where the demo keeps its database and logs"
    )
    p.add_argument("--fast", action="store_true", help="a 50-second story instead of 100")
    p.add_argument("--seconds", type=float, default=0, help="stop the story after this long")
    p.add_argument(
        "--linger", type=float, default=0, help="keep the service up this long afterwards"
    )
    p.set_defaults(func=run)
