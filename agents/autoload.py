"""Instrumentation with no edit to the training script: ``failslow run -- torchrun ...``.

``failslow run`` sets ``FAILSLOW_TORCH=1`` and puts :mod:`failslow.agents.bootstrap` first
on ``PYTHONPATH``; its ``sitecustomize`` (which then hands over to any other
``sitecustomize`` on the path) calls :func:`arm` in every Python process the command starts.
:func:`arm` costs nothing in a process that never imports PyTorch: it waits, as an import hook,
for ``torch`` to be imported (which imports ``torch.distributed``) and installs
:class:`Instrumentation` right after (before ``init_process_group`` is fine). The recorder's
threads start at the process's first collective, so a launcher that imports ``torch.distributed``
but never communicates (torchrun's own agent) runs none.

Settings, all from the environment: ``FAILSLOW_JOB`` (default ``default``), ``FAILSLOW_SOCKET``
(default: the node agent's socket for the job), ``FAILSLOW_SPOOL_DIR`` (files instead of the
socket), ``FAILSLOW_INFLIGHT_AFTER_S`` (0.25). At exit, what is left is handed to the agent (at most
``EXIT_FLUSH_S``).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from types import ModuleType
from typing import Any

log = logging.getLogger("failslow.torch")

ENV_ENABLE = "FAILSLOW_TORCH"
EXIT_FLUSH_S = 2.0
_TARGET = "torch"  # torch imports torch.distributed itself; install once both are whole
_lock = threading.Lock()
_instrumentation: Any = None


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "").strip().lower() not in ("", "0", "false", "no", "off")


def state() -> str:
    """One line on the zero-code path in this process."""
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
    on_path = any(os.path.abspath(p or ".") == boot for p in sys.path)
    if _instrumentation is not None:
        return "instrumented automatically in this process"
    if enabled():
        armed = "armed: installs when torch is imported"
        return armed if _finder is not None else armed.replace("armed", "enabled, not armed")
    hint = " (failslow's bootstrap is on sys.path)" if on_path else ""
    return f"off{hint}: `failslow run -- <command>` instruments a job with no code change"


def bootstrap_dir() -> str:
    """The folder ``failslow run`` puts first on ``PYTHONPATH``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")


def instrumentation() -> Any:
    """The process's automatic :class:`Instrumentation` (None before it is installed)."""
    return _instrumentation


def install_now() -> Any:
    """Install the process's instrumentation (idempotent); None if it could not be."""
    global _instrumentation
    with _lock:
        if _instrumentation is not None:
            return _instrumentation
        try:
            from failslow.agents import sdk
            from failslow.agents.torch import Instrumentation

            recorder = sdk.configure(start=False)
            inflight = float(os.environ.get("FAILSLOW_INFLIGHT_AFTER_S", "0.25"))
            _instrumentation = Instrumentation(recorder, inflight_after_s=inflight).install()
            atexit.register(_at_exit, _instrumentation)
        except Exception:  # noqa: BLE001 - the training runs on, uninstrumented
            log.warning("failslow: could not instrument torch.distributed", exc_info=True)
            return None
    return _instrumentation


def _at_exit(inst: Any) -> None:
    """Hand what is left to the agent before the interpreter ends (at most ``EXIT_FLUSH_S``,
    and not at all when no agent has been taking records: nothing would come of the wait)."""
    try:
        inst.poll_events()
        recorder = inst.recorder
        if recorder._thread is not None and not recorder.stats.agent_absent:
            recorder.flush(timeout_s=EXIT_FLUSH_S)
    except Exception:  # noqa: BLE001 - never in the way of the exit
        pass


class _Finder(importlib.abc.MetaPathFinder):
    """Waits for ``torch``'s import and installs right after its module ran."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _unhook()
        install_now()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


_finder: _Finder | None = None


def _unhook() -> None:
    global _finder
    if _finder is not None and _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    _finder = None


def arm() -> None:
    """Install now if ``torch`` is imported already, else right after its import."""
    global _finder
    if _TARGET in sys.modules:
        install_now()
        return
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
