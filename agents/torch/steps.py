"""Step markers: given by the training script, or found at each ``optimizer.step()``.

The service compares ranks step by step. A script that marks its steps
(``with instrumentation.step(i):``) is taken at its word. A script that does not — the usual
case under ``failslow run`` — gets one step per call of its first optimizer's ``step()``
(PyTorch's global optimizer hook): from the end of the previous step (or the first collective
seen) to the end of this one. While that optimizer lives, others of the same job (one per model
chunk, say) do not mark steps; once it is freed, the next one to step takes over. Once the
script marks a step itself the optimizers' are ignored for good.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from failslow.agents.sdk import Recorder


class Steps:
    def __init__(
        self, recorder: Recorder, rank: Callable[[], int | None], clock: Callable[[], int]
    ) -> None:
        self.recorder = recorder
        self._rank = rank
        self._clock = clock
        self.explicit = False
        self.auto_steps = 0
        self.errors = 0
        self._primary: Any = None  # weakref to the optimizer whose steps mark ours
        self._since: int | None = None
        self._handle: Any = None

    @contextlib.contextmanager
    def step(self, step: int, work: float | None = None) -> Iterator[None]:
        self.explicit = True
        rank = self._rank()
        if rank is None:
            yield
            return
        with self.recorder.step(rank=rank, step=step, work=work):
            yield

    def first_call(self) -> None:
        """The first collective: the first automatic step starts here."""
        if self._since is None:
            self._since = self._clock()

    def watch_optimizers(self) -> bool:
        """Mark a step at each ``step()`` of the first optimizer that steps (False: this
        PyTorch has no global optimizer hook)."""
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._handle = register_optimizer_step_post_hook(self._stepped)
            return True
        except Exception:  # noqa: BLE001
            return False

    def unwatch(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _stepped(self, optimizer: Any, _args: Any, _kwargs: Any) -> None:
        try:
            if self.explicit:
                return
            primary = self._primary() if self._primary is not None else None
            if primary is None:
                self._primary = weakref.ref(optimizer)
            elif primary is not optimizer:
                return
            rank = self._rank()
            if rank is None:
                return
            now = self._clock()
            start = self._since if self._since is not None else now
            self.recorder.record_step(rank=rank, step=self.auto_steps, start_ns=start, end_ns=now)
            self.auto_steps += 1
            self._since = now
        except Exception:  # noqa: BLE001 - never into the training loop
            self.errors += 1
