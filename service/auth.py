"""Bearer-token authentication by role. Tokens are compared as SHA-256 hashes only.

An ingest token may be scoped to job-id patterns (``ingest_scopes``): it may then send and act
only for jobs whose id matches one (403 otherwise). With ``tokens_file`` the tokens are read
from a JSON file, again whenever it changes (checked at most once a second): rotating a token
needs no restart.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import logging
import threading
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from fastapi import Request
from pydantic import BaseModel, Field, PrivateAttr, ValidationError, field_validator
from pydantic_settings import NoDecode

from failslow.service.errors import Forbidden, Unauthorized

log = logging.getLogger(__name__)
RELOAD_EVERY_S = 1.0


class Role(StrEnum):
    INGEST = "ingest"
    READ = "read"
    OPERATOR = "operator"


def hash_token(token: str) -> str:
    """The stored form of a bearer token: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def _normalise_token_list(value: object) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str) and value.lstrip().startswith("["):
        try:  # a JSON list, as the other list settings take (it was one token '["a"]')
            value = json.loads(value)
        except ValueError:
            raise ValueError("a token list is comma-separated or a JSON list of strings") from None
    items = value.split(",") if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    out: list[str] = []
    for raw in items:
        item = str(raw).strip()
        if not item:
            continue
        # Accept plaintext for convenience, keep only its hash in memory.
        out.append(item if item.startswith("sha256:") else hash_token(item))
    return out


TokenList = Annotated[list[str], NoDecode]


class AuthSettings(BaseModel):
    """Bearer tokens per role. Values are ``sha256:<hex>`` hashes (or plaintext, hashed on load)."""

    ingest_tokens: TokenList = Field(
        default_factory=list,
        description="Tokens that may POST /v1/ingest (agents). Comma-separated in the environment.",
    )
    read_tokens: TokenList = Field(
        default_factory=list, description="Tokens that may read /v1/jobs, incidents and actions."
    )
    operator_tokens: TokenList = Field(
        default_factory=list,
        description="Tokens that may approve/reject actions and flush jobs; they can also read.",
    )
    ingest_scopes: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Ingest tokens limited to job-id patterns (fnmatch), as JSON: "
        '{"<token or sha256:hash>": ["team-a-*"]}. Such a token is an ingest token.',
    )
    tokens_file: str | None = Field(
        default=None,
        description="A JSON file with any of ingest_tokens, read_tokens, operator_tokens and "
        "ingest_scopes; it replaces them and is read again whenever it changes.",
    )
    token_names: dict[str, str] = Field(
        default_factory=dict,
        description="Who holds each token, as JSON: {\"<token or sha256:hash>\": \"alice\"}: "
        "the actor recorded for every change made with it (unnamed tokens are recorded as "
        "token:<first 12 hex digits of the hash>).",
    )
    metrics_public: bool = Field(
        default=True, description="Serve /metrics without a token (Prometheus scrapes it)."
    )
    _file: tuple[float, float, AuthSettings | None] = PrivateAttr(default=(0.0, -1.0, None))
    _file_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    @field_validator("ingest_tokens", "read_tokens", "operator_tokens", mode="before")
    @classmethod
    def _tokens(cls, value: object) -> list[str]:
        return _normalise_token_list(value)

    @field_validator("ingest_scopes", mode="after")
    @classmethod
    def _scopes(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return {_normalise_token_list([k])[0]: list(v) for k, v in value.items() if k.strip()}

    @field_validator("token_names", mode="after")
    @classmethod
    def _names(cls, value: dict[str, str]) -> dict[str, str]:
        return {_normalise_token_list([k])[0]: v for k, v in value.items() if k.strip()}

    @property
    def enabled(self) -> bool:
        a = self.effective()
        return bool(a.ingest_tokens or a.ingest_scopes or a.read_tokens or a.operator_tokens)

    def effective(self) -> AuthSettings:
        """These settings, or those of ``tokens_file`` as it reads now (the last good reading
        when it is being rewritten or broken)."""
        if self.tokens_file is None:
            return self
        checked, mtime, loaded = self._file
        now = time.monotonic()
        if loaded is not None and now - checked < RELOAD_EVERY_S:
            return loaded
        with self._file_lock:
            path = Path(self.tokens_file)
            try:
                current = path.stat().st_mtime
                if loaded is None or current != mtime:
                    raw: dict[str, Any] = json.loads(path.read_text())
                    keep = {"metrics_public": self.metrics_public}
                    loaded = AuthSettings.model_validate({**raw, **keep})
                    mtime = current
                    log.info("tokens read from %s", path)
            except (OSError, ValueError, ValidationError) as exc:
                if loaded is None:  # no good reading yet: nobody gets in (fail closed)
                    loaded = AuthSettings(read_tokens=["sha256:" + "0" * 64])
                log.error("cannot read tokens from %s (%s); keeping the last good ones", path, exc)
            self._file = (now, mtime, loaded)
            return loaded


def _matches(digest: str, hashes: list[str]) -> bool:
    found = False
    for h in hashes:  # no early exit: constant work per configured token
        found |= hmac.compare_digest(digest, h)
    return found


def roles_of(token: str, auth: AuthSettings) -> set[Role]:
    digest = hash_token(token)
    roles: set[Role] = set()
    if _matches(digest, auth.ingest_tokens) or _matches(digest, list(auth.ingest_scopes)):
        roles.add(Role.INGEST)
    if _matches(digest, auth.read_tokens):
        roles.add(Role.READ)
    if _matches(digest, auth.operator_tokens):
        roles |= {Role.OPERATOR, Role.READ}
    return roles


def authorize(header: str, auth: AuthSettings, role: Role) -> list[str] | None:
    """Raise 401/403 unless auth is off or the ``Authorization`` header value carries a token
    with ``role``; the job patterns of a scoped ingest token (None: any job, see
    :func:`allow`)."""
    auth = auth.effective()
    if not auth.enabled:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    roles = roles_of(token.strip(), auth)
    if not roles:
        raise Unauthorized("unknown token", headers={"WWW-Authenticate": "Bearer"})
    if role not in roles:
        raise Forbidden(f"this token lacks the {role.value!r} role")
    if role == Role.INGEST and Role.OPERATOR not in roles:
        return auth.ingest_scopes.get(hash_token(token.strip()))
    return None


def check(request: Request, auth: AuthSettings, role: Role) -> None:
    """:func:`authorize` for a request. A scoped ingest token leaves its patterns in
    ``request.state.job_scope`` (see :func:`allow_job`); a job in the path is checked here."""
    scope = authorize(request.headers.get("authorization", ""), auth, role)
    if scope is not None:
        request.state.job_scope = scope
        job = request.path_params.get("job")
        if job is not None:
            allow(scope, job)


def actor_of(header: str, auth: AuthSettings, client: str | None) -> str:
    """Who makes a change: the name of the request's token (``token_names``), else
    ``token:<12 hex digits of its hash>``; without authentication ``local:<client address>``.
    Never what the request body claims."""
    auth = auth.effective()
    scheme, _, token = header.partition(" ")
    if not auth.enabled or scheme.lower() != "bearer" or not token.strip():
        return f"local:{client or 'unknown'}"
    digest = hash_token(token.strip())
    for h, name in auth.token_names.items():
        if hmac.compare_digest(h, digest):
            return name
    return "token:" + digest.removeprefix("sha256:")[:12]


class OutOfScope(Forbidden):
    """The token is scoped to other jobs."""


def allow(scope: list[str] | None, job: str) -> None:
    """403 unless a token with job patterns ``scope`` may act for ``job`` (None: any job)."""
    if scope is not None and not any(fnmatch.fnmatchcase(job, p) for p in scope):
        raise OutOfScope(f"this token may not act for job {job!r}")


def tenant_of(auth: AuthSettings, job: str) -> str | None:
    """The tenant ``job`` belongs to: the patterns of the first scoped ingest token (in the
    order of their hashes) that may send for it, joined by commas; None when no scope names it.
    The job registry gives each tenant a share of its bounds (stream/registry.py)."""
    scopes = auth.effective().ingest_scopes
    for key in sorted(scopes):
        if any(fnmatch.fnmatchcase(job, p) for p in scopes[key]):
            return ",".join(scopes[key])
    return None


def job_scope(request: Request) -> list[str] | None:
    """The job patterns :func:`check` left for the request's token (None: any job)."""
    return request.scope.get("state", {}).get("job_scope")


def allow_job(request: Request, job: str) -> None:
    """403 unless the request's token may act for ``job`` (tokens without a scope may)."""
    allow(job_scope(request), job)
