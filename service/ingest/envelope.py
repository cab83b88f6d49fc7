"""The envelope's own rules (the top level): a body that breaks them is rejected whole, with
every problem listed, and nothing is stored. Its records are checked one by one later, by the
event-time core (:mod:`failslow.service.stream.parse`)."""

from __future__ import annotations

from typing import Any

from failslow.service.errors import InvalidEnvelope
from failslow.service.ids import IDENTIFIER, is_identifier
from failslow.service.stream.parse import INT64_MAX, is_int
from failslow.service.stream.records import Envelope

LIST_FIELDS = ("ranks", "comms", "collectives", "steps")


def _ident(body: dict[str, Any], name: str, errors: list[dict[str, str]]) -> str:
    value = body.get(name)
    if value is None:
        errors.append({"loc": name, "msg": "field required"})
    elif not is_identifier(value):
        errors.append({"loc": name, "msg": f"must match {IDENTIFIER}"})
    return value if isinstance(value, str) else ""


def parse_envelope(body: Any) -> Envelope:
    """Check the top level; raise :class:`InvalidEnvelope` listing every problem found."""
    if not isinstance(body, dict):
        raise InvalidEnvelope(
            "the body must be a JSON object", errors=[{"loc": "", "msg": "not an object"}]
        )
    errors: list[dict[str, str]] = []
    job = _ident(body, "job", errors)
    host = _ident(body, "host", errors)
    sent_ns = body.get("sent_ns")
    if sent_ns is None:
        errors.append({"loc": "sent_ns", "msg": "field required"})
    elif not is_int(sent_ns) or not 0 <= sent_ns <= INT64_MAX:
        errors.append({"loc": "sent_ns", "msg": "must be a non-negative integer (ns since epoch)"})
    agent = body.get("agent")
    if agent is not None and not is_identifier(agent):
        errors.append({"loc": "agent", "msg": "must be an identifier"})
    batch_seq = body.get("batch_seq")
    if batch_seq is not None and (not is_int(batch_seq) or batch_seq < 0):
        errors.append({"loc": "batch_seq", "msg": "must be a non-negative integer"})
    if (batch_seq is None) != (agent is None):
        errors.append({"loc": "batch_seq", "msg": "agent and batch_seq go together"})
    lists: dict[str, list[Any]] = {}
    for name in LIST_FIELDS:
        value = body.get(name)
        if value is None:
            lists[name] = []
        elif isinstance(value, list):
            lists[name] = value
        else:
            errors.append({"loc": name, "msg": "must be a list"})
    if errors:
        raise InvalidEnvelope("the envelope is not valid; nothing was stored", errors=errors)
    return Envelope(job, host, sent_ns, agent, batch_seq, **lists)  # type: ignore[arg-type]
