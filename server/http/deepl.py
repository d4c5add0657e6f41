"""DeepL API v2, as its clients call it: the official `deepl` library, Weblate, Mastodon, browser add-ons.

    POST /v2/translate          text[], target_lang, source_lang?, split_sentences, tag_handling,
                                preserve_formatting, formality (JSON or form body)
    GET|POST /v2/languages      ?type=source|target
    GET|POST /v2/usage          characters translated with the caller's key

Keys: `Authorization: DeepL-Auth-Key KEY` is the server's API key (--api-keys-file); `Bearer`
works too. Language codes are DeepL's (upper case; EN-GB/EN-US and PT-BR/PT-PT as targets map
onto the model's `en`/`pt`). Errors are DeepL's: `{"message": ...}` with 400 (bad request),
403 (missing or invalid key, or a model the key may not use), 404, 413 (body too large), 429
(rate limit or a full queue; Retry-After when the limit says when), 456 (the key's character
quota), 5xx. What a model cannot do is refused the way DeepL refuses it: `formality` more/less
is a 400 for a target without formality (prefer_more/prefer_less fall back silently, as DeepL's do).
"""
from __future__ import annotations

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protos.nmt.v1 import translator_pb2 as pb
from server.gateway import CallFailed
from server.http.body import BadParam, BodyError, Params
from server.http.edge import Edge, http_status, retry_headers, language_name
from server.http.translate import Ask, translate
from server.security.usage import QUOTA_REASON

API = "deepl"
SPLIT = {"0": pb.SPLIT_SENTENCES_OFF, "1": pb.SPLIT_SENTENCES_ON, "nonewlines": pb.SPLIT_SENTENCES_NEWLINES}
FORMALITY = ("default", "more", "less", "prefer_more", "prefer_less")
# Accepted and without effect here: what DeepL uses to tune its own models or its XML parsing.
IGNORED = {"show_billed_characters", "model_type", "outline_detection", "non_splitting_tags", "splitting_tags",
           "ignore_tags", "tag_handling_version", "context", "preserve_formatting", "auth_key", "formality",
           "text", "source_lang", "target_lang", "split_sentences", "tag_handling"}
UNSUPPORTED = {"glossary_id": "glossaries", "style_id": "style rules", "custom_instructions": "custom instructions",
               "translation_memory_id": "translation memories"}


def error(status: int, message: str, headers=None) -> JSONResponse:
    return JSONResponse({"message": message}, status_code=status, headers=headers)


def failed(e: CallFailed) -> JSONResponse:
    if e.code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return error(403, f"Authorization failure: {e.message}")
    if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.message.startswith(QUOTA_REASON):
        return error(456, f"Quota exceeded: {e.message}")
    headers = retry_headers(e)
    return error(http_status(e.code), e.message, headers)


def from_deepl(code: str) -> str:
    """DeepL's language code -> the served one (EN-GB -> en, PT-BR -> pt, ZH-HANS -> zh)."""
    return code.strip().split("-")[0].lower()


class DeepLApi:
    def __init__(self, edge: Edge):
        self.edge = edge

    def routes(self) -> list[Route]:
        return [Route("/v2/translate", self.translate, methods=["POST"]),
                Route("/v2/languages", self.languages, methods=["GET", "POST"]),
                Route("/v2/usage", self.usage, methods=["GET", "POST"])]

    def _key(self, request: Request, params: Params) -> str | None:
        scheme, _, value = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() in ("deepl-auth-key", "bearer") and value.strip():
            return value.strip()
        return params.text("auth_key") or None

    async def _params(self, request: Request) -> Params:
        return await Params.of(request, self.edge.max_body_bytes, self.edge.body_timeout_s)

    def _authorized(self, request: Request, params: Params) -> tuple[str | None, JSONResponse | None]:
        """(key id, None) or (None, the 403): endpoints that run no RPC check the key here."""
        key = self._key(request, params)
        key_id = self.edge.key_id(key)
        if key_id is None:
            return None, error(403, "Authorization failure: " + ("invalid API key" if key else "missing API key: "
                                                                 "send 'Authorization: DeepL-Auth-Key KEY'"))
        return key_id, None

    async def translate(self, request: Request) -> Response:
        try:
            params = await self._params(request)
            ask = self._ask(params)
        except BodyError as e:
            return self.edge.count(API, "translate", error(e.status, e.message))
        except BadParam as e:
            return self.edge.count(API, "translate", error(400, f"Bad request: {e}"))
        caller = self.edge.caller(request, self._key(request, params))
        try:
            results = await translate(self.edge, ask, caller)
        except CallFailed as e:
            return self.edge.count(API, "translate", failed(e))
        billed = [len(t) for t in ask.texts]
        body = {"translations": [{"detected_source_language": r.source.upper(), "text": r.text,
                                  "billed_characters": n} for r, n in zip(results, billed)]}
        return self.edge.count(API, "translate", JSONResponse(body, headers={"x-request-id": caller.request_id}))

    def _ask(self, params: Params) -> Ask:
        texts = params.texts("text")
        if not texts:
            raise BadParam("Parameter 'text' not specified.")
        target = params.text("target_lang")
        if not target:
            raise BadParam("Value for 'target_lang' not supported.")
        unsupported = [what for name, what in UNSUPPORTED.items() if params.has(name)]
        if unsupported:
            raise BadParam(f"{', '.join(unsupported)} are not supported by this server")
        tags = (params.text("tag_handling") or "").lower()
        if tags not in ("", "html", "xml"):
            raise BadParam(f"Value for 'tag_handling' not supported: {tags!r} (html or xml)")
        split = params.text("split_sentences") or ("nonewlines" if tags else "1")
        if split not in SPLIT:
            raise BadParam(f"Value for 'split_sentences' not supported: {split!r} (0, 1 or nonewlines)")
        formality = (params.text("formality") or "default").lower()
        if formality not in FORMALITY:
            raise BadParam(f"Value for 'formality' not supported: {formality!r}")
        if formality in ("more", "less"):
            raise BadParam(f"'formality' is not supported for target language {target.upper()!r}")
        params.flag("preserve_formatting")  # checked for its type; the layout is always kept here
        return Ask(texts=texts, source=from_deepl(params.text("source_lang") or ""), target=from_deepl(target),
                   html=bool(tags), split=SPLIT[split])

    async def languages(self, request: Request) -> Response:
        try:
            params = await self._params(request)
            kind = (params.text("type") or "source").lower()
        except (BodyError, BadParam) as e:
            return self.edge.count(API, "languages", error(getattr(e, "status", 400), str(e)))
        _, refused = self._authorized(request, params)
        if refused is not None:
            return self.edge.count(API, "languages", refused)
        if kind not in ("source", "target"):
            return self.edge.count(API, "languages", error(400, "Value for 'type' not supported (source or target)."))
        if kind == "source":
            body = [{"language": c.upper(), "name": language_name(c)} for c in self.edge.admission.sources()]
        else:
            body = [{"language": c.upper(), "name": language_name(c), "supports_formality": False}
                    for c in self.edge.admission.targets()]
        return self.edge.count(API, "languages", JSONResponse(body))

    async def usage(self, request: Request) -> Response:
        try:
            params = await self._params(request)
        except BodyError as e:
            return self.edge.count(API, "usage", error(e.status, e.message))
        key_id, refused = self._authorized(request, params)
        if refused is not None:
            return self.edge.count(API, "usage", refused)
        count, limit = self.edge.admission.usage.report(key_id, self.edge.admission.quota_of(key_id))
        return self.edge.count(API, "usage", JSONResponse({"character_count": count, "character_limit": limit}))
