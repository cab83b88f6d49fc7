"""A compute slowdown of a known factor, for the lab's jobs.

A GPU that computes F times slower makes every step's compute take F times as long. The lab
reproduces that on CPUs, with the truth known: while ``--slow-file`` holds a factor F, the rank
burns (F - 1) times its own compute time of a step in CPU time (measured on its own training
thread, so that it stretches with the machine's load as the real compute does), half before the
forward pass and half when the backward pass begins. Its data-parallel and tensor-parallel peers
then wait for it as for a slow GPU, and "N% slower than its peers" has a true value:
(F - 1) x 100%. The lab writes the file (``failslow lab --fault slow --slow-factor F``).
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from typing import Any


class Slowdown:
    def __init__(self, path: str | None, history: int = 20) -> None:
        self.path = path
        self._mtime: float | None = None
        self._factor = 1.0
        self._cpu: deque[int] = deque(maxlen=history)  # ns of compute per step, unslowed part
        self._spent = 0  # ns burnt in this step (not compute of the model)
        self._t0 = 0

    def factor(self) -> float:
        if not self.path:
            return 1.0
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            self._mtime, self._factor = None, 1.0
            return 1.0
        if mtime != self._mtime:
            self._mtime = mtime
            try:
                with open(self.path) as f:
                    self._factor = max(1.0, float(f.read().strip() or 1.0))
            except (OSError, ValueError):
                self._factor = 1.0
        return self._factor

    def _burn(self, share: float) -> None:
        f = self.factor()
        if f <= 1.0 or not self._cpu:
            return
        budget = int((f - 1.0) * statistics.median(self._cpu) * share)
        start = time.thread_time_ns()
        x = 1.0
        while time.thread_time_ns() - start < budget:
            for _ in range(200):
                x = x * 1.000001 + 1e-9
        self._spent += time.thread_time_ns() - start

    def begin_step(self, share: float = 0.5) -> None:
        """Before the forward pass: ``share`` of the extra compute (the rest when the backward
        pass begins, :meth:`backward_begins`)."""
        self._spent = 0
        self._t0 = time.thread_time_ns()
        self._burn(share)

    def backward_begins(self, tensor: Any) -> Any:
        """Hook ``tensor`` (the forward output): the other half when its gradient arrives."""
        if self.factor() > 1.0 and getattr(tensor, "requires_grad", False):

            def hook(grad: Any) -> Any:
                self._burn(0.5)
                return grad

            tensor.register_hook(hook)
        return tensor

    def end_step(self) -> None:
        """After the backward pass (and the optimizer): the step's own compute is noted."""
        self._cpu.append(max(0, time.thread_time_ns() - self._t0 - self._spent))
