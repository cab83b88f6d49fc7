"""``failslow run`` and ``failslow doctor``: the training side's own commands.

``failslow run [--job J] [--socket S | --spool DIR] -- COMMAND ...`` runs COMMAND (``torchrun
...``, ``python train.py``, a shell script) with every Python process it starts instrumented,
no edit to the script (:mod:`failslow.agents.autoload`): it sets ``FAILSLOW_TORCH=1``, the job
and the socket in the environment and puts failslow's bootstrap first on ``PYTHONPATH``, then
replaces itself with COMMAND (its exit status is COMMAND's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys


def run_environment(
    env: dict[str, str], job: str | None, socket: str | None, spool: str | None
) -> dict[str, str]:
    """``env`` with what instruments the processes started under it."""
    from failslow.agents.autoload import ENV_ENABLE, bootstrap_dir

    out = dict(env)
    out[ENV_ENABLE] = "1"
    if job:
        out["FAILSLOW_JOB"] = job
    if socket:
        out["FAILSLOW_SOCKET"] = socket
    if spool:
        out["FAILSLOW_SPOOL_DIR"] = spool
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    boot = bootstrap_dir()
    out["PYTHONPATH"] = os.pathsep.join([boot, *[p for p in paths if p != boot]])
    return out


def cmd_run(args: argparse.Namespace) -> int:
    from failslow.agents.doctor import Verdict, _agent_socket

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        print("failslow run: no command given (failslow run -- torchrun ...)", file=sys.stderr)
        return 2
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        print(f"failslow run: command not found: {command[0]}", file=sys.stderr)
        return 127
    env = run_environment(dict(os.environ), args.job, args.socket, args.spool)
    job = env.get("FAILSLOW_JOB", "default")
    os.environ.update(
        {k: env[k] for k in ("FAILSLOW_JOB", "FAILSLOW_SOCKET", "FAILSLOW_SPOOL_DIR") if k in env}
    )
    agent = _agent_socket()
    if not args.quiet:
        print(f"failslow run: job {job}: {agent.detail}", file=sys.stderr)
        if agent.verdict != Verdict.OK:
            print(
                "failslow run: the job runs anyway; its records wait for an agent", file=sys.stderr
            )
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"failslow run: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 126
    return 0  # pragma: no cover - execvpe does not return


def cmd_doctor(args: argparse.Namespace) -> int:
    from failslow.agents.doctor import Verdict, report

    out = report()
    if args.output == "json":
        print(json.dumps(out, indent=2))
    else:
        width = max(len(c["name"]) for c in out["checks"])
        for c in out["checks"]:
            print(f"{c['verdict']:<5} {c['name']:<{width}}  {c['detail']}")
        print(f"\nverdict: {out['verdict']}")
    return 1 if out["verdict"] == Verdict.FAIL else 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "run",
        help="run a training command with every rank instrumented, no code change",
        description="Run COMMAND with failslow's PyTorch instrumentation in every Python "
        "process it starts: failslow run --job J -- torchrun --nproc-per-node 8 train.py",
    )
    p.add_argument("--job", help="job id (default $FAILSLOW_JOB, else 'default')")
    p.add_argument("--socket", help="node agent socket (default: the agent's for the job)")
    p.add_argument("--spool", help="write records as files to this folder instead")
    p.add_argument("--quiet", action="store_true", help="no line about the agent on stderr")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS ...]")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("doctor", help="what a training process here can and cannot show failslow")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.set_defaults(func=cmd_doctor)
