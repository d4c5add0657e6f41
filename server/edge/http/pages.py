"""The translator page (`/`) and the status page (`/status`): static files served by the server itself.

After `make serve` the first thing many people do is open the server's address in a browser;
LibreTranslate's users, whose API this server speaks, expect a translator there. The pages are
plain HTML, CSS and JavaScript modules in server/edge/http/web/, read once at start-up and served from
memory with an ETag. They add no power of their own: every translation, file, glossary and status
they show comes from the API's endpoints (/v1/translate:stream, /v1/files, /v3/glossaries,
/v1/status, ...), called with the key the person typed, behind the same checks as any client.
The static files themselves carry nothing secret, so they need no key (as LibreTranslate's page).

Everything the pages load comes from this server: the Content-Security-Policy below allows scripts,
styles, images and connections from the page's own origin only, and no inline script or style, so
text that reaches the page (a translation, a file name, an error message) can never run as code;
the scripts insert such text with textContent, never as HTML.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from server.edge.http.context import Edge
from server.edge.http.native import error_response

API = "web"
WEB_DIR = Path(__file__).with_name("web")
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# Own origin only; no inline script or style ('unsafe-inline' nowhere), no eval, no plugins, no framing.
# img-src allows data: for nothing but the canvas's own exports; blob: lets a translated file be saved.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "X-Frame-Options": "DENY", "Cache-Control": "no-cache"}  # no-cache: revalidate (ETag) on every load


@dataclass(frozen=True)
class Page:
    body: bytes
    media_type: str
    etag: str


def load(directory: Path = WEB_DIR) -> dict[str, Page]:
    """Every file of the pages' folder by name; a file of an unknown kind is a packaging error."""
    pages = {}
    for path in sorted(directory.iterdir()):
        if path.is_file():
            body = path.read_bytes()
            media_type = MEDIA_TYPES.get(path.suffix)
            if media_type is None:
                raise RuntimeError(f"{path}: no media type for a {path.suffix!r} file in the web pages")
            pages[path.name] = Page(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return pages


class WebPages:
    def __init__(self, edge: Edge):
        self.edge = edge
        self.pages = load()

    def routes(self) -> list[Route]:
        return [Route("/", self.translator, methods=["GET", "HEAD"]),
                Route("/status", self.status, methods=["GET", "HEAD"]),
                Route("/favicon.ico", self.icon, methods=["GET", "HEAD"]),
                Route("/web/{name}", self.asset, methods=["GET", "HEAD"])]

    async def translator(self, request: Request) -> Response:
        return self._send(request, "index.html")

    async def status(self, request: Request) -> Response:
        return self._send(request, "status.html")

    async def icon(self, request: Request) -> Response:
        return self._send(request, "icon.svg")

    async def asset(self, request: Request) -> Response:
        return self._send(request, request.path_params["name"])

    def _send(self, request: Request, name: str) -> Response:
        page = self.pages.get(name)  # only the folder's own files: no path reaches the file system
        if page is None:
            return self.edge.count(API, "asset", error_response(404, "NOT_FOUND", f"no page {name!r}"))
        headers = {**HEADERS, "ETag": page.etag}
        if request.headers.get("if-none-match") == page.etag:
            return self.edge.count(API, "page", Response(status_code=304, headers=headers))
        body = b"" if request.method == "HEAD" else page.body
        response = Response(body, media_type=page.media_type, headers=headers)
        if request.method == "HEAD":
            response.headers["content-length"] = str(len(page.body))
        return self.edge.count(API, "page", response)
