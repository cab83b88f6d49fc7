"""Bearer-token authentication by role. Tokens are compared as SHA-256 hashes only."""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum

from fastapi import Request

from failslow.service.errors import Forbidden, Unauthorized
from failslow.service.settings import AuthSettings


class Role(StrEnum):
    INGEST = "ingest"
    READ = "read"
    OPERATOR = "operator"


def _digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def _matches(digest: str, hashes: list[str]) -> bool:
    found = False
    for h in hashes:  # no early exit: constant work per configured token
        found |= hmac.compare_digest(digest, h)
    return found


def roles_of(token: str, auth: AuthSettings) -> set[Role]:
    digest = _digest(token)
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
