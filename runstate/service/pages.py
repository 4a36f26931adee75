"""The audit pages of ``runstate serve`` under ``/ui``: static files shipped in the wheel
(``runstate/service/static``), no CDN and no build step, reading the JSON API as any client
does (so tokens, forwarding to a partition's owner and errors are the API's own)."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

STATIC = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png"}
#: The pages run only their own script; a value shown as text cannot become code either way.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def mount_pages(api: FastAPI) -> None:
    """``/ui`` (runs), ``/ui/runs/{id}`` (one run), ``/ui/deadletters``: one page shell whose
    script routes by path; ``/ui/static/{name}`` its files; ``/`` redirects to ``/ui``."""
    assets = {p.name: (p.read_bytes(), _TYPES[p.suffix]) for p in STATIC.iterdir() if p.suffix in _TYPES}
    shell = (STATIC / "index.html").read_bytes()

    @api.get("/ui/static/{name}", include_in_schema=False)
    async def asset(name: str) -> Response:
        got = assets.get(name)
        if got is None:
            return Response(b"not found", 404, media_type="text/plain")
        return Response(got[0], media_type=got[1], headers=_HEADERS)

    @api.get("/", include_in_schema=False)
    async def home() -> Response:
        """The address ``runstate serve`` prints, opened in a browser: the runs list."""
        return RedirectResponse("/ui", 307)

    @api.get("/ui", include_in_schema=False)
    @api.get("/ui/{rest:path}", include_in_schema=False)
    async def page(rest: str = "") -> Response:
        return Response(shell, media_type="text/html; charset=utf-8", headers=_HEADERS)
