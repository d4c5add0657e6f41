"""The translator page (`/`) and the status page (`/status`): static files served by the server itself.

After `make serve` the first thing many people do is open the server's address in a browser;
LibreTranslate's users, whose API this server speaks, expect a translator there. The pages are
plain HTML, CSS and JavaScript modules in server/edge/http/web/, read once at start-up and served from
memory with an ETag. The two pages share their frame (web/frame.html: the head, the header with the
page links, the API-key form), so each page's file holds only its own <main>; the frame's four slots
are filled here at start-up, once. They add no power of their own: every translation, file, glossary and status
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
from typing import Optional

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


@dataclass(frozen=True)
class PageSpec:
    path: str  # where it is served
    title: str  # the tab's title and the page's heading
    link: str  # its name in the header's links
    name: str  # web/<name>.html its <main>, web/<name>.js its script


PAGES = (PageSpec("/", "Translate", "Translator", "translator"), PageSpec("/status", "Status", "Status", "status"))
LINKS = (("/openapi.json", "API"),)  # after the pages in the header


def _page(body: bytes, media_type: str) -> Page:
    return Page(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')


def compose(frame: str, spec: PageSpec, main: str) -> str:
    """A whole page: the shared frame with its title, script, links (this page's marked current) and body."""
    nav = "\n".join(f'    <a href="{p.path}"' + (' aria-current="page"' if p is spec else "") + f">{p.link}</a>"
                     for p in PAGES)
    nav += "".join(f'\n    <a href="{href}">{label}</a>' for href, label in LINKS)
    return frame.replace("@TITLE@", spec.title).replace("@SCRIPT@", f"{spec.name}.js") \
        .replace("@NAV@", nav).replace("@BODY@", main)


def load(directory: Path = WEB_DIR) -> tuple[dict[str, Page], dict[str, Page]]:
    """(the pages by path, the assets by file name). The HTML files are parts of pages and no asset of
    their own; a file of an unknown kind is a packaging error."""
    assets, parts = {}, {}
    for path in sorted(directory.iterdir()):
        if not path.is_file():
            continue
        if path.suffix == ".html":
            parts[path.stem] = path.read_text(encoding="utf-8")
            continue
        media_type = MEDIA_TYPES.get(path.suffix)
        if media_type is None:
            raise RuntimeError(f"{path}: no media type for a {path.suffix!r} file in the web pages")
        assets[path.name] = _page(path.read_bytes(), media_type)
    pages = {spec.path: _page(compose(parts["frame"], spec, parts[spec.name]).encode(), MEDIA_TYPES[".html"])
             for spec in PAGES}
    return pages, assets


class WebPages:
    def __init__(self, edge: Edge):
        self.edge = edge
        self.pages, self.assets = load()

    def routes(self) -> list[Route]:
        return [*(Route(spec.path, self._page(spec.path), methods=["GET", "HEAD"]) for spec in PAGES),
                Route("/favicon.ico", self.icon, methods=["GET", "HEAD"]),
                Route("/web/{name}", self.asset, methods=["GET", "HEAD"])]

    def _page(self, path: str):
        async def page(request: Request) -> Response:
            return self._send(request, self.pages[path], path)
        return page

    async def icon(self, request: Request) -> Response:
        return self._send(request, self.assets.get("icon.svg"), "icon.svg")

    async def asset(self, request: Request) -> Response:
        name = request.path_params["name"]
        return self._send(request, self.assets.get(name), name)  # only the folder's own files: no path reaches the disk

    def _send(self, request: Request, page: Optional[Page], name: str) -> Response:
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
