"""The effective configuration and where each value came from (``GET /v1/config``)."""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel
from sqlalchemy.engine import make_url

from failslow.service.control.schemas import ConfigValue
from failslow.service.detection.settings import TUNABLE

SECRET_WORDS = ("token", "scopes", "names", "password", "secret")


def _shown(key: str, value: Any) -> Any:
    if any(w in key for w in SECRET_WORDS):
        return (
            f"<{len(value)} set>" if isinstance(value, list | dict) else "<set>" if value else value
        )
    if key in ("database_url", "bus.url") and isinstance(value, str) and value:
        try:
            return make_url(value).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - a NATS URL is not SQLAlchemy's: hide what follows '@'
            return (
                value.split("://")[0] + "://***@" + value.split("@")[-1] if "@" in value else value
            )
    return value


def _walk(model: BaseModel, prefix: str, env: str) -> list[tuple[str, str, Any, bool]]:
    out = []
    for name in type(model).model_fields:
        value = getattr(model, name)
        key, var = f"{prefix}{name}", f"{env}{name.upper()}"
        if isinstance(value, BaseModel):
            out += _walk(value, f"{key}.", f"{var}__")
        else:
            out.append((key, var, value, name in model.model_fields_set))
    return out


def effective(
    settings: BaseModel, fleet: dict[str, float], own: dict[str, float] | None
) -> list[ConfigValue]:
    """Every setting with its value now: the default, the environment's, a flag's, then the
    fleet's run-time override, then the job's (``own``; None: the fleet view)."""
    rows = []
    for key, var, value, was_set in _walk(settings, "", "FAILSLOW_"):
        source = "environment" if var in os.environ else "argument" if was_set else "default"
        section, _, name = key.partition(".")
        tunable = section == "detection" and name in TUNABLE
        if tunable and name in fleet:
            value, source = fleet[name], "fleet"
        if tunable and own is not None and name in own:
            value, source = own[name], "job"
        rows.append(
            ConfigValue(key=key, value=_shown(key, value), source=source, env=var, tunable=tunable)
        )
    return rows


def tunable_key(key: str) -> str:
    """``detection.compute_ratio`` or ``compute_ratio`` -> ``compute_ratio``; ValueError
    naming the settable keys otherwise."""
    name = key.removeprefix("detection.")
    if name not in TUNABLE:
        settable = ", ".join(f"detection.{k}" for k in TUNABLE)
        raise ValueError(f"{key!r} cannot be set at run time; these can: {settable}")
    return name
