"""The HTTP client of the operator commands: contexts (a URL and a token each), requests, and
errors as one line that says what to do.

Where the service and token come from, first found wins: ``--url``/``--token``; the
environment's ``FAILSLOW_URL``/``FAILSLOW_TOKEN``; the context named by ``--context`` or
``FAILSLOW_CONTEXT``, else the file's current context; else http://127.0.0.1:8000 without a
token. Contexts live in ``$FAILSLOW_CLIENT_CONFIG`` or ``~/.config/failslow/client.json``
(mode 0600: it holds tokens).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"


class ClientError(SystemExit):
    """A failure the user can act on: printed as one line, exit status 1."""

    def __init__(self, message: str) -> None:
        super().__init__(f"failslow: {message}")


def config_path() -> Path:
    env = os.environ.get("FAILSLOW_CLIENT_CONFIG")
    return Path(env) if env else Path.home() / ".config" / "failslow" / "client.json"


def load_config() -> dict[str, Any]:
    path = config_path()
    if not path.exists():
        return {"current": None, "contexts": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ClientError(f"cannot read {path} ({exc}); fix or remove it") from None
    data.setdefault("contexts", {})
    data.setdefault("current", None)
    return data  # type: ignore[no-any-return]


def save_config(data: dict[str, Any]) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.chmod(0o600)
    tmp.replace(path)
    return path


@dataclass(frozen=True)
class Target:
    url: str
    token: str | None
    context: str | None


def resolve_target(url: str | None, token: str | None, context: str | None) -> Target:
    cfg = load_config()
    name = context or os.environ.get("FAILSLOW_CONTEXT") or cfg.get("current")
    ctx: dict[str, Any] = {}
    if name:
        if name not in cfg["contexts"]:
            known = ", ".join(sorted(cfg["contexts"])) or "none yet"
            raise ClientError(
                f"no context {name!r} (known: {known}); add it with "
                f"`failslow context set {name} --url URL [--token TOKEN]`"
            )
        ctx = cfg["contexts"][name]
    return Target(
        url=(url or os.environ.get("FAILSLOW_URL") or ctx.get("url") or DEFAULT_URL).rstrip("/"),
        token=token or os.environ.get("FAILSLOW_TOKEN") or ctx.get("token"),
        context=name,
    )


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return resp.text.strip()[:200] or resp.reason_phrase
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("title") or body)
    return str(body)


def client_of(args: Any) -> Client:
    """The client the connection flags of a command (``--url``, ``--token``, ``--context``) name."""
    return Client(resolve_target(args.url, args.token, args.context))


class Client:
    def __init__(self, target: Target, *, timeout_s: float = 30.0) -> None:
        self.target = target
        self.headers = {"Authorization": f"Bearer {target.token}"} if target.token else {}
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        return self.respond(method, path, **kwargs)[0]

    def listing(self, path: str, *, most: int | None = None, **params: Any) -> list[Any]:
        """Every row of a paged list (``X-Next-Cursor``), or the first ``most``."""
        rows: list[Any] = []
        query = {k: v for k, v in params.items() if v is not None}
        while True:
            page, headers = self.respond("GET", path, params=query)
            rows += page
            cursor = headers.get("x-next-cursor")
            if not cursor or (most is not None and len(rows) >= most):
                return rows[:most] if most is not None else rows
            query["after"] = cursor

    def respond(self, method: str, path: str, **kwargs: Any) -> tuple[Any, httpx.Headers]:
        try:  # a connection per request: a command makes a few, and leaves nothing open
            with httpx.Client(
                base_url=self.target.url, headers=self.headers, timeout=self.timeout_s
            ) as http:
                resp = http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise ClientError(
                f"cannot reach the service at {self.target.url} (is it running? point at it with "
                "--url, FAILSLOW_URL or `failslow context use NAME`)"
            ) from None
        except httpx.TimeoutException:
            raise ClientError(f"{self.target.url} did not answer within the timeout") from None
        except httpx.HTTPError as exc:
            raise ClientError(f"request to {self.target.url}{path} failed: {exc}") from None
        if resp.status_code == 401:
            raise ClientError(
                "the service wants a token: pass --token, set FAILSLOW_TOKEN or add it to the "
                f"context ({_detail(resp)})"
            )
        if resp.status_code == 403:
            raise ClientError(
                f"this token may not do that: {_detail(resp)} (changes need an operator token)"
            )
        if resp.status_code >= 400:
            raise ClientError(f"{_detail(resp)} (HTTP {resp.status_code})")
        if not resp.content:
            return None, resp.headers
        if "json" in resp.headers.get("content-type", ""):
            return resp.json(), resp.headers
        return resp.text, resp.headers

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, json=body)


DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``2h``, ``1d``, ``1.5h`` -> seconds (ValueError otherwise)."""
    m = DURATION.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a duration (like 90s, 15m, 2h, 1d)")
    return float(m.group(1)) * UNIT_S[m.group(2) or "s"]
