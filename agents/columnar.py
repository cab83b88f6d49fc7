"""The agent's side of ingest v2: a batch sealed as binary columns that name the host's topology by
digest, the registrations those digests stand for (kept with the agent's state, so that envelopes
left in the outbox by a stopped agent can be registered again), and the way back to v1-shaped JSON
for the archive that ``failslow replay`` reads."""

from __future__ import annotations

import gzip
import logging
import os
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson

from failslow.wire import topology, v2
from failslow.wire.ops import normalise_op

log = logging.getLogger(__name__)
KEPT = 16  # registrations remembered (each digest an outbox envelope may still name)


def peek_header(payload: bytes) -> dict[str, Any] | None:
    """The header of a (gzip) v2 body, without decoding its columns; None for v1 JSON."""
    head = payload
    if payload[:2] == b"\x1f\x8b":
        try:
            head = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS).decompress(payload, 1 << 16)
        except zlib.error:
            return None
    if head[:4] != v2.MAGIC or len(head) < 8:
        return None
    size = int.from_bytes(head[4:8], "little")
    try:
        header = orjson.loads(head[8 : 8 + size])
    except orjson.JSONDecodeError:
        return None
    return header if isinstance(header, dict) else None


class V2Sealer:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "topologies.json"
        self.registrations: OrderedDict[str, dict[str, Any]] = OrderedDict()
        if self.path.exists():
            try:
                self.registrations.update(orjson.loads(self.path.read_bytes()))
            except (OSError, ValueError):
                log.warning("registrations %s unreadable; they will be rebuilt", self.path)

    def _remember(self, digest: str, registration: dict[str, Any]) -> None:
        if digest in self.registrations:
            self.registrations.move_to_end(digest)
            return
        self.registrations[digest] = registration
        while len(self.registrations) > KEPT:
            self.registrations.popitem(last=False)
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_bytes(orjson.dumps(self.registrations))
            os.replace(tmp, self.path)
        except OSError as exc:  # a full disk: kept in memory, written with the next new one
            log.error("cannot save registrations to %s (%s); kept in memory", self.path, exc)

    def topology(
        self, ranks: list[dict[str, Any]], comms: list[dict[str, Any]], sent_ns: int
    ) -> str:
        """The digest of the host's topology now (remembered with its registration)."""
        canon = topology.canonical(ranks, comms)
        digest = topology.digest(ranks, comms)
        self._remember(digest, {"sent_ns": sent_ns, **canon})
        return digest

    def seal(
        self,
        header: dict[str, Any],
        ranks: list[dict[str, Any]],
        comms: list[dict[str, Any]],
        collectives: list[dict[str, Any]],
        steps: list[dict[str, Any]],
    ) -> tuple[bytes, int, int]:
        """``(gzip body, records in it, records that cannot be encoded)``: a record naming a
        comm the host never announced, or an op no spelling of which is known, is left out and
        counted (the service would reject it)."""
        digest = self.topology(ranks, comms, header["sent_ns"])
        codes = {c["comm"]: i for i, c in enumerate(comms)}
        good: list[dict[str, Any]] = []
        for c in collectives:
            op = normalise_op(str(c["op"]))
            if op is None or c["comm"] not in codes:
                continue
            good.append(c if op == c["op"] else {**c, "op": op})
        body = v2.encode_records({**header, "topology": digest}, codes, good, steps)
        records = len(good) + len(steps)
        return gzip.compress(body, compresslevel=1), records, len(collectives) - len(good)

    def to_v1(self, payload: bytes) -> dict[str, Any] | None:
        """A delivered v2 envelope as v1 JSON (for the archive), with its topology."""
        raw = gzip.decompress(payload) if payload[:2] == b"\x1f\x8b" else payload
        header, cols = v2.decode(raw)
        reg = self.registrations.get(header["topology"])
        if reg is None:
            return None
        names = [c["comm"] for c in reg["comms"]]
        c = cols.collectives
        collectives = []
        for i in range(cols.n_collectives):
            rec: dict[str, Any] = {
                "rank": int(c["rank"][i]),
                "comm": names[int(c["comm"][i])],
                "seq": int(c["seq"][i]),
                "op": v2.OPS[int(c["op"][i])].value,
                "bytes": int(c["bytes"][i]),
                "start_ns": int(c["start_ns"][i]),
                "end_ns": None if c["end_ns"][i] == v2.NO_END else int(c["end_ns"][i]),
            }
            if c["peer"][i] != v2.NO_PEER:
                rec["peer"] = int(c["peer"][i])
            collectives.append(rec)
        s = cols.steps
        steps: list[dict[str, Any]] = [
            {"rank": int(s["rank"][i]), "step": int(s["step"][i]),
             "start_ns": int(s["start_ns"][i]), "end_ns": int(s["end_ns"][i])}
            for i in range(cols.n_steps)
        ]  # fmt: skip
        if "work" in s:
            for i, w in enumerate(s["work"].tolist()):
                if w == w:
                    steps[i]["work"] = w
        keep = ("job", "host", "sent_ns", "agent", "batch_seq", "complete_ns", "inflight_after_ns")
        return {
            **{k: header[k] for k in keep if header.get(k) is not None},
            "ranks": reg["ranks"],
            "comms": reg["comms"],
            "collectives": collectives,
            "steps": steps,
        }
