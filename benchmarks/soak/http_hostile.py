"""Hostile HTTP requests for the soak, sent over raw sockets so that the connection itself is observed.

Each case is the bytes of one request (or a broken one) and the codes it may get: a 4xx (400 bad
input, 413 too large, 415 wrong content type, 431 or 400 for oversized headers), never a 5xx. After
the answer the SAME connection must still serve GET /healthz unless the server said
`Connection: close`: a connection that fails without that is recorded as RESET, as is one closed
with no answer at all. The kinds:

  nested    JSON nested 10,000 levels deep (arrays and objects) on every endpoint that reads JSON
  number    1e999, Infinity, -Infinity, NaN and a 5,000-digit integer in numeric fields
  header    one 20,000- or 60,000-byte header, 500 headers of 40 bytes (the limit: 16,384 bytes)
  utf8      invalid UTF-8 in JSON and form bodies, raw and %-escaped; a lone surrogate escape
  ctype     a content type the endpoint does not read, or a form body labelled JSON
  truncated JSON cut off mid-string; a top-level array / null instead of an object
  framing   malformed chunked transfer encoding, a bad Content-Length, a garbage request line, and
            a Content-Length larger than the body followed by the client closing (CLOSED is fine then)
  file      the bad and hostile document files of hostile_files.py (zip bombs, entity expansion,
            encryption, formats that lie about themselves) uploaded to DeepL's /v2/document, and a third
            of them to LibreTranslate's /translate_file and the native /v1/files: each API's 400 or 413
"""
from __future__ import annotations

import asyncio
import json
import secrets
from dataclasses import dataclass, field

from benchmarks.soak import hostile_files

BAD = frozenset({"HTTP 400"})
BAD_OR_LARGE = frozenset({"HTTP 400", "HTTP 413"})
BAD_TYPE = frozenset({"HTTP 400", "HTTP 415"})
BIG_HEADER = frozenset({"HTTP 400", "HTTP 431"})
DEPTH = 10_000
NUMBERS = {"1e999": "1e999", "Infinity": "Infinity", "-Infinity": "-Infinity", "NaN": "NaN",
           "5000-digit int": "1" + "0" * 4999}
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


@dataclass(frozen=True)
class HostileCase:
    name: str  # "<kind>/<what> <method> <path>"
    path: str
    data: bytes  # the whole request as sent
    expect: frozenset
    half_close: bool = False  # shut the client's write side after sending: no follow-up on the connection
    method: str = field(default="POST")


def raw_request(method: str, path: str, body: bytes = b"", headers: tuple = (),
                content_type: str = "application/json", length: bool = True) -> bytes:
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if content_type:
        head.append(f"Content-Type: {content_type}")
    head += [f"{k}: {v}" for k, v in headers]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def cases(source: str, target: str) -> list[HostileCase]:
    """Every hostile case, for a server translating `source` into `target`."""
    # endpoint -> (its text field, the other fields a valid request needs), JSON spelling
    endpoints = {"/v1/translate": ("texts", {}), "/v1/translate:stream": ("text", {}), "/v1/embed": ("texts", {}),
                 "/v2/translate": ("text", {"target_lang": target.upper()}),
                 "/translate": ("q", {"source": source, "target": target}), "/detect": ("q", {})}
    out: list[HostileCase] = []

    def add(kind: str, path: str, data: bytes, expect: frozenset, what: str = "", **kw) -> None:
        out.append(HostileCase(f"{kind}/{what} POST {path}".replace("/ ", " "), path, data, expect, **kw))

    def body(path: str, value: str = "", extra: dict | None = None) -> str:
        """A JSON object with the endpoint's text field set to `value` (raw JSON text; by default a valid
        text: a list for `texts`) and the other fields a valid request needs."""
        name, fields = endpoints[path]
        value = value or ('["A dog runs."]' if name == "texts" else '"A dog runs."')
        rest = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in {**fields, **(extra or {})}.items())
        return f'{{"{name}": {value}{rest}}}'

    arrays, objects = "[" * DEPTH + "]" * DEPTH, '{"a": ' * DEPTH + "1" + "}" * DEPTH
    for path in endpoints:
        add("nested", path, raw_request("POST", path, body(path, arrays).encode()), BAD_OR_LARGE, f"{DEPTH} arrays")
        valid = body(path)
        add("truncated", path, raw_request("POST", path, valid[:valid.index("A dog") + 5].encode()), BAD, "string")
        add("truncated", path, raw_request("POST", path, b"[1, 2]"), BAD, "top-level array")
        add("truncated", path, raw_request("POST", path, b"null"), BAD, "top-level null")
        listed = "[{}]" if endpoints[path][0] == "texts" else "{}"
        add("utf8", path, raw_request("POST", path, body(path, listed.format('"A dog \xff runs"')).encode("latin-1")),
            BAD, "raw 0xff")
        # Valid JSON, invalid text: nothing in it can be encoded as UTF-8 (protobuf strings must be).
        add("utf8", path, raw_request("POST", path, body(path, listed.format('"A \\ud800 dog"')).encode()),
            BAD | {"HTTP 200"}, "lone surrogate escape")
    for path in ("/v2/translate", "/translate"):
        add("nested", path, raw_request("POST", path, body(path, objects).encode()), BAD_OR_LARGE, f"{DEPTH} objects")

    numeric = [("/v1/translate", "options.temperature"), ("/v1/translate", "options.beamSize"),
               ("/v1/translate", "options.seed"), ("/v1/translate", "options.alternatives"),
               ("/v1/translate:stream", "options.topP"), ("/translate", "alternatives"),
               ("/v2/translate", "formality"), ("/v2/translate", "preserve_formatting")]
    for path, name in numeric:
        for label, token in NUMBERS.items():
            if name.startswith("options."):
                data = body(path).replace("{", f'{{"options": {{"{name[8:]}": {token}}}, ', 1)
            else:
                data = body(path)[:-1] + f', "{name}": {token}}}'
            add("number", path, raw_request("POST", path, data.encode()), BAD, f"{name}={label}")

    dog = body("/v2/translate").encode()
    for size in (20_000, 60_000):
        out.append(HostileCase(f"header/{size} bytes GET /healthz", "/healthz", raw_request(
            "GET", "/healthz", headers=(("X-Filler", "a" * size),), content_type="", length=False),
            BIG_HEADER, method="GET"))
    add("header", "/v2/translate", raw_request("POST", "/v2/translate", dog, (("X-Filler", "b" * 20_000),)),
        BIG_HEADER, "20000 bytes")
    add("header", "/v2/translate", raw_request("POST", "/v2/translate", dog, tuple(
        (f"X-Filler-{i}", "c" * 24) for i in range(500))), BIG_HEADER, "500 headers")

    form, lang, url_form = f"text=A+dog+runs.&target_lang={target.upper()}", target.upper().encode(), \
        "application/x-www-form-urlencoded"
    add("utf8", "/v2/translate", raw_request("POST", "/v2/translate", b"text=A+dog+\xff&target_lang=" + lang,
                                             content_type=url_form), BAD, "form raw 0xff")
    add("utf8", "/v2/translate", raw_request("POST", "/v2/translate", b"text=%FF%FE&target_lang=" + lang,
                                             content_type=url_form), BAD, "form %FF")
    add("utf8", "/translate", raw_request("POST", "/translate", f"q=%ED%A0%80&source={source}&target={target}"
                                          .encode(), content_type=url_form), BAD,
        "form surrogate %ED%A0%80")
    add("ctype", "/v1/translate", raw_request("POST", "/v1/translate", body("/v1/translate").encode(),
                                              content_type="text/plain"), BAD_TYPE, "text/plain")
    add("ctype", "/v1/translate:stream", raw_request("POST", "/v1/translate:stream", b"text=A+dog.",
                                                     content_type=url_form), BAD_TYPE,
        "form body")
    add("ctype", "/v2/translate", raw_request("POST", "/v2/translate", dog, content_type="application/xml"),
        BAD_TYPE, "application/xml")
    add("ctype", "/v2/translate", raw_request("POST", "/v2/translate", form.encode()), BAD_TYPE, "form as JSON")
    add("ctype", "/translate", raw_request("POST", "/translate", b"q=a", content_type="multipart/form-data"),
        BAD_TYPE, "multipart without boundary")

    chunked = (("Transfer-Encoding", "chunked"),)
    for what, chunks in (("bad chunk size", b"zz\r\n{}\r\n0\r\n\r\n"),
                         ("chunk size overflow", b"f" * 40 + b"\r\n{}\r\n0\r\n\r\n"),
                         ("chunk longer than its size", b"2\r\n{}}}}}\r\n0\r\n\r\n"),
                         ("no CRLF after the chunk", b"2\r\n{}0\r\n\r\n")):
        add("framing", "/v2/translate", raw_request("POST", "/v2/translate", chunks, chunked, length=False),
            BAD_OR_LARGE, what)
    add("framing", "/v2/translate", raw_request("POST", "/v2/translate", dog, (("Content-Length", "abc"),),
                                                length=False), BAD, "Content-Length abc")
    add("framing", "/v2/translate", raw_request("POST", "/v2/translate", dog, (("Content-Length", "-1"),),
                                                length=False), BAD, "Content-Length -1")
    add("framing", "/v2/translate", raw_request("POST", "/v2/translate", dog[:10], (("Content-Length", "1000"),),
                                                length=False), BAD | {"CLOSED"}, "Content-Length > body, then close",
        half_close=True)
    out.append(HostileCase("framing/garbage request line", "/", b"\x16\x03\x01 GARBAGE\r\n\r\n", BAD, method="-"))

    # Documents: the server reads and checks a file before it answers the upload, so every one of these is
    # refused at once and none becomes a job.
    forms = {"/v2/document": {"target_lang": target.upper()}, "/translate_file": {"source": source, "target": target},
             "/v1/files": {"target_language": target}}
    for i, (what, name, data, status, _) in enumerate(hostile_files.cases()):
        for path, fields in forms.items():
            if path == "/v2/document" or i % 3 == 0:
                boundary, content = multipart(fields, name, data)
                add("file", path, raw_request("POST", path, content, content_type="multipart/form-data; "
                                              f"boundary={boundary}"), frozenset({f"HTTP {status}"}), what)
    return out


def multipart(fields: dict, filename: str, data: bytes) -> tuple[str, bytes]:
    """A multipart/form-data body: the fields, then the file as `file`."""
    boundary = secrets.token_hex(12)
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
             for k, v in fields.items()]
    parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                 "Content-Type: application/octet-stream\r\n\r\n".encode() + data + b"\r\n")
    return boundary, b"".join(parts) + f"--{boundary}--\r\n".encode()


# -- one exchange on a raw connection ------------------------------------------------------------------------
@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes

    @property
    def closing(self) -> bool:
        return "close" in self.headers.get("connection", "").lower()


async def read_answer(reader: asyncio.StreamReader) -> Answer:
    """One HTTP/1.1 response: Content-Length, chunked or (with Connection: close) to the end."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(head[0].split()[1])
    headers = {}
    for line in head[1:]:
        if ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if "content-length" in headers:
        return Answer(status, headers, await reader.readexactly(int(headers["content-length"])))
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass  # trailers
                return Answer(status, headers, b"".join(parts))
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return Answer(status, headers, await reader.read(1 << 20) if "close" in headers.get("connection", "") else b"")


async def exchange(host: str, port: int, case: HostileCase, timeout: float) -> tuple[str, str]:
    """Send the case on a new connection; (code, note). The code is "HTTP <status>" when the server
    answered and the connection then behaved (it served /healthz, or the server had said it would close),
    else RESET / CLOSED (half-closed cases) / FOLLOW-UP HTTP <status> (/healthz on it was not 200)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 20), timeout)
    try:
        try:
            writer.write(case.data)
            await writer.drain()
            if case.half_close:
                writer.write_eof()
        except ConnectionError:
            pass  # the server may refuse a request before reading all of it: its answer may still be there
        try:
            first = await asyncio.wait_for(read_answer(reader), timeout)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            if case.half_close:
                return "CLOSED", "the server closed the connection without an answer after the client's close"
            return "RESET", f"the connection ended without an answer ({type(e).__name__})"
        code = f"HTTP {first.status}"
        note = first.body[:160].decode("utf-8", "replace")
        if first.closing or case.half_close:
            return code, note + " [Connection: close]"
        try:
            writer.write(HEALTHZ)
            await writer.drain()
            follow = await asyncio.wait_for(read_answer(reader), timeout)
        except (asyncio.IncompleteReadError, ConnectionError) as e:
            return "RESET", f"{code} without Connection: close, then GET /healthz on the same connection failed " \
                            f"({type(e).__name__}); the answer was: {note}"
        if follow.status != 200:
            return f"FOLLOW-UP HTTP {follow.status}", f"{code}, then /healthz on the connection: {follow.status}"
        return code, note
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
