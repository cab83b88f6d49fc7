"""The ``failslow`` command line: serve, db, token, eval, agent, relay, simulate, replay, demo,
lab.

The composition root of the commands: it sits above the service, the agents and the harness and
imports each lazily, inside the commands that need it, so that none of them depends on another
through the CLI (and ``failslow agent`` never loads the service).
"""

from __future__ import annotations

import argparse
import logging
import secrets
import sys
from collections.abc import Sequence
from typing import NoReturn

from failslow.wire.process import (  # noqa: F401 - part of the command's interface
    MMAP_THRESHOLD,
    collect_less_often,
    keep_freed_memory,
    raise_file_limit,
)


def _settings(args: argparse.Namespace) -> object:
    from failslow.service.settings import SettingsError, from_environment

    overrides: dict[str, object] = {}
    for name in ("host", "port", "database_url", "log_level"):
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    if getattr(args, "insecure", False):
        overrides["insecure"] = True
    try:
        return from_environment(**overrides)
    except SettingsError as exc:
        lines = str(exc).splitlines()
        raise SystemExit(
            "failslow: cannot start with these settings:\n"
            + "\n".join(f"  {line}" for line in lines)
            + "\n(docs/operations.md lists every setting; `failslow serve --help` the flags)"
        ) from None


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from failslow.service.app import create_app

    settings = _settings(args)
    logging.basicConfig(
        level=settings.log_level.upper(),  # type: ignore[attr-defined]
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    raise_file_limit()
    keep = settings.allocator_keep_mib  # type: ignore[attr-defined]
    if keep_freed_memory(keep):
        logging.getLogger("failslow").info(
            "allocator: up to %d MiB of freed memory kept for reuse (FAILSLOW_ALLOCATOR_KEEP_MIB)",
            keep,
        )
    young = settings.gc_young_objects  # type: ignore[attr-defined]
    if collect_less_often(young):
        logging.getLogger("failslow").info(
            "garbage collector: young collections every %d allocations (FAILSLOW_GC_YOUNG_OBJECTS)",
            young,
        )
    app = create_app(settings)  # type: ignore[arg-type]
    uvicorn.run(
        app,
        host=settings.host,  # type: ignore[attr-defined]
        port=settings.port,  # type: ignore[attr-defined]
        log_level=settings.log_level,  # type: ignore[attr-defined]
        access_log=args.access_log,
        timeout_keep_alive=settings.keep_alive_s,  # type: ignore[attr-defined]
    )
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    from failslow.service.db import current_revision, downgrade, head_revision, make_engine, upgrade

    settings = _settings(args)
    engine = make_engine(settings.database_url)  # type: ignore[attr-defined]
    try:
        if args.action == "upgrade":
            upgrade(engine, args.revision or "head")
        elif args.action == "downgrade":
            downgrade(engine, args.revision or "base")
        print(f"database at {current_revision(engine)} (code head {head_revision()})")
    finally:
        engine.dispose()
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from failslow.service.settings import hash_token

    token = args.token or secrets.token_urlsafe(32)
    print(f"token: {token}")
    print(f"hash:  {hash_token(token)}")
    print("Give the token to clients; put the hash in FAILSLOW_AUTH__<ROLE>_TOKENS.")
    return 0


def cmd_eval(argv: list[str]) -> int:
    """Run bench/eval from the source checkout (it needs ../shared/datasets as well)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "bench" / "eval" / "runner.py").exists():
        raise SystemExit(
            "failslow eval needs a source checkout (bench/eval) next to ../shared/datasets"
        )
    sys.path.insert(0, str(root))
    from bench.eval.runner import main as eval_main

    return eval_main(argv)


class Parser(argparse.ArgumentParser):
    """Bad arguments end in one line that says what to do (status 2), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("failslow")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> Parser:
    parser = Parser(prog="failslow", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"failslow {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    p = sub.add_parser("serve", help="run the service")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument("--database-url", help="SQLAlchemy URL (default sqlite:///./var/failslow.db)")
    p.add_argument("--log-level", help="debug, info, warning, error")
    p.add_argument("--insecure", action="store_true", help="allow a public bind without tokens")
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("db", help="apply or revert database migrations")
    p.add_argument("action", choices=["upgrade", "downgrade", "current"])
    p.add_argument("--revision", help="target revision (default head / base)")
    p.add_argument("--database-url")
    p.set_defaults(func=cmd_db)

    p = sub.add_parser("token", help="make a bearer token and the hash to configure")
    p.add_argument("--token", help="hash this token instead of generating one")
    p.set_defaults(func=cmd_token)

    p = sub.add_parser(
        "eval", help="evaluation harness: scenarios, baselines, real traces, TCPD", add_help=False
    )
    p.set_defaults(func=None, eval=True)

    from failslow.agents.cli import register as register_agent_commands  # noqa: PLC0415
    from failslow.cli.ops import register as register_operator_commands  # noqa: PLC0415
    from failslow.harness.cli import register as register_harness_commands  # noqa: PLC0415
    from failslow.relay.cli import register as register_relay_command  # noqa: PLC0415

    register_operator_commands(sub)
    register_agent_commands(sub)
    register_relay_command(sub)
    register_harness_commands(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:
        return cmd_eval(argv[1:])
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (ValueError, FileNotFoundError, PermissionError) as exc:
        # a value the command cannot use (a fault spec, a layout, a file): one line, no trace
        print(f"failslow {args.command}: {exc}", file=sys.stderr)
        return 2
