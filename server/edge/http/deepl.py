"""DeepL API v2, as its clients call it: the official `deepl` library, Weblate, Mastodon, browser add-ons.

    POST /v2/translate          text[], target_lang, source_lang?, split_sentences, tag_handling,
                                preserve_formatting, formality, context, model_type, ignore_tags,
                                splitting_tags, non_splitting_tags, outline_detection, glossary_id (with
                                source_lang; docs/glossaries.md) (JSON or form body)
    GET|POST /v2/languages      ?type=source|target
    GET|POST /v2/usage          characters translated with the caller's key

Keys: `Authorization: DeepL-Auth-Key KEY` is the server's API key (--api-keys-file); `Bearer`
works too. Language codes are DeepL's (upper case; EN-GB/EN-US and PT-BR/PT-PT as targets map
onto the model's `en`/`pt`). Errors are DeepL's: `{"message": ...}` with 400 (bad request),
403 (missing or invalid key, or a model the key may not use), 404, 413 (body too large), 429
(rate limit or a full queue; Retry-After when the limit says when), 456 (the key's character
quota), 5xx; every other /v2 and /v3 path answers 404/405 in that shape too (server/edge/http/port.py).
A language no loaded model serves is refused with DeepL's 400 naming the parameter
("Value for 'target_lang' not supported"), before any language detection runs. What a model
cannot do is refused the way DeepL refuses it: `formality` more/less is a 400 for a target
without formality (prefer_more/prefer_less fall back silently, as DeepL's do).

`context` is accepted and checked for its type; it is neither translated nor billed (the models
here translate sentence by sentence and cannot read it). `model_type` is answered with
`model_type_used` as DeepL answers it; one model serves a language pair here, whatever the type.
With tag_handling=xml, DeepL's tag parameters decide what the markup planner
(server/texts/html.py) sees: see `XmlTags`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Optional

import grpc
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protos.nmt.v1 import translator_pb2 as pb
from server.texts.html import MARKUP, TAG_NAME
from server.edge.gateway import CallFailed
from server.edge.http.body import BadParam, BodyError, Params
from server.edge.http.context import Edge, http_status, retry_headers, language_name
from server.edge.http.translate import Ask, translate
from server.security.usage import QUOTA_REASON

API = "deepl"
SPLIT = {"0": pb.SPLIT_SENTENCES_OFF, "1": pb.SPLIT_SENTENCES_ON, "nonewlines": pb.SPLIT_SENTENCES_NEWLINES}
FORMALITY = ("default", "more", "less", "prefer_more", "prefer_less")
# model_type -> the model_type_used DeepL answers (prefer_quality_optimized is its legacy alias of quality).
MODEL_TYPES = {"quality_optimized": "quality_optimized", "prefer_quality_optimized": "quality_optimized",
               "latency_optimized": "latency_optimized"}
# Accepted and without effect here: what DeepL uses to tune its own models.
IGNORED = {"show_billed_characters", "tag_handling_version", "preserve_formatting", "auth_key"}
UNSUPPORTED = {"glossary_ids": "several glossaries", "style_id": "style rules",
               "custom_instructions": "custom instructions",
               "translation_memory_id": "translation memories"}
# /v2/usage of a key without a character quota: what DeepL reports when no limit is set (a limit of
# 0 would make its clients report the limit reached).
UNLIMITED = 1_000_000_000_000


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


@dataclass
class Parsed:
    """A parsed /v2/translate: the Ask for the model, and what the answer adds back."""
    ask: Ask
    billed: list[int]  # characters of each text as sent
    model_type_used: Optional[str] = None
    xml: Optional["XmlTags"] = None  # tag_handling=xml: how the texts are to be read
    restore: list[Callable[[str], str]] = field(default_factory=list)  # per text: translation -> as sent


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
            parsed = self._parse(params)
        except BodyError as e:
            return self.edge.count(API, "translate", error(e.status, e.message))
        except BadParam as e:
            return self.edge.count(API, "translate", error(400, str(e)))
        if parsed.xml is not None:  # off the event loop: a body may hold megabytes of markup
            views = await self.edge.admission.off_loop(lambda: [parsed.xml.view(t) for t in parsed.ask.texts])
            parsed.ask.texts, parsed.restore = [v for v, _ in views], [r for _, r in views]
        caller = self.edge.caller(request, self._key(request, params))
        try:
            results = await translate(self.edge, parsed.ask, caller)
        except CallFailed as e:
            return self.edge.count(API, "translate", failed(e))
        translations = []
        for i, (result, billed) in enumerate(zip(results, parsed.billed)):
            text = parsed.restore[i](result.text) if parsed.restore else result.text
            item = {"detected_source_language": result.source.upper(), "text": text, "billed_characters": billed}
            if parsed.model_type_used:
                item["model_type_used"] = parsed.model_type_used
            translations.append(item)
        return self.edge.count(API, "translate", JSONResponse({"translations": translations},
                                                              headers={"x-request-id": caller.request_id}))

    def _parse(self, params: Params) -> Parsed:
        texts = params.texts("text")
        if not texts:
            raise BadParam("Parameter 'text' not specified.")
        target = params.text("target_lang")
        if not target:
            raise BadParam("Parameter 'target_lang' not specified.")
        source = params.text("source_lang") or ""
        # Checked before anything runs (language detection included), naming the parameter as DeepL does.
        # The served languages are not listed here: the key is checked later, and /v2/languages wants one.
        if from_deepl(target) not in self.edge.admission.targets():
            raise BadParam(f"Value for 'target_lang' not supported: {target!r} is not a target language of this "
                           "server (GET /v2/languages?type=target lists them).")
        if source and from_deepl(source) not in self.edge.admission.sources():
            raise BadParam(f"Value for 'source_lang' not supported: {source!r} is not a source language of this "
                           "server (GET /v2/languages?type=source lists them).")
        unsupported = [what for name, what in UNSUPPORTED.items() if params.has(name)]
        if unsupported:
            raise BadParam(f"{', '.join(unsupported)} are not supported by this server")
        glossary_id = params.text("glossary_id") or ""
        if glossary_id and not source:  # as DeepL: a glossary is for one language pair
            raise BadParam("Parameter 'source_lang' is required when 'glossary_id' is given.")
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
            raise BadParam(f"Target language {target.upper()!r} does not support formality: send "
                           "formality=default, prefer_more or prefer_less")
        model_type = params.text("model_type")
        if model_type is not None and model_type not in MODEL_TYPES:
            raise BadParam(f"Value for 'model_type' not supported: {model_type!r} "
                           f"({', '.join(MODEL_TYPES)})")
        params.text("context")  # checked for its type; not translated, not billed (the models cannot read it)
        params.flag("preserve_formatting")  # checked for its type; the layout is always kept here
        xml = XmlTags(ignore=_tag_list(params, "ignore_tags"), splitting=_tag_list(params, "splitting_tags"),
                      non_splitting=_tag_list(params, "non_splitting_tags"),
                      outline=params.flag("outline_detection", True))
        # DeepL's nonewlines splits at sentence ends only, a newline being a space: what the markup
        # planner does with SPLIT_SENTENCES_ON. (Plain text keeps NEWLINES, one unit a line: the plain
        # planner has no mode that reads a newline as a space.)
        mode = pb.SPLIT_SENTENCES_ON if tags and split == "nonewlines" else SPLIT[split]
        ask = Ask(texts=texts, source=from_deepl(source), target=from_deepl(target), html=bool(tags), split=mode,
                  glossary_id=glossary_id)
        return Parsed(ask, [len(t) for t in texts], MODEL_TYPES.get(model_type or ""),
                      xml if tags == "xml" else None)

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
        count, limit = self.edge.admission.usage_of(key_id)
        return self.edge.count(API, "usage", JSONResponse({"character_count": count,
                                                           "character_limit": limit or UNLIMITED}))


def _tag_list(params: Params, name: str) -> frozenset[str]:
    """A tag list as DeepL takes it: a JSON list, a repeated form field, or comma-separated names."""
    try:
        values = params.texts(name) or []
    except BadParam:
        raise BadParam(f"Value for '{name}' not supported: a list of tag names or a comma-separated string") from None
    return frozenset(tag.strip() for value in values for tag in value.split(",") if tag.strip())


# -- tag_handling=xml ---------------------------------------------------------------------------
@dataclass
class _Element:
    parent: Optional["_Element"]
    name: str = ""
    has_text: bool = False  # holds non-blank text of its own (not only inside its children)


class XmlTags:
    """DeepL's XML tag parameters, applied around the markup planner (server/texts/html.py).

    DeepL documents them so: the content of an element in `ignore_tags` is not translated;
    `splitting_tags` always end a sentence, `non_splitting_tags` never do; with
    `outline_detection` (the default) the structure is found from the text: an element whose
    parent holds no text of its own is structure and splits ("<par>" in "<content><par>...</par>"),
    one standing in running text is inline ("<b>" in "<par>A <b>bold</b> word</par>"); without
    it only `splitting_tags` split.

    The planner knows HTML's block and inline elements, so it is handed a view of the text in
    which every piece of markup stands as an alias that says how it is to be read: an inline
    tag (kept in its sentence and put back with it, as the planner keeps <b>), a splitting one
    (kept in place between sentences, as <br>), or an ignored element, content and all, as one
    inline atom that comes back exactly once, unchanged. The aliases carry a marker the text
    does not contain, so every one maps back to the markup it stands for, byte for byte."""

    def __init__(self, ignore: frozenset[str] = frozenset(), splitting: frozenset[str] = frozenset(),
                 non_splitting: frozenset[str] = frozenset(), outline: bool = True):
        self.ignore, self.splitting, self.non_splitting, self.outline = ignore, splitting, non_splitting, outline

    def view(self, text: str) -> tuple[str, Callable[[str], str]]:
        """(the text as the planner is to read it, translation of that view -> the translation as sent)."""
        marker = "nmt"
        while marker in text:
            marker += "x"
        tokens = self._fold(self._tokens(text))
        parents = self._outline(tokens)
        originals: list[str] = []

        def alias(raw: str, name: str, closing: bool = False, empty: bool = False) -> str:
            originals.append(raw)
            return f"<{'/' if closing else ''}{name} {marker}=\"{len(originals) - 1}\"{'/' if empty else ''}>"
        view = []
        for (raw, kind, name, closing, empty), parent in zip(tokens, parents):
            if kind == "text":
                view.append(raw)
            elif kind == "ignored":
                view.append(alias(raw, f"{marker}-a", empty=True))
            elif kind == "other" or self._splits(name, parent):
                view.append(alias(raw, "br"))
            else:
                view.append(alias(raw, f"{marker}-a", empty=True) if empty else alias(raw, f"{marker}-i", closing))
        pattern = re.compile(rf"</?(?:{marker}-[ai]|br) {marker}=\"(\d+)\"/?>")

        def restore(translation: str) -> str:
            return pattern.sub(lambda m: originals[int(m.group(1))], translation)
        return "".join(view), restore

    def _splits(self, name: str, parent: _Element) -> bool:
        if name in self.splitting:
            return True
        if name in self.non_splitting:
            return False
        return self.outline and not parent.has_text

    @staticmethod
    def _tokens(text: str) -> list[tuple[str, str, str, bool, bool]]:
        """(raw, kind "text"|"tag"|"other", name, is an end tag, is self-closing) in order."""
        out, pos = [], 0
        for m in MARKUP.finditer(text):
            if m.start() > pos:
                out.append((text[pos:m.start()], "text", "", False, False))
            raw, named = m.group(0), TAG_NAME.match(m.group(0))
            if named:
                out.append((raw, "tag", named.group(1), raw.startswith("</"), raw.endswith("/>")))
            else:  # comment, CDATA, processing instruction, doctype
                out.append((raw, "other", "", False, False))
            pos = m.end()
        if pos < len(text):
            out.append((text[pos:], "text", "", False, False))
        return out

    def _fold(self, tokens: list) -> list:
        """Each ignored element, from its start tag to its matching end tag, as one token; a start tag
        never closed is an ordinary tag. Linear: the ends are matched in one pass."""
        ends: dict[int, int] = {}  # start tag's index -> its end tag's
        open_: dict[str, list[int]] = {}
        for j, (_, kind, name, closing, empty) in enumerate(tokens):
            if kind != "tag" or name not in self.ignore:
                continue
            if empty and not closing:
                ends[j] = j
            elif closing:
                if open_.get(name):
                    ends[open_[name].pop()] = j
            else:
                open_.setdefault(name, []).append(j)
        out, i = [], 0
        while i < len(tokens):
            end = ends.get(i)
            if end is None:
                out.append(tokens[i])
                i += 1
            else:
                out.append(("".join(t[0] for t in tokens[i:end + 1]), "ignored", tokens[i][2], False, True))
                i = end + 1
        return out

    @staticmethod
    def _outline(tokens: list) -> list[_Element]:
        """For each token, the element it stands in, once the whole text is read (so each element knows
        whether it holds text of its own). Tolerant: an end tag closes the nearest open element of its
        name, one that closes nothing stands where it is."""
        root = _Element(None)
        stack, parents = [root], []
        opened: dict[str, int] = {}  # open elements by name: an end tag that closes nothing costs no search
        for raw, kind, name, closing, empty in tokens:
            parents.append(stack[-1])
            if kind == "text" and raw.strip():
                stack[-1].has_text = True
            elif kind == "tag" and closing and opened.get(name):
                at = next(k for k in range(len(stack) - 1, 0, -1) if stack[k].name == name)
                parents[-1] = stack[at].parent
                for element in stack[at:]:
                    opened[element.name] -= 1
                del stack[at:]
            elif kind == "tag" and not closing and not empty:
                stack.append(_Element(stack[-1], name))
                opened[name] = opened.get(name, 0) + 1
        return parents


