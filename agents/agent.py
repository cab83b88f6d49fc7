"""The node agent: receives records from local training processes and ships them to the service.

Input: a Unix datagram socket (default) or a spool directory of files written by the SDK.
Output: envelopes, one per ``flush_interval_s`` (or sooner when a batch is full), gzip, each with
this agent's stream id and an increasing ``batch_seq``: v2 binary columns by default (the host's
topology registered once and named by digest, see :mod:`failslow.agents.columnar`), v1 JSON with
``protocol="v1"``. Sealed envelopes are written to a
durable outbox before delivery and deleted only after the service answered 200, so a service
outage or restart loses nothing, and a re-send after a lost answer is recognised by the service
as a duplicate. Input files from the SDK spool are deleted only once their records are sealed.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from failslow.agents import wire
from failslow.agents.columnar import V2Sealer
from failslow.agents.datagrams import bind_socket, receive
from failslow.agents.delivery import Shipping
from failslow.agents.spool import AgentState, Outbox
from failslow.agents.transport import Backoff, Sender
from failslow.agents.urgency import URGENT_S, Urgency
from failslow.agents.vouch import MARK, Vouches

log = logging.getLogger(__name__)


@dataclass(slots=True)
class AgentStats:
    records_in: int = 0
    records_sealed: int = 0
    records_accepted: int = 0
    records_duplicate: int = 0
    records_rejected: int = 0
    envelopes_sent: int = 0
    heartbeats: int = 0
    retries: int = 0
    refused_envelopes: int = 0
    bad_messages: int = 0
    foreign_job_messages: int = 0
    outbox_envelopes: int = 0
    outbox_bytes: int = 0
    dropped_records: int = 0
    unencodable_records: int = 0  # v2: naming an unannounced comm or an unknown op
    registrations: int = 0  # v2: topologies registered with the service
    auth_failures: int = 0  # attempts the service answered 401/403 (the envelopes are kept)
    outbox_in_memory: int = 0  # envelopes held in memory because the disk did not take them
    disk_errors: int = 0  # outbox writes that failed (full or broken disk)
    urgent_envelopes: int = 0  # sealed early: a call blocked for longer than a step
    last_error: str | None = None


class NodeAgent(Shipping):
    def __init__(
        self,
        *,
        service: str,
        job: str,
        host: str | None = None,
        socket_path: str | None = None,
        input_dir: str | None = None,
        state_dir: str,
        token: str | None = None,
        flush_interval_s: float = 1.0,
        heartbeat_s: float = 5.0,
        max_batch_records: int = 20_000,
        max_outbox_bytes: int = 1 << 30,
        fsync: bool = True,
        backoff_cap_s: float = 10.0,
        inspector: Any = None,
        archive: str | None = None,
        protocol: str = "v2",
        socket_mode: int = 0o660,
    ) -> None:
        """``inspector``: an :class:`failslow.agents.sources.nccl_inspector.InspectorSource` to poll
        (NCCL Inspector dumps), next to the SDK's socket or spool directory. ``archive``: a
        JSONL file to which every delivered envelope is appended (``failslow replay`` reads it)."""
        self.archive = Path(archive) if archive else None
        self.job = job
        self.inspector = inspector
        self.host = host or socket.gethostname()
        self.socket_path = socket_path
        self.socket_mode = socket_mode
        self.input_dir = Path(input_dir) if input_dir else None
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.flush_interval_s = flush_interval_s
        self.heartbeat_s = heartbeat_s
        self.max_batch_records = max_batch_records
        self.outbox = Outbox(self.state_dir / "outbox", max_bytes=max_outbox_bytes, fsync=fsync)
        self.state = AgentState(self.state_dir / "agent.json")
        if self.state.data.get("job") not in (None, job):
            raise ValueError(f"state dir {state_dir} belongs to job {self.state.data['job']}")
        self.agent_id = str(self.state.data.get("agent") or f"{self.host}-{uuid.uuid4().hex[:8]}")
        self.next_seq = max(int(self.state.data.get("next_seq", 0)), self.outbox.max_seq() + 1)  # type: ignore[call-overload]
        self.ranks: dict[int, dict[str, Any]] = {
            int(k): v
            for k, v in dict(self.state.data.get("ranks", {})).items()  # type: ignore[call-overload]
        }
        self.comms: dict[str, dict[str, Any]] = dict(self.state.data.get("comms", {}))  # type: ignore[call-overload]
        self._topology_dirty = True
        if protocol not in ("v1", "v2"):
            raise ValueError(f"protocol must be v1 or v2, not {protocol!r}")
        self.v2 = V2Sealer(self.state_dir) if protocol == "v2" else None
        self._registered: set[str] = set()  # digests the service knows (this session)
        self.sender = Sender(service, token=token)
        self.backoff = Backoff(cap_s=backoff_cap_s)
        self.stats = AgentStats()
        self._lock = threading.Lock()
        self._collectives: list[dict[str, Any]] = []
        self._steps: list[dict[str, Any]] = []
        self.vouches = Vouches()  # what its envelopes vouch for (agents/vouch.py)
        self.urgency = Urgency()  # when to seal sooner: a call blocked a step (agents/urgency.py)
        self._vouched_ns = 0  # the newest complete_ns sealed
        self._consumed_files: list[Path] = []
        self._stop = threading.Event()
        self._wake_sender = threading.Event()
        self._last_seal = time.monotonic()
        self._last_post = time.monotonic()
        self.last_ok = float("-inf")  # never yet
        self.started = time.monotonic()
        self._auth_alarm_at = float("-inf")
        self.refused_records = 0  # in envelopes the service refused as invalid
        self._threads: list[threading.Thread] = []
        self._sock: socket.socket | None = None
        self._save_state()

    # -- input ---------------------------------------------------------------------------------
    def add_payload(self, payload: bytes, source: Path | None = None) -> None:
        try:
            head, items = wire.decode_payload(payload)
        except (ValueError, orjson.JSONDecodeError):
            self.stats.bad_messages += 1
            if source is not None:
                source.unlink(missing_ok=True)
            return
        if head.get("job") != self.job:
            self.stats.foreign_job_messages += len(items)
            if source is not None:
                source.unlink(missing_ok=True)
            return
        self.add_items(items, source, pid=wire.sender_pid(head))

    def add_items(self, items: list[list[Any]], source: Path | None = None, *,
                  pid: int | None = None) -> None:  # fmt: skip
        """A source's messages (``pid``: the SDK process that handed them over; None: a source
        of the agent's own, which vouches for nothing)."""
        with self._lock:
            before, mark = self.stats.records_in, None
            for m in items:
                try:
                    tag = m[0]
                    if tag == "c":
                        self._collectives.append(rec := wire.collective_dict(m))
                        self.urgency.collective(rec)
                        self.stats.records_in += 1
                    elif tag == "s":
                        self._steps.append(rec := wire.step_dict(m))
                        self.urgency.step(rec)
                        self.stats.records_in += 1
                    elif tag == "r":
                        ann = {"rank": m[1], "gpu": m[2], "world_size": m[3]}
                        if self.ranks.get(int(m[1])) != ann:
                            self.ranks[int(m[1])] = ann
                            self._topology_dirty = True
                    elif tag == "m":
                        ann = {"comm": m[1], "kind": m[2], "ranks": m[3]}
                        if self.comms.get(m[1]) != ann:
                            self.comms[m[1]] = ann
                            self._topology_dirty = True
                    elif tag == MARK:  # (noted below, after the records it vouches for)
                        mark = (int(m[1]), int(m[2]))
                    else:
                        self.stats.bad_messages += 1
                except (IndexError, TypeError, ValueError):
                    self.stats.bad_messages += 1
            self.vouches.note(pid, records=self.stats.records_in > before, mark=mark)
            if source is not None:
                self._consumed_files.append(source)
            full = len(self._collectives) + len(self._steps) >= self.max_batch_records
        if full:
            self.seal()

    # -- sealing -------------------------------------------------------------------------------
    def seal(self, *, vouching: bool = False) -> int | None:
        """Turn the current batch into a durable envelope; returns its batch_seq (None if
        empty). ``vouching``: with no records, still one when it vouches for later than the
        last (a call is blocked for longer than a step: agents/urgency.py)."""
        with self._lock:
            self._last_seal = time.monotonic()
            consumed, self._consumed_files = self._consumed_files, []
            sent = time.time_ns()
            vouch = self.vouches.current(sent)
            news = vouching and vouch.get("complete_ns", 0) > self._vouched_ns
            if not self._collectives and not self._steps and not news:
                for f in consumed:
                    f.unlink(missing_ok=True)
                return None
            self._vouched_ns = max(self._vouched_ns, vouch.get("complete_ns", 0))
            self.stats.urgent_envelopes += vouching
            seq = self.next_seq
            self.next_seq += 1
            records = len(self._collectives) + len(self._steps)
            header = {
                "job": self.job,
                "host": self.host,
                "sent_ns": sent,
                "agent": self.agent_id,
                "batch_seq": seq,
                **vouch,
            }
            ranks, comms = list(self.ranks.values()), list(self.comms.values())
            if self.v2 is not None:
                payload, records, dropped = self.v2.seal(
                    header, ranks, comms, self._collectives, self._steps
                )
                self.stats.unencodable_records += dropped
            else:
                envelope = {
                    **header,
                    "ranks": ranks,
                    "comms": comms,
                    "collectives": self._collectives,
                    "steps": self._steps,
                }
                payload = wire.encode_envelope(envelope)
            self._collectives, self._steps = [], []
            self.outbox.put(seq, payload, records)  # on disk, or in memory while it is full
            self.stats.records_sealed += records
            try:
                self._save_state()
            except OSError as exc:  # a full disk: next_seq is safe in memory and in the outbox
                self.stats.last_error = f"cannot save agent state: {exc}"
                log.error("cannot save agent state (%s); going on", exc)
        for f in consumed:  # sealed durably: the SDK's files can go
            f.unlink(missing_ok=True)
        self._wake_sender.set()
        return seq

    def _save_state(self) -> None:
        self.state.data.update({"job": self.job, "agent": self.agent_id, "next_seq": self.next_seq})
        if self._topology_dirty:
            self.state.data["ranks"] = {str(k): v for k, v in self.ranks.items()}
            self.state.data["comms"] = self.comms
            self._topology_dirty = False
        self.state.save()

    # -- threads -------------------------------------------------------------------------------
    def _sender_loop(self) -> None:
        while not self._stop.is_set():
            try:
                outcome = self.deliver_once()
            except Exception as exc:  # a bug in delivery must not end delivery for good
                self.stats.last_error = f"delivery failed: {exc!r}"
                log.exception("delivering an envelope failed; retrying")
                self._stop.wait(1.0)
                continue
            if outcome == "empty":
                if time.monotonic() - self._last_post >= self.heartbeat_s:
                    self.heartbeat()
                self._wake_sender.wait(0.2)
                self._wake_sender.clear()

    def _sealer_loop(self) -> None:
        while not self._stop.wait(0.05):
            if self.outbox.in_memory():
                self.outbox.spill()  # the disk may take them again
            since = time.monotonic() - self._last_seal
            with self._lock:
                urgent = since >= URGENT_S and self.urgency.due(time.time_ns())
            if since >= self.flush_interval_s or urgent:
                try:
                    self.seal(vouching=urgent)
                except OSError as exc:
                    self.stats.last_error = f"seal failed: {exc}"
                    log.exception("sealing a batch failed")
            self._refresh_stats()

    def _socket_loop(self) -> None:
        assert self.socket_path is not None
        self._sock = bind_socket(self.socket_path, self.socket_mode)
        receive(self._sock, self._stop, self.add_payload)

    def _spool_loop(self) -> None:
        assert self.input_dir is not None
        self.input_dir.mkdir(parents=True, exist_ok=True)
        seen: set[Path] = set()
        while not self._stop.wait(0.1):
            files = sorted(p for p in self.input_dir.glob("*.jsonl") if p not in seen)
            for p in files:
                try:
                    payload = p.read_bytes()
                except OSError:
                    continue
                seen.add(p)
                self.add_payload(payload, source=p)
            seen = {p for p in seen if p.exists()}

    def _inspector_loop(self) -> None:
        while not self._stop.wait(min(self.flush_interval_s, 0.5)):
            try:
                items = self.inspector.poll()
            except Exception:  # noqa: BLE001 - a source must never stop the agent
                log.exception("NCCL Inspector source failed; retrying")
                continue
            if items:
                self.add_items(items)

    def _refresh_stats(self) -> None:
        self.stats.outbox_envelopes = len(self.outbox)
        self.stats.outbox_bytes = self.outbox.bytes
        self.stats.outbox_in_memory = self.outbox.in_memory()
        self.stats.disk_errors = self.outbox.disk_errors
        # refused by the service + dropped by the outbox's bounds (each counted once)
        self.stats.dropped_records = self.refused_records + self.outbox.dropped_records

    def health(self, *, stale_after_s: float = 60.0) -> tuple[bool, dict[str, object]]:
        """(healthy, what it is based on): every loop thread alive, and the service took an
        envelope or heartbeat within ``stale_after_s`` (or the agent started less ago)."""
        dead = [t.name for t in self._threads if not t.is_alive()]
        now = time.monotonic()
        since = now - max(self.last_ok, self.started)
        ok = not dead and since < stale_after_s
        age = round(now - self.last_ok, 1) if self.last_ok > float("-inf") else None
        return ok, {
            "job": self.job,
            "host": self.host,
            "dead_threads": dead,
            "seconds_since_delivery": age,
            "outbox_envelopes": len(self.outbox),
            "last_error": self.stats.last_error,
        }

    def write_stats(self) -> None:
        self._refresh_stats()
        tmp = self.state_dir / "stats.json.tmp"
        try:
            tmp.write_bytes(orjson.dumps(asdict(self.stats)))
            os.replace(tmp, self.state_dir / "stats.json")
        except OSError as exc:  # a full disk must not stop the agent; the log still says it
            log.warning("cannot write %s (%s)", self.state_dir / "stats.json", exc)

    def start(self) -> None:
        targets = [self._sender_loop, self._sealer_loop]
        if self.socket_path:
            targets.append(self._socket_loop)
        if self.input_dir:
            targets.append(self._spool_loop)
        if self.inspector is not None:
            targets.append(self._inspector_loop)
        for target in targets:
            t = threading.Thread(target=target, name=f"agent-{target.__name__}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, *, drain_timeout_s: float = 5.0) -> None:
        """Seal what is buffered and try to deliver it for up to ``drain_timeout_s``."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout=2.0)
        self.seal()
        deadline = time.monotonic() + drain_timeout_s
        self._stop.clear()
        while time.monotonic() < deadline and len(self.outbox):
            if self.deliver_once() != "ok":
                break
        self._stop.set()
        self.write_stats()
        self.sender.close()
        if self._sock is not None:
            self._sock.close()
        if self.socket_path:
            Path(self.socket_path).unlink(missing_ok=True)

    def run_forever(self, *, stats_every_s: float = 2.0) -> None:
        self.start()
        try:
            while True:
                time.sleep(stats_every_s)
                self.write_stats()
        finally:
            self.stop()
