"""``failslow relay``: run a relay (docs/relay.md)."""

from __future__ import annotations

import argparse
import logging

from failslow.wire.process import collect_less_often, raise_file_limit


def cmd_relay(args: argparse.Namespace) -> int:
    import uvicorn

    from failslow.relay.app import RelayApp
    from failslow.relay.batcher import RelaySettings

    try:
        settings = RelaySettings(
            upstream=args.upstream, max_bundle=args.max_bundle, max_wait_s=args.max_wait_ms / 1e3,
            max_in_flight=args.max_in_flight, max_passthrough=args.max_passthrough,
            gzip=args.gzip_upstream,
            max_bundle_bytes=args.max_bundle_bytes, timeout_s=args.timeout,
        )  # fmt: skip
    except ValueError as exc:
        raise SystemExit(f"failslow relay: {exc}") from None
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    raise_file_limit()
    collect_less_often(args.gc_young_objects)
    uvicorn.run(RelayApp(settings), host=args.host, port=args.port, log_level=args.log_level,
                access_log=False, timeout_keep_alive=75)  # fmt: skip
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "relay",
        help="gather node agents' v2 envelopes into bundles for the service",
        description="Agents send to the relay as to the service; it forwards their envelopes "
        "as POST /v2/ingest/bundle and everything else as it came.",
    )
    p.add_argument("--upstream", required=True, help="the service's URL, e.g. http://svc:8000")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8001, help="port (default 8001)")
    p.add_argument("--max-bundle", type=int, default=64, help="bodies per bundle (default 64)")
    p.add_argument(
        "--max-wait-ms", type=float, default=50.0,
        help="the longest a body waits for others before its bundle goes (default 50)",
    )  # fmt: skip
    p.add_argument(
        "--max-bundle-bytes", type=int, default=8 * 1024 * 1024,
        help="a bundle's most bytes, below the service's ingest.max_body_bytes (default 8 MiB)",
    )  # fmt: skip
    p.add_argument("--max-in-flight", type=int, default=16,
                   help="bundles awaiting the service's answer at once (default 16)")  # fmt: skip
    p.add_argument("--max-passthrough", type=int, default=64,
                   help="other requests (topology registrations, v1, reads) passed to the "
                   "service at once; more wait in the relay (default 64)")  # fmt: skip
    p.add_argument("--gc-young-objects", type=int, default=10_000,
                   help="allocations between two young collections of Python's collector "
                   "(Python's default: 700; 0 keeps it; default 10000)")  # fmt: skip
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds to wait for the service's answer to a bundle")  # fmt: skip
    p.add_argument("--gzip-upstream", action="store_true",
                   help="gzip bundles (for a slow link; costs both ends CPU)")  # fmt: skip
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    p.set_defaults(func=cmd_relay)
