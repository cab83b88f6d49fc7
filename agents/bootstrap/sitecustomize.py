"""Put first on ``PYTHONPATH`` by ``failslow run``: arms the PyTorch instrumentation in every
Python process of the command (:mod:`failslow.agents.autoload`), then runs the
``sitecustomize`` this one shadows, if there is one. Never raises."""

import os
import sys


def _arm() -> None:
    try:
        from failslow.agents.autoload import arm, enabled

        if enabled():
            arm()
    except Exception:  # noqa: BLE001 - a program must start whatever happens here
        pass


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    saved = list(sys.path)
    module = sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001
        pass
    finally:
        sys.path[:] = saved
        if module is not None:
            sys.modules["sitecustomize"] = module


_arm()
_chain()
