"""Lists for people and scripts: a time range (RFC 3339), a limit, and a cursor to the next page.

A list endpoint takes ``since``, ``until``, ``limit`` (default 1000, at most 10,000) and
``after`` (a cursor), and still answers a JSON array, as API v1 says; when more rows follow, the
response carries ``X-Next-Cursor: <cursor>`` and a ``Link: <...&after=<cursor>>; rel="next"``
header (RFC 8288), so that a client reads page after page until neither is present.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, TypeVar
from urllib.parse import urlencode

from fastapi import Depends, Query, Request, Response

T = TypeVar("T")
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000


@dataclass(frozen=True, slots=True)
class Page:
    since_ns: int | None = None
    until_ns: int | None = None
    after: str | None = None
    limit: int = DEFAULT_LIMIT


def _ns(t: datetime | None) -> int | None:
    """Nanoseconds since the epoch, within what a 64-bit column holds (years 1678-2262)."""
    return None if t is None else max(-(2**63) + 1, min(2**63 - 1, int(t.timestamp() * 1e9)))


def page_params(
    since: Annotated[datetime | None, Query(description="RFC 3339: from this time on")] = None,
    until: Annotated[datetime | None, Query(description="RFC 3339: up to this time")] = None,
    after: Annotated[
        str | None, Query(max_length=80, description="The cursor of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Rows per page")] = DEFAULT_LIMIT,
) -> Page:
    return Page(_ns(since), _ns(until), after, limit)


PageDep = Annotated[Page, Depends(page_params)]


def one_page(rows: list[T], page: Page, cursor_of: Callable[[T], str], request: Request,
             response: Response) -> list[T]:  # fmt: skip
    """``rows`` (the query gave at most ``limit + 1``) cut to the page; when another page
    follows, the cursor of the page's last row (``cursor_of``) goes in the headers."""
    if len(rows) <= page.limit:
        return rows
    rows = rows[: page.limit]
    cursor = cursor_of(rows[-1])
    params = {k: v for k, v in request.query_params.items() if k != "after"}
    params["after"] = cursor
    url = request.url.replace(query=urlencode(params))
    response.headers["X-Next-Cursor"] = cursor
    response.headers["Link"] = f'<{url}>; rel="next"'
    return rows
