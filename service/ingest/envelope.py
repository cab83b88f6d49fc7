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
    vouched = completeness(body, sent_ns, errors, "")
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
    return Envelope(job, host, sent_ns, agent, batch_seq, **lists,  # type: ignore[arg-type]
                    complete_ns=vouched[0], inflight_after_ns=vouched[1])


def completeness(body: dict[str, Any], sent_ns: Any, errors: list[dict[str, str]],
                 at: str) -> tuple[int | None, int | None]:  # fmt: skip
    """The optional ``complete_ns`` and ``inflight_after_ns`` (docs/ingest-v1.md, "Completeness"):
    together or not at all, non-negative, ``complete_ns`` not after ``sent_ns``."""
    complete, after = body.get("complete_ns"), body.get("inflight_after_ns")
    if complete is None and after is None:
        return None, None
    if (complete is None) != (after is None):
        errors.append({"loc": f"{at}complete_ns", "msg": "complete_ns and inflight_after_ns go "
                       "together"})  # fmt: skip
        return None, None
    ok = True
    for name, v in (("complete_ns", complete), ("inflight_after_ns", after)):
        if not is_int(v) or not 0 <= v <= INT64_MAX:
            errors.append({"loc": f"{at}{name}", "msg": "must be a non-negative integer (ns)"})
            ok = False
    if ok and is_int(sent_ns) and complete > sent_ns:
        errors.append({"loc": f"{at}complete_ns", "msg": "must not be after sent_ns"})
        ok = False
    return (complete, after) if ok else (None, None)
