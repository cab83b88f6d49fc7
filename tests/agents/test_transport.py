"""Backoff and Retry-After handling, and the sender's classification of answers."""

from __future__ import annotations

import email.utils
import random
import time

import pytest

from failslow.agents.transport import Backoff, retry_after


def test_full_jitter_backoff_is_bounded_and_grows() -> None:
    b = Backoff(base_s=0.5, cap_s=4.0, rng=random.Random(1))
    samples = [b.next() for _ in range(10)]
    ceilings = [min(4.0, 0.5 * 2**i) for i in range(10)]
    assert all(0 <= s <= c for s, c in zip(samples, ceilings, strict=True))
    assert max(samples[5:]) > 0.5  # it does grow past the base
    b.reset()
    assert b.attempt == 0


def test_backoff_keeps_working_after_thousands_of_failures() -> None:
    # An outage of hours is thousands of attempts; 2**1024 overflowed a float and killed the
    # agent's sender thread (seen in CI: test_demo_fast).
    b = Backoff(base_s=0.25, cap_s=0.3, rng=random.Random(2))
    waits = [b.next() for _ in range(5000)]
    assert all(0 <= w <= 0.3 for w in waits)
    assert b.attempt == 5000


def test_retry_after_parsing() -> None:
    assert retry_after("7") == 7.0
    assert retry_after("9999") == 300.0
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after(future) == pytest.approx(30, abs=2)
    assert retry_after("soon") is None
    assert retry_after(None) is None
