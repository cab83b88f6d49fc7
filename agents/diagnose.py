"""Hang evidence on the node: PyTorch Flight Recorder dumps (on demand) and NCCL RAS.

``collect(ranks, ...)`` is what an agent runs when the service asks about an open hang:

* Flight Recorder: for each local rank, write to its ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` pipe
  (``<pipe_prefix><rank>.pipe``), which makes PyTorch's NCCL watchdog dump the rank's trace to
  ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`` (``<dump_prefix><rank>``); wait for the fresh dumps
  (or take dumps already written by a watchdog timeout since ``since_ns``) and read each rank's
  last enqueued/started/completed collective per process group (restricted unpickler: a dump
  never runs code).
* NCCL RAS: run ``ras_cmd`` (for example ``ncclras -f json``), parse its JSON or text status, and
  keep the ranks it calls dead, unresponsive, missing or lagging.

Everything that goes wrong is reported as an error string, never raised.
"""

from __future__ import annotations

import errno
import os
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from failslow.agents.sources import flight_recorder as fr
from failslow.agents.sources import nccl_ras as ras


def trigger(pipe_prefix: str, rank: int) -> bool:
    """Ask rank ``rank``'s watchdog for a dump; False when nobody reads its pipe."""
    path = f"{pipe_prefix}{rank}.pipe"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.ENOENT):  # no reader / no pipe
            return False
        raise
    try:
        os.write(fd, b"1\n")
    finally:
        os.close(fd)
    return True


def collect(
    ranks: list[int],
    *,
    dump_prefix: str | None = None,
    pipe_prefix: str | None = None,
    ras_cmd: str | None = None,
    since_ns: int = 0,
    wait_s: float = 10.0,
) -> dict[str, Any]:
    """The body of ``POST .../incidents/{id}/hang-evidence`` (without ``host``)."""
    out: dict[str, Any] = {"flight_recorder": {}, "groups": {}, "nccl_ras": {}, "errors": []}
    if dump_prefix:
        triggered_ns = time.time_ns()
        asked = []
        if pipe_prefix:
            for r in ranks:
                try:
                    if trigger(pipe_prefix, r):
                        asked.append(r)
                except OSError as exc:
                    out["errors"].append(f"rank {r}: pipe: {exc}")
        deadline = time.monotonic() + wait_s
        for r in ranks:
            path = Path(f"{dump_prefix}{r}")
            fresh_after = triggered_ns if r in asked else since_ns
            while r in asked and time.monotonic() < deadline and not _newer(path, fresh_after):
                time.sleep(0.05)
            if not _newer(path, since_ns):
                out["errors"].append(f"rank {r}: no dump at {path}")
                continue
            try:
                dump = _load_settled(path, r)
            except fr.DumpError as exc:
                out["errors"].append(f"rank {r}: {exc}")
                continue
            out["flight_recorder"][r] = summarise(dump)
            for g, (desc, members) in dump.groups.items():
                out["groups"].setdefault(g, {"desc": desc, "ranks": list(members)})
    if ras_cmd:
        try:
            p = subprocess.run(
                shlex.split(ras_cmd), capture_output=True, timeout=wait_s, check=False
            )
            if p.returncode != 0:
                raise OSError(f"exit {p.returncode}: {p.stderr.decode(errors='replace')[:200]}")
            out["nccl_ras"] = _ras_suspects(p.stdout)
        except (OSError, subprocess.TimeoutExpired, ras.RasError) as exc:
            out["errors"].append(f"nccl ras: {exc}")
    return out


def summarise(dump: fr.Dump) -> dict[str, dict[str, int]]:
    """Per process group: the rank's newest collective in its trace (``last_seq``, when it was
    enqueued: ``last_created_ns``) and the watchdog's last enqueued/started/completed."""
    out: dict[str, dict[str, int]] = {}
    for e in dump.entries:
        if e.is_p2p:
            continue
        cur = out.get(e.group)
        if cur is None or e.seq > cur["last_seq"]:
            out[e.group] = {"last_seq": e.seq, "last_created_ns": e.created_ns}
    for g, st in dump.status.items():
        out.setdefault(g, {}).update(
            last_enqueued=st.last_enqueued,
            last_started=st.last_started,
            last_completed=st.last_completed,
        )
    return out


def _newer(path: Path, since_ns: int) -> bool:
    try:
        return path.stat().st_mtime_ns >= since_ns
    except OSError:
        return False


def _load_settled(path: Path, rank: int) -> fr.Dump:
    """Load a dump, retrying briefly while it may still be being written."""
    for attempt in range(5):
        try:
            return fr.load(path, rank=rank)
        except fr.DumpError:
            if attempt == 4:
                raise
            time.sleep(0.1)
    raise AssertionError("unreachable")


def _ras_suspects(data: bytes) -> dict[int, str]:
    text = data.decode(errors="replace")
    if text.lstrip().startswith("{"):
        return ras.parse_status(text).suspects()
    out: dict[int, str] = {}
    for f in ras.parse_text(text):
        for r in f.missing_ranks:
            out.setdefault(r, f.kind.lower())
    return out
