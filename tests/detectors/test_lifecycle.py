import numpy as np

from failslow.detectors.lifecycle import ConditionTracker, run_start


def feed(
    tracker: ConditionTracker, flags: list[bool], elevated: list[bool] | None = None
) -> list[tuple[int, str]]:
    events = []
    for i, f in enumerate(flags):
        e = elevated[i] if elevated is not None else f
        tr = tracker.update(np.array([f]), np.array([e]), np.array([True]))
        events += [(i, "open") for _ in tr.opened] + [(i, "resolve") for _ in tr.resolved]
    return events


def test_opens_only_after_persistence() -> None:
    t = ConditionTracker(window=5, open_after=4, resolve_after=3)
    assert feed(t, [True, False, True, True]) == []
    t = ConditionTracker(window=5, open_after=4, resolve_after=3)
    assert feed(t, [True, True, True, True]) == [(3, "open")]


def test_single_spikes_never_open() -> None:
    t = ConditionTracker(window=5, open_after=4, resolve_after=3)
    assert feed(t, [True, False, False, False] * 10) == []


def test_hysteresis_uses_the_relaxed_signal() -> None:
    t = ConditionTracker(window=5, open_after=4, resolve_after=3)
    flags = [True] * 4 + [False] * 6
    elevated = [True] * 4 + [True, True, False, False, False, False]
    assert feed(t, flags, elevated) == [(3, "open"), (8, "resolve")]


def test_absent_subjects_neither_open_nor_resolve() -> None:
    t = ConditionTracker(window=3, open_after=2, resolve_after=2)
    yes, no = np.array([True]), np.array([False])
    t.update(yes, yes, yes)
    assert t.update(yes, yes, yes).opened.tolist() == [0]
    for _ in range(5):
        tr = t.update(no, no, no)  # no data: stays open
        assert tr.resolved.size == 0
    assert t.open[0]


def test_seeded_subject_resolves_when_clean() -> None:
    t = ConditionTracker(window=3, open_after=2, resolve_after=2)
    t.seed_open(4)
    no = np.zeros(5, bool)
    t.update(no, no, np.ones(5, bool))
    assert t.update(no, no, np.ones(5, bool)).resolved.tolist() == [4]


def test_run_start_tolerates_one_gap() -> None:
    assert run_start(np.array([False, False, True, True, False, True, True])) == 2
    assert run_start(np.array([True, False, False, True, True])) == 3
    assert run_start(np.array([True, True, False])) == 0
    assert run_start(np.array([False, False])) == 1


def test_flapping_subject_needs_longer_to_resolve() -> None:
    t = ConditionTracker(window=3, open_after=2, resolve_after=3, flap_window=20)
    on, off = [True] * 3, [False] * 5
    events = feed(t, on + off + on + off + off)
    # first burst opens and resolves after 3 clean frames; the reopen within 20 frames needs 6
    assert events == [(1, "open"), (5, "resolve"), (9, "open"), (16, "resolve")]


def test_a_longer_evidence_window_for_one_frame_at_a_time() -> None:
    """``evidence=(10, 7)`` (a small job on shared CPUs): 4 of 5, or 6 of 10, open nothing; the
    7th suspect frame of 10 does. Bits older than the tracker's own window are kept for it."""

    def run(flags: list[bool]) -> list[int]:
        t = ConditionTracker(window=5, open_after=4, resolve_after=3)
        out = []
        for i, f in enumerate(flags):
            tr = t.update(np.array([f]), np.array([f]), np.array([True]), evidence=(10, 7))
            out += [i for _ in tr.opened]
        return out

    x, o = False, True
    assert run([o, o, o, x, o, x, x, o, x, x] * 3) == []  # 5 of 10 (4 of 5 at times)
    assert run([o, x, o, o, x, o, o, o, x, x, x]) == []  # 6 of 10
    assert run([o, x, o, o, x, o, o, o, o]) == [8]  # the 7th of the last 9


def test_evidence_in_proportion_to_strength() -> None:
    """Strong frames need 4 in a row, severe ones (a rank twice as slow) 3; a stall crossing a
    step boundary (2 severe frames) opens nothing."""

    def opened_at(strong: list[bool], severe: list[bool]) -> int | None:
        t = ConditionTracker(window=5, open_after=5, resolve_after=3)
        for i, (st, sv) in enumerate(zip(strong, severe, strict=True)):
            one, sus = np.array([True]), np.array([st])
            tr = t.update(sus, sus, one, sus, severe=np.array([sv]))
            if tr.opened.size:
                return i
        return None

    assert opened_at([True] * 6, [False] * 6) == 3
    assert opened_at([True] * 6, [True] * 6) == 2
    assert opened_at([True, True, False, True, True, False], [True, True, False] * 2) is None
    # severe but not strong (the peers' verdict fails) is not evidence
    assert opened_at([False] * 6, [True] * 6) is None
