"""DeepL's glossary endpoints, v2 and v3, as its clients call them (deepl-python's create_glossary,
create_multilingual_glossary, Weblate's glossary sync).

    v2 (one dictionary per glossary)
    POST   /v2/glossaries                   name, source_lang, target_lang, entries, entries_format (tsv|csv) -> 201
    GET    /v2/glossaries                   {"glossaries": [...]} (the caller's one-dictionary glossaries)
    GET    /v2/glossaries/{id}              glossary_id, name, ready, source_lang, target_lang, creation_time,
                                            entry_count
    GET    /v2/glossaries/{id}/entries      TSV (Accept: text/tab-separated-values or none; 415 otherwise)
    DELETE /v2/glossaries/{id}              204
    GET    /v2/glossary-language-pairs      {"supported_languages": [{"source_lang", "target_lang"}]}
    v3 (dictionaries, one per language pair)
    POST   /v3/glossaries                   name, dictionaries: [{source_lang, target_lang, entries, entries_format}]
    GET    /v3/glossaries                   {"glossaries": [{glossary_id, name, dictionaries, creation_time}]}
    GET    /v3/glossaries/{id}
    PATCH  /v3/glossaries/{id}              name and/or dictionaries (merged: entries added or replaced)
    DELETE /v3/glossaries/{id}              204
    GET    /v3/glossaries/{id}/entries      ?source_lang&target_lang -> {"dictionaries": [{..., "entries", "entries_format"}]}
    PUT    /v3/glossaries/{id}/dictionaries one dictionary, replaced or added -> {source_lang, target_lang, entry_count}
    DELETE /v3/glossaries/{id}/dictionaries ?source_lang&target_lang -> 204

Keys: as /v2/translate (`Authorization: DeepL-Auth-Key KEY`); each key has its own glossaries
(server/glossary/store.py); with no key file every caller shares one set. A glossary is ready
when its creation returns (`ready: true`): Weblate lists the glossaries right after creating one
and expects it there. Errors are DeepL's {"message"[, "detail"]}: 400 (bad parameters, invalid
entries, an invalid glossary id), 403, 404 (no such glossary for this key, or no such dictionary),
413 (over 10 MiB of entries), 415 (an Accept the entries cannot be given in), 456 (the key's
glossary count or size quota). The store's work (a write is a synchronous SQLite transaction)
runs off the event loop.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.glossary.entries import (GLOSSARY_LANGUAGES, MAX_GLOSSARY_BYTES, GlossaryError, check_name, language_pair,
                                     parse_entries)
from server.glossary.store import GlossaryInfo, GlossaryStore, open_store
from server.edge.http.body import BadParam, BodyError, Params
from server.edge.http.deepl import error
from server.edge.http.context import Edge

API = "deepl"
TSV = "text/tab-separated-values"
# A glossary body may carry 10 MiB of entries, escaped in JSON: more than a translation request needs.
MAX_BODY_BYTES = 2 * MAX_GLOSSARY_BYTES + (1 << 20)


def v2_json(info: GlossaryInfo) -> dict:
    (d,) = info.dictionaries
    return {"glossary_id": info.glossary_id, "name": info.name, "ready": True, "source_lang": d.source_lang,
            "target_lang": d.target_lang, "creation_time": info.creation_time, "entry_count": d.entry_count}


def v3_json(info: GlossaryInfo) -> dict:
    return {"glossary_id": info.glossary_id, "name": info.name,
            "dictionaries": [{"source_lang": d.source_lang, "target_lang": d.target_lang,
                              "entry_count": d.entry_count} for d in info.dictionaries],
            "creation_time": info.creation_time}


def _single(info: GlossaryInfo) -> GlossaryInfo:
    """A glossary the v2 endpoints can show: exactly one dictionary."""
    if len(info.dictionaries) != 1:
        raise GlossaryError(400, "This glossary has " + str(len(info.dictionaries)) + " dictionaries: the v2 "
                            "glossary endpoints show one-dictionary glossaries only; use /v3/glossaries")
    return info


def _accepts_tsv(accept: str) -> bool:
    if not accept.strip():
        return True
    for item in accept.split(","):
        kind, _, params = item.strip().partition(";")
        q = params.replace(" ", "").lower()
        if "q=0" in q and not any(c in q for c in "123456789"):
            continue  # q=0: not acceptable
        if kind.strip().lower() in (TSV, "text/*", "*/*"):
            return True
    return False


class GlossaryApi:
    def __init__(self, edge: Edge):
        self.edge = edge

    def routes(self) -> list[Route]:
        return [Route("/v2/glossaries", self.v2_collection, methods=["GET", "POST"]),
                Route("/v2/glossaries/{glossary_id}", self.v2_item, methods=["GET", "DELETE"]),
                Route("/v2/glossaries/{glossary_id}/entries", self.v2_entries, methods=["GET"]),
                Route("/v2/glossary-language-pairs", self.language_pairs, methods=["GET", "POST"]),
                Route("/v3/glossaries", self.v3_collection, methods=["GET", "POST"]),
                Route("/v3/glossaries/{glossary_id}", self.v3_item, methods=["GET", "PATCH", "DELETE"]),
                Route("/v3/glossaries/{glossary_id}/entries", self.v3_entries, methods=["GET"]),
                Route("/v3/glossaries/{glossary_id}/dictionaries", self.v3_dictionaries, methods=["PUT", "DELETE"])]

    # -- plumbing ------------------------------------------------------------------------------
    @property
    def store(self) -> GlossaryStore:
        return getattr(self.edge.admission, "glossaries", None) or open_store()

    def _languages(self) -> tuple[str, ...]:
        """The served languages (a glossary for them is usable here), beside DeepL's glossary languages."""
        admission = self.edge.admission
        return tuple(sorted(set(admission.sources()) | set(admission.targets())))

    def _pair(self, source: Any, target: Any) -> tuple[str, str]:
        return language_pair(source, target, self._languages())

    async def _run(self, request: Request, operation: str, work: Callable[[Params, str], Any],
                   status: int = 200) -> Response:
        """Read the parameters, check the key, run `work(params, tenant)` off the event loop; its result
        is a Response, or a JSON body sent with `status`."""
        try:
            params = await Params.of(request, max(self.edge.max_body_bytes, MAX_BODY_BYTES), self.edge.body_timeout_s)
        except BodyError as e:
            return self.edge.count(API, operation, error(e.status, e.message))
        key = self._key(request, params)
        tenant = self.edge.key_id(key)
        if tenant is None:
            return self.edge.count(API, operation, error(403, "Authorization failure: " + (
                "invalid API key" if key else "missing API key: send 'Authorization: DeepL-Auth-Key KEY'")))
        try:
            result = await self.edge.admission.off_loop(work, params, tenant)
        except GlossaryError as e:
            return self.edge.count(API, operation, JSONResponse(e.body(), status_code=e.status))
        except BadParam as e:
            return self.edge.count(API, operation, error(400, str(e)))
        response = result if isinstance(result, Response) else JSONResponse(result, status_code=status)
        return self.edge.count(API, operation, response)

    @staticmethod
    def _key(request: Request, params: Params) -> Optional[str]:
        scheme, _, value = request.headers.get("authorization", "").strip().partition(" ")
        if scheme.lower() in ("deepl-auth-key", "bearer") and value.strip():
            return value.strip()
        try:
            return params.text("auth_key") or None
        except BadParam:
            return None

    def _dictionary(self, item: Any, where: str) -> tuple[str, str, list]:
        """One v3 dictionary object -> (source, target, entries)."""
        if not isinstance(item, dict):
            raise GlossaryError(400, f"Value for '{where}' not supported: each dictionary must be an object with "
                                "source_lang, target_lang, entries and entries_format")
        source, target = self._pair(item.get("source_lang"), item.get("target_lang"))
        return source, target, parse_entries(item.get("entries"), item.get("entries_format"), source, target)

    def _dictionaries(self, value: Any) -> list[tuple[str, str, list]]:
        if value is None:
            raise GlossaryError(400, "Parameter 'dictionaries' not specified.")
        if not isinstance(value, list) or not value:
            raise GlossaryError(400, "Value for 'dictionaries' not supported: a non-empty JSON array of dictionaries")
        return [self._dictionary(item, f"dictionaries[{i}]") for i, item in enumerate(value)]

    @staticmethod
    def _field(params: Params, name: str) -> Any:
        """A JSON field as sent, or a form field given once."""
        value = params.fields.get(name)
        if isinstance(value, list) and not params.json_body:
            return params.text(name)
        return value

    # -- v2 -------------------------------------------------------------------------------------
    async def v2_collection(self, request: Request) -> Response:
        if request.method == "GET":
            return await self._run(request, "glossaries_list", lambda p, t: {
                "glossaries": [v2_json(g) for g in self.store.list(t) if len(g.dictionaries) == 1]})

        def create(params: Params, tenant: str) -> dict:
            name = check_name(self._field(params, "name"))
            source, target = self._pair(self._field(params, "source_lang"), self._field(params, "target_lang"))
            entries = parse_entries(self._field(params, "entries"), self._field(params, "entries_format"),
                                    source, target)
            return v2_json(self.store.create(tenant, name, [(source, target, entries)]))
        return await self._run(request, "glossary_create", create, status=201)

    async def v2_item(self, request: Request) -> Response:
        gid = request.path_params["glossary_id"]
        if request.method == "DELETE":
            return await self._run(request, "glossary_delete", lambda p, t: self._deleted(t, gid))
        return await self._run(request, "glossary_get", lambda p, t: v2_json(_single(self.store.get(t, gid))))

    def _deleted(self, tenant: str, gid: str) -> Response:
        self.store.delete(tenant, gid)
        return Response(status_code=204)

    async def v2_entries(self, request: Request) -> Response:
        gid = request.path_params["glossary_id"]
        accept = request.headers.get("accept", "")

        def entries(params: Params, tenant: str) -> Response:
            info = _single(self.store.get(tenant, gid))
            if not _accepts_tsv(accept):
                raise GlossaryError(415, "Unsupported Media Type",
                                    f"the entries are given as {TSV} only (Accept: {accept[:64]!r})")
            d = info.dictionaries[0]
            text = self.store.entries(tenant, gid, d.source_lang, d.target_lang)
            return Response(text, media_type=TSV)  # Starlette adds the charset
        return await self._run(request, "glossary_entries", entries)

    async def language_pairs(self, request: Request) -> Response:
        def pairs(params: Params, tenant: str) -> dict:
            languages = sorted(set(GLOSSARY_LANGUAGES) | set(self._languages()))
            return {"supported_languages": [{"source_lang": s, "target_lang": t}
                                            for s in languages for t in languages if s != t]}
        return await self._run(request, "glossary_language_pairs", pairs)

    # -- v3 -------------------------------------------------------------------------------------
    async def v3_collection(self, request: Request) -> Response:
        if request.method == "GET":
            return await self._run(request, "glossaries_list", lambda p, t: {
                "glossaries": [v3_json(g) for g in self.store.list(t)]})

        def create(params: Params, tenant: str) -> dict:
            name = check_name(self._field(params, "name"))
            return v3_json(self.store.create(tenant, name, self._dictionaries(params.fields.get("dictionaries"))))
        return await self._run(request, "glossary_create", create, status=201)

    async def v3_item(self, request: Request) -> Response:
        gid = request.path_params["glossary_id"]
        if request.method == "DELETE":
            return await self._run(request, "glossary_delete", lambda p, t: self._deleted(t, gid))
        if request.method == "GET":
            return await self._run(request, "glossary_get", lambda p, t: v3_json(self.store.get(t, gid)))

        def patch(params: Params, tenant: str) -> dict:
            name, dictionaries = params.fields.get("name"), params.fields.get("dictionaries")
            if name is None and dictionaries is None:
                raise GlossaryError(400, "Nothing to update: send 'name' and/or 'dictionaries'")
            return v3_json(self.store.update(tenant, gid, check_name(self._field(params, "name"))
                                             if name is not None else None,
                                             self._dictionaries(dictionaries) if dictionaries is not None else None))
        return await self._run(request, "glossary_update", patch)

    def _query_pair(self, params: Params) -> tuple[str, str]:
        return self._pair(self._field(params, "source_lang"), self._field(params, "target_lang"))

    async def v3_entries(self, request: Request) -> Response:
        gid = request.path_params["glossary_id"]

        def entries(params: Params, tenant: str) -> dict:
            source, target = self._query_pair(params)
            text = self.store.entries(tenant, gid, source, target)
            return {"dictionaries": [{"source_lang": source, "target_lang": target, "entries": text,
                                      "entries_format": "tsv"}]}
        return await self._run(request, "glossary_entries", entries)

    async def v3_dictionaries(self, request: Request) -> Response:
        gid = request.path_params["glossary_id"]
        if request.method == "DELETE":
            def delete(params: Params, tenant: str) -> Response:
                source, target = self._query_pair(params)
                self.store.delete_dictionary(tenant, gid, source, target)
                return Response(status_code=204)
            return await self._run(request, "glossary_dictionary_delete", delete)

        def replace(params: Params, tenant: str) -> dict:
            source, target, entries = self._dictionary(params.fields if params.json_body else {
                k: self._field(params, k) for k in ("source_lang", "target_lang", "entries", "entries_format")},
                "dictionary")
            info = self.store.update(tenant, gid, dictionaries=[(source, target, entries)], merge=False)
            d = next(d for d in info.dictionaries if (d.source_lang, d.target_lang) == (source, target))
            return {"source_lang": d.source_lang, "target_lang": d.target_lang, "entry_count": d.entry_count}
        return await self._run(request, "glossary_dictionary_replace", replace)

