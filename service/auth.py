"""Bearer-token authentication by role. Tokens are compared as SHA-256 hashes only."""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from typing import Annotated

from fastapi import Request
from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode

from failslow.service.errors import Forbidden, Unauthorized


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
    metrics_public: bool = Field(
        default=True, description="Serve /metrics without a token (Prometheus scrapes it)."
    )

    @field_validator("ingest_tokens", "read_tokens", "operator_tokens", mode="before")
    @classmethod
    def _tokens(cls, value: object) -> list[str]:
        return _normalise_token_list(value)

    @property
    def enabled(self) -> bool:
        return bool(self.ingest_tokens or self.read_tokens or self.operator_tokens)


def _matches(digest: str, hashes: list[str]) -> bool:
    found = False
    for h in hashes:  # no early exit: constant work per configured token
        found |= hmac.compare_digest(digest, h)
    return found


def roles_of(token: str, auth: AuthSettings) -> set[Role]:
    digest = hash_token(token)
    roles: set[Role] = set()
    if _matches(digest, auth.ingest_tokens):
        roles.add(Role.INGEST)
    if _matches(digest, auth.read_tokens):
        roles.add(Role.READ)
    if _matches(digest, auth.operator_tokens):
        roles |= {Role.OPERATOR, Role.READ}
    return roles


def check(request: Request, auth: AuthSettings, role: Role) -> None:
    """Raise 401/403 unless auth is off or the request carries a token with ``role``."""
    if not auth.enabled:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    roles = roles_of(token.strip(), auth)
    if not roles:
        raise Unauthorized("unknown token", headers={"WWW-Authenticate": "Bearer"})
    if role not in roles:
        raise Forbidden(f"this token lacks the {role.value!r} role")
