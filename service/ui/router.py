"""``/ui``: the status page. The page itself holds no data; it calls the API with the token the
operator enters (kept in the browser's localStorage)."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["ui"])
_PAGE = resources.files("failslow.service.ui").joinpath("index.html").read_text(encoding="utf-8")


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def page() -> HTMLResponse:
    return HTMLResponse(_PAGE, headers={"Cache-Control": "no-cache"})
