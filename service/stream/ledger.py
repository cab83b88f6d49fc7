"""The v1 ledger: what each member record of recent collectives said, so that a v1 envelope is
answered per record as the contract says — an identical re-send is a duplicate, a changed one a
conflict, an in-flight record re-sent with its end completes it — before the join ever sees it.

v1 is the per-record path (JSON, one Python object per record); v2 envelopes do not go through the
ledger (their re-sends are whole batches, recognised by ``agent`` + ``batch_seq``; what the join
finds contradictory is counted there). Bounded: the oldest entries are forgotten first, and a
record older than everything forgotten of its communicator counts as a duplicate.
"""

from __future__ import annotations

from collections import OrderedDict

from failslow.service.stream.records import CollectiveRecord, Outcome, RecordError, Reject

Key = tuple[int, int, int]  # (comm index, seq, member position)
Entry = tuple[str, int, int | None, int, int | None]  # (op, bytes, peer, start, end)


class Ledger:
    def __init__(self, *, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: OrderedDict[Key, Entry] = OrderedDict()
        self.retired_seq: dict[int, int] = {}  # comm index -> newest seq forgotten
        self.assumed_duplicates = 0

    def check(self, comm: int, pos: int, rec: CollectiveRecord) -> Outcome:
        """What ``rec`` (member ``pos`` of comm ``comm``) is; raises RecordError on conflict."""
        key = (comm, rec.seq, pos)
        old = self.entries.get(key)
        if old is None:
            if rec.seq <= self.retired_seq.get(comm, -1):
                # Older than what we still remember: most likely a re-send. Counted apart.
                self.assumed_duplicates += 1
                return Outcome.DUPLICATE
            self.entries[key] = (rec.op, rec.nbytes, rec.peer, rec.start_ns, rec.end_ns)
            if len(self.entries) > self.max_entries:
                self._forget_oldest()
            return Outcome.NEW
        op, nbytes, peer, start, end = old
        if (op, nbytes, peer, start) != (rec.op, rec.nbytes, rec.peer, rec.start_ns):
            raise RecordError(Reject.CONFLICT, "conflicting re-send of a stored record")
        if end == rec.end_ns or rec.end_ns is None:
            return Outcome.DUPLICATE  # identical, or a stale in-flight copy
        if end is not None:
            raise RecordError(Reject.CONFLICT, "conflicting re-send of a stored record")
        self.entries[key] = (op, nbytes, peer, start, rec.end_ns)
        return Outcome.COMPLETED

    def _forget_oldest(self) -> None:
        (comm, seq, _), _ = self.entries.popitem(last=False)
        self.retire(comm, seq)

    def retire(self, comm: int, seq: int) -> None:
        """Forget-by-number: records of ``comm`` up to ``seq`` are re-sends from now on."""
        if seq > self.retired_seq.get(comm, -1):
            self.retired_seq[comm] = seq
