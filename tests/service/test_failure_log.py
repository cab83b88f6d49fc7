"""A loop that keeps failing (the database is away) logs one traceback, then a line now and
then, and says when it works again."""

from __future__ import annotations

import logging

import pytest

from failslow.service.app import FailureLog


def test_a_failing_loop_logs_one_traceback_then_a_line_per_period(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr("failslow.service.app.time.monotonic", lambda: now[0])
    quiet = FailureLog("the loop", every_s=30)
    with caplog.at_level(logging.INFO, logger="failslow.service.app"):
        for _ in range(300):  # 30 s at 0.1 s
            quiet.failed(RuntimeError("database away"))
            now[0] += 0.1
        now[0] += 1
        quiet.failed(RuntimeError("database away"))
        quiet.succeeded()
        quiet.succeeded()
    records = [(r.levelno, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    assert records == [
        (logging.ERROR, "the loop failed", True),
        (logging.ERROR, "the loop still failing (301 times): database away", False),
        (logging.WARNING, "the loop works again after 301 failures", False),
    ]
