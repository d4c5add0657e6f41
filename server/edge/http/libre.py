"""LibreTranslate's API, as libretranslatepy, its browser extensions and the apps built on it call it.

    POST /translate     q (string or list), source (code or "auto"), target, format text|html,
                        alternatives, api_key (JSON or form body)
    GET|POST /languages [{"code", "name", "targets"}] (a body, as libretranslatepy sends with GET, is read
                        and its limits apply; the list needs no key, as LibreTranslate's does not)
    POST /detect        q -> [{"language", "confidence" (0-100)}], most likely first
    GET /frontend/settings  what LibreTranslate's web frontends read first: charLimit, keyRequired...
    POST /suggest       refused as LibreTranslate refuses it with suggestions off: 403

Errors are LibreTranslate's: `{"error": message}` with 400 (bad request), 403 (missing or invalid
api_key, or a model the key may not use), 413, 429 (rate limit; Retry-After), 500, 503.
With `source=auto` the response carries `detectedLanguage` ({"language", "confidence"}; a
list of them for a list of texts), as LibreTranslate's does.
"""
from __future__ import annotations

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.files import extensions
from server.edge.gateway import CallFailed
from server.edge.http.body import BadParam, BodyError, Params
from server.edge.http.context import Edge, http_status, retry_headers, language_name
from server.edge.http.translate import Ask, translate

API = "libretranslate"
FRONTEND_TIMEOUT_MS = 500  # LibreTranslate's default: how long its frontend waits after typing before it translates


def error(status: int, message: str, headers=None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def failed(e: CallFailed) -> JSONResponse:
    if e.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return error(403, f"Invalid API key: {e.message}")
    headers = retry_headers(e)
    return error(http_status(e.code), e.message, headers)


class LibreTranslateApi:
    def __init__(self, edge: Edge):
        self.edge = edge

    def routes(self) -> list[Route]:
        return [Route("/translate", self.translate, methods=["POST"]),
                Route("/languages", self.languages, methods=["GET", "POST"]),
                Route("/detect", self.detect, methods=["POST"]),
                Route("/frontend/settings", self.frontend_settings, methods=["GET"]),
                Route("/suggest", self.suggest, methods=["POST"])]

    async def _params(self, request: Request) -> Params:
        return await Params.of(request, self.edge.max_body_bytes, self.edge.body_timeout_s)

    async def translate(self, request: Request) -> Response:
        try:
            params = await self._params(request)
            ask, many = self._ask(params)
        except BodyError as e:
            return self.edge.count(API, "translate", error(e.status, e.message))
        except BadParam as e:
            return self.edge.count(API, "translate", error(400, str(e)))
        caller = self.edge.caller(request, params.text("api_key") or None)
        try:
            results = await translate(self.edge, ask, caller)
        except CallFailed as e:
            return self.edge.count(API, "translate", failed(e))
        body: dict = {"translatedText": [r.text for r in results] if many else results[0].text}
        if not ask.source:
            found = [{"confidence": round(100 * (r.confidence or 0.0), 1), "language": r.source} for r in results]
            body["detectedLanguage"] = found if many else found[0]
        if ask.alternatives:
            alternatives = [r.alternatives for r in results]
            body["alternatives"] = alternatives if many else alternatives[0]
        return self.edge.count(API, "translate", JSONResponse(body, headers={"x-request-id": caller.request_id}))

    def _ask(self, params: Params) -> tuple[Ask, bool]:
        if not params.has("q"):
            raise BadParam("Invalid request: missing q parameter")
        # A JSON list is a list of texts; a form or query field is always a list of its values, and a
        # single one is LibreTranslate's single q.
        q = params.fields.get("q")
        many = isinstance(q, list) and (params.json_body or len(q) > 1)
        texts = params.texts("q") if many else [params.text("q")]
        source, target = params.text("source"), params.text("target")
        if not source:
            raise BadParam("Invalid request: missing source parameter")
        if not target:
            raise BadParam("Invalid request: missing target parameter")
        kind = (params.text("format") or "text").lower()
        if kind not in ("text", "html"):
            raise BadParam(f"Invalid request: format must be text or html (got {kind!r})")
        # The translation and its alternatives are one request's hypotheses: at most --max-hypotheses together.
        most = self.edge.admission.most_hypotheses() - 1
        alternatives = params.number("alternatives", 0, 0, most)
        source = "" if source.lower() == "auto" else source.lower()
        return Ask(texts=texts, source=source, target=target.lower(), html=kind == "html",
                   alternatives=alternatives), many

    async def languages(self, request: Request) -> Response:
        try:
            await self._params(request)  # libretranslatepy sends its api_key as a form body, with GET
        except BodyError as e:
            return self.edge.count(API, "languages", error(e.status, e.message))
        body = [{"code": source, "name": language_name(source), "targets": self.edge.admission.targets(source)}
                for source in self.edge.admission.sources()]
        return self.edge.count(API, "languages", JSONResponse(body))

    async def detect(self, request: Request) -> Response:
        try:
            params = await self._params(request)
            text = params.text("q")
            if text is None:
                raise BadParam("Invalid request: missing q parameter")
        except BodyError as e:
            return self.edge.count(API, "detect", error(e.status, e.message))
        except BadParam as e:
            return self.edge.count(API, "detect", error(400, str(e)))
        if self.edge.key_id(params.text("api_key")) is None:
            return self.edge.count(API, "detect", error(403, "Invalid API key"))
        (found,) = await self.edge.admission.detect([text])
        body = [{"confidence": round(100 * p, 1), "language": lang} for lang, p in found.ranked[:3] if p > 0.0005]
        return self.edge.count(API, "detect", JSONResponse(body or [{"confidence": 0.0, "language": found.language}]))

    async def frontend_settings(self, request: Request) -> Response:
        """LibreTranslate's /frontend/settings, with this server's values: charLimit is the per-text limit,
        no file translation, no suggestions; the frontend's source is auto-detection, its target the
        first served one."""
        targets = self.edge.admission.targets()
        target = targets[0] if targets else ""
        keyed = self.edge.keys is not None
        body = {"charLimit": self.edge.admission.limits.max_text_chars, "frontendTimeout": FRONTEND_TIMEOUT_MS,
                "apiKeys": keyed, "keyRequired": keyed, "suggestions": False, "filesTranslation": True,
                "supportedFilesFormat": extensions(),
                "language": {"source": {"code": "auto", "name": "Auto Detect"},
                             "target": {"code": target, "name": language_name(target) if target else ""}}}
        return self.edge.count(API, "frontend_settings", JSONResponse(body))

    async def suggest(self, request: Request) -> Response:
        """Suggestions are off here: LibreTranslate answers 403 before it looks at any parameter. The body
        is read (within its limits) only so that the connection stays usable."""
        try:
            await self._params(request)
        except BodyError as e:
            return self.edge.count(API, "suggest", error(e.status, e.message))
        return self.edge.count(API, "suggest", error(403, "Suggestions are disabled on this server."))
