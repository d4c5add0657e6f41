"""The soak's HTTP traffic (server/edge/http/): the three APIs through one keep-alive client, and the hostile cases.

All legal calls share one httpx.AsyncClient with a small connection pool, so connections are reused
and a connection the server drops without `Connection: close` fails a later call (recorded as
RESET, which no category allows). Categories, each answered 200 (or 429 for a full queue):

  http_native     POST /v1/translate (sometimes with extreme.py's settings, in the JSON mapping)
  http_sse        POST /v1/translate:stream read to its final event
  http_sse_drop   the same, the connection dropped after the first event
  http_deepl      POST /v2/translate, JSON or form, `Authorization: DeepL-Auth-Key` (ignored with auth off)
  http_libre      POST /translate, JSON or form, source named or "auto", alternatives 0..7
  http_languages  GET /v2/languages (source, target), GET /languages, GET /v1/models
  http_health     GET /healthz
  http_hostile    one of http_hostile.py's cases on a raw socket
  http_document   a document file through DeepL's /v2/document (upload, status polled, result) or the
                  native /v1/files (upload, status polled, content): the file's lines all translated
  http_glossary   a DeepL v3 glossary created, a /v2/translate with its glossary_id, the glossary deleted
  http_large      a body near the body limit (4 MiB by default, --max-request-bytes), or past it: native,
                  DeepL or LibreTranslate JSON of more texts than a request may hold, parsed whole and
                  refused (HTTP 400), refused unread (413), or refused for the memory budget (429): what
                  an outside mix sends to see the server grow

An SSE error event is recorded as "SSE <gRPC code>"; a malformed 200 as BAD_RESPONSE.
"""
from __future__ import annotations

import asyncio
import json
import random
from typing import Optional
from urllib.parse import urlsplit

import httpx
from google.protobuf import json_format

from benchmarks.soak.extreme import ExtremeCase, options
from benchmarks.soak.http_hostile import HostileCase, cases, exchange
from benchmarks.soak.record import Outcome, Record, Recorder
from benchmarks.soak.traffic import decoding

MIX = {"http_native": 4, "http_sse": 3, "http_sse_drop": 2, "http_deepl": 3, "http_libre": 3, "http_languages": 2,
       "http_health": 2, "http_hostile": 5, "http_document": 1, "http_glossary": 1, "http_large": 1}
DOCUMENT_POLL_S = 0.2
LARGE_BODY_BYTES = (4_100_000, 9_500_000)  # under the 4 MiB default (--max-request-bytes): parsed; past it: 413
AUTH = {"Authorization": "DeepL-Auth-Key soak-harness"}
# The client drops its idle connections well before the server's keep-alive timeout (--http-keepalive-s,
# 5 s by default) closes them: otherwise a request sent just as the server closed an idle connection
# would fail through no fault of the server, and count as a reset.
KEEPALIVE_S = 2.0


async def send(client: httpx.AsyncClient, method: str, path: str, **kw) -> httpx.Response:
    """One request; transport failures become Outcome codes: RESET (the connection broke), HANG (no
    answer within the client's timeout), CONNECT_ERROR (no connection at all)."""
    try:
        return await client.request(method, path, **kw)
    except httpx.TimeoutException as e:
        raise Outcome("HANG", f"{type(e).__name__} after the client's timeout") from None
    except httpx.ConnectError as e:
        raise Outcome("CONNECT_ERROR", f"{type(e).__name__}: {e}") from None
    except httpx.TransportError as e:
        raise Outcome("RESET", f"{type(e).__name__}: {e}") from None


def shape(ok: bool, what: str, resp: httpx.Response) -> None:
    if not ok:
        raise Outcome("BAD_RESPONSE", f"{what}: {resp.text[:200]}")


def status(resp: httpx.Response) -> str:
    """ "HTTP <status>"; any but 200 is raised with the body, for the report."""
    if resp.status_code == 200:
        return "HTTP 200"
    raise Outcome(f"HTTP {resp.status_code}", resp.text[:300])


class HttpTraffic:
    def __init__(self, base_url: str, rec: Recorder, sentences: list[str], source: str, target: str,
                 max_texts: int, max_beam: int, timeout: float, extreme: list[ExtremeCase], pool: int = 8):
        if urlsplit(base_url).hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"{base_url}: the soak only talks to the loopback interface")
        self.base_url, self.rec, self.sentences, self.timeout = base_url, rec, sentences, timeout
        self.source, self.target, self.max_texts, self.max_beam = source, target, min(max_texts, 16), max_beam
        self.host, self.port = urlsplit(base_url).hostname, urlsplit(base_url).port or 80
        self.client = httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False,
                                        limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool,
                                                            keepalive_expiry=KEEPALIVE_S))
        self.extreme = extreme
        self.hostile = cases(source, target)
        self.runners = {name: getattr(self, name) for name in MIX}

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(self, category: str, method: str, path: str, fn, detail: str = "",
                    allowed: Optional[frozenset] = None) -> Record:
        return await self.rec.call(category, f"HTTP {method} {path}", self.timeout, fn, allowed=allowed,
                                   detail=detail)

    def _texts(self, rng: random.Random) -> list[str]:
        return rng.choices(self.sentences, k=rng.randint(1, self.max_texts))

    # -- the native API -------------------------------------------------------------------------------------
    def _native_options(self, rng: random.Random) -> tuple[str, dict]:
        if self.extreme and rng.random() < 0.2:
            case = rng.choice([c for c in self.extreme if c.rpc == "Translate"])
            return f"extreme: {case.name}", json_format.MessageToDict(options(case))
        return decoding(rng, self.max_beam)

    async def http_native(self, rng: random.Random) -> Record:
        mode, opts = self._native_options(rng)
        texts = self._texts(rng)

        async def fn():
            resp = await send(self.client, "POST", "/v1/translate", json={"texts": texts, "options": opts})
            if resp.status_code == 200:
                got = resp.json().get("translations", [])
                shape(len(got) == len(texts) and all(t.get("hypotheses") for t in got), "translations", resp)
            return status(resp)
        return await self._call("http_native", "POST", "/v1/translate", fn, mode)

    async def _sse(self, category: str, text: str, opts: dict, drop: bool, detail: str) -> Record:
        async def fn():
            try:
                async with self.client.stream("POST", "/v1/translate:stream", json={"text": text, "options": opts}) \
                        as resp:
                    if resp.status_code != 200:
                        await resp.aread()
                        return status(resp)
                    event, final, n = "", False, 0
                    async for line in resp.aiter_lines():
                        if line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:"):
                            data, n = json.loads(line[5:]), n + 1
                            if event == "error":
                                raise Outcome(f"SSE {data['error']['status']}", data["error"]["message"][:200])
                            final = final or bool(data.get("final"))
                            if drop:
                                return "HTTP 200"  # leaving the block closes the connection mid-stream
                    if not final:
                        raise Outcome("BAD_RESPONSE", f"the event stream ended after {n} events without a final one")
                    return "HTTP 200"
            except httpx.TimeoutException as e:
                raise Outcome("HANG", f"{type(e).__name__} after the client's timeout") from None
            except httpx.TransportError as e:
                raise Outcome("RESET", f"{type(e).__name__}: {e}") from None
        return await self._call(category, "POST", "/v1/translate:stream", fn, detail)

    async def http_sse(self, rng: random.Random) -> Record:
        mode, opts = decoding(rng, self.max_beam)
        return await self._sse("http_sse", rng.choice(self.sentences), opts, False, mode)

    async def http_sse_drop(self, rng: random.Random) -> Record:
        mode, opts = decoding(rng, self.max_beam)
        return await self._sse("http_sse_drop", rng.choice(self.sentences), opts, True, f"{mode}, dropped")

    # -- DeepL and LibreTranslate --------------------------------------------------------------------------
    async def http_deepl(self, rng: random.Random) -> Record:
        texts, form, named = self._texts(rng), rng.random() < 0.4, rng.random() < 0.5
        fields = {"text": texts, "target_lang": self.target.upper()}
        if named:
            fields["source_lang"] = self.source.upper()
        if rng.random() < 0.3:
            fields.update(formality=rng.choice(["prefer_more", "prefer_less", "default"]), preserve_formatting="1")
        body = {"data": fields} if form else {"json": fields}

        async def fn():
            resp = await send(self.client, "POST", "/v2/translate", headers=AUTH, **body)
            if resp.status_code == 200:
                got = resp.json().get("translations", [])
                shape(len(got) == len(texts) and all(isinstance(t.get("text"), str) for t in got), "translations",
                      resp)
            return status(resp)
        detail = f"{'form' if form else 'JSON'}, {'source named' if named else 'source detected'}"
        return await self._call("http_deepl", "POST", "/v2/translate", fn, detail)

    async def http_libre(self, rng: random.Random) -> Record:
        form, many = rng.random() < 0.4, rng.random() < 0.4
        texts = self._texts(rng) if many else [rng.choice(self.sentences)]
        alternatives = rng.choice([0, 0, 0, 1, 3, 7])  # 7: the translation and 7 fill --max-hypotheses 8
        fields: dict = {"q": texts if many else texts[0], "source": rng.choice([self.source, "auto"]),
                        "target": self.target, "format": "text"}
        if alternatives:
            fields["alternatives"] = alternatives
        body = {"data": fields} if form else {"json": fields}

        async def fn():
            resp = await send(self.client, "POST", "/translate", **body)
            if resp.status_code == 200:
                got = resp.json().get("translatedText")
                listed = many and (not form or len(texts) > 1)  # a form's single q is LibreTranslate's single text
                shape(isinstance(got, list) and len(got) == len(texts) if listed else isinstance(got, str),
                      "translatedText", resp)
            return status(resp)
        detail = f"{'form' if form else 'JSON'}, source {fields['source']}, alternatives {alternatives}"
        return await self._call("http_libre", "POST", "/translate", fn, detail)

    async def http_languages(self, rng: random.Random) -> Record:
        path, params = rng.choice([("/v2/languages", {}), ("/v2/languages", {"type": "target"}), ("/languages", {}),
                                   ("/v1/models", {})])

        async def fn():
            resp = await send(self.client, "GET", path, params=params, headers=AUTH if path.startswith("/v2") else {})
            if resp.status_code == 200:
                got = resp.json()
                shape(bool(got.get("models") if isinstance(got, dict) else got), "a list", resp)
            return status(resp)
        return await self._call("http_languages", "GET", path, fn, f"{path} {params or ''}".strip())

    async def http_health(self, rng: random.Random) -> Record:
        async def fn():
            resp = await send(self.client, "GET", "/healthz")
            return status(resp)
        return await self._call("http_health", "GET", "/healthz", fn)

    # -- documents, glossaries, large bodies ----------------------------------------------------------------
    async def http_document(self, rng: random.Random) -> Record:
        lines = rng.choices(self.sentences, k=rng.randint(1, 6))
        native = rng.random() < 0.5
        data = ("\n".join(lines) + "\n").encode()
        upload, api = ("/v1/files", "native") if native else ("/v2/document", "DeepL")
        form = {"target_language": self.target} if native else {"target_lang": self.target.upper()}
        headers = {} if native else AUTH

        async def fn():
            resp = await send(self.client, "POST", upload, data=form, files={"file": ("soak.txt", data, "text/plain")},
                              headers=headers)
            if resp.status_code != 200:
                return status(resp)
            got = resp.json()
            ident = got.get("id" if native else "document_id")
            shape(bool(ident), "a document id", resp)
            key = {} if native else {"data": {"document_key": got.get("document_key", "")}}

            async def ask(path: str) -> httpx.Response:  # natively a GET; DeepL's a POST with the document key
                return await send(self.client, "GET" if native else "POST", path, headers=headers, **key)
            where = f"{upload}/{ident}"
            for _ in range(int(self.timeout / DOCUMENT_POLL_S)):
                resp = await ask(where)
                if resp.status_code != 200:
                    return status(resp)
                state = resp.json().get("status")
                if state == "error":
                    raise Outcome("DOCUMENT_ERROR", resp.text[:300])
                if state == "done":
                    break
                await asyncio.sleep(DOCUMENT_POLL_S)
            else:
                raise Outcome("HANG", f"the document was not done within {self.timeout:.0f} s")
            resp = await ask(where + ("/content" if native else "/result"))
            if resp.status_code == 200:
                shape(len(resp.content.decode("utf-8", "replace").splitlines()) == len(lines), "one line per line", resp)
            return status(resp)
        return await self._call("http_document", "POST", upload, fn, f"{api}, {len(lines)} lines")

    async def http_glossary(self, rng: random.Random) -> Record:
        words = sorted({w.strip(".,").lower() for w in rng.choice(self.sentences).split() if len(w) > 3}) or ["dog"]
        entries = "\n".join(f"{w}\t{w.upper()}" for w in words[:4])

        async def fn():
            resp = await send(self.client, "POST", "/v3/glossaries", headers=AUTH, json={
                "name": "soak", "dictionaries": [{"source_lang": self.source, "target_lang": self.target,
                                                  "entries": entries, "entries_format": "tsv"}]})
            if resp.status_code not in (200, 201):
                return status(resp)
            ident = resp.json().get("glossary_id")
            shape(bool(ident), "a glossary id", resp)
            try:
                resp = await send(self.client, "POST", "/v2/translate", headers=AUTH, json={
                    "text": [rng.choice(self.sentences)], "source_lang": self.source.upper(),
                    "target_lang": self.target.upper(), "glossary_id": ident})
                if resp.status_code == 200:
                    shape(len(resp.json().get("translations", [])) == 1, "one translation", resp)
                return status(resp)
            finally:
                gone = await send(self.client, "DELETE", f"/v3/glossaries/{ident}", headers=AUTH)
                if gone.status_code != 204:
                    raise Outcome(f"HTTP {gone.status_code}", "deleting the glossary: " + gone.text[:200])
        return await self._call("http_glossary", "POST", "/v3/glossaries", fn, f"{len(words[:4])} entries")

    async def http_large(self, rng: random.Random) -> Record:
        api = rng.choice(["native", "DeepL", "LibreTranslate"])
        text = ("A dog runs in the park. " * 1000)[:24_000]
        count = rng.choice(LARGE_BODY_BYTES) // (len(text) + 4)  # far more texts than a request may hold
        field = {"native": "texts", "DeepL": "text", "LibreTranslate": "q"}[api]
        body = {field: [text] * count}
        if api == "DeepL":
            body["target_lang"] = self.target.upper()
        elif api == "LibreTranslate":
            body.update(source=self.source, target=self.target)
        path = {"native": "/v1/translate", "DeepL": "/v2/translate", "LibreTranslate": "/translate"}[api]
        payload = json.dumps(body).encode()

        async def fn():
            resp = await send(self.client, "POST", path, content=payload, headers={
                "Content-Type": "application/json", **(AUTH if api == "DeepL" else {})})
            if resp.status_code in (400, 413):  # refused as the API refuses it: its own status, in its shape
                return f"HTTP {resp.status_code}"
            return status(resp)
        return await self._call("http_large", "POST", path, fn, f"{api}, {len(payload) / 1e6:.1f} MB",
                                allowed=frozenset({"HTTP 400", "HTTP 413", "HTTP 429"}))

    # -- hostile --------------------------------------------------------------------------------------------
    async def http_hostile(self, rng: random.Random) -> Record:
        return await self.hostile_case(rng.choice(self.hostile))

    async def hostile_case(self, case: HostileCase) -> Record:
        async def fn():
            code, note = await exchange(self.host, self.port, case, timeout=10.0)
            if code.startswith("HTTP ") and code in case.expect:
                return code
            raise Outcome(code, note)  # kept for the report: what the server said, or how the connection ended
        return await self.rec.call("http_hostile", f"HTTP {case.method} {case.path}", 10.0, fn,
                                   allowed=case.expect, detail=case.name)

    async def every_hostile_case(self) -> None:
        for case in self.hostile:
            await self.hostile_case(case)
