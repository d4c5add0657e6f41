"""The HTTP edge as hardened as gRPC (issue 33): hostile or careless bodies and headers get each API's
own 4xx, never a 500; an error response keeps the keep-alive connection or says it closes it; every
response is counted; a client that goes away is not an ERROR. A real server on loopback ports.

Each case was checked against the code before the fix: deep nesting and `alternatives: 1e999` got
500 and the connection after it was closed without `Connection: close` (the next request on it
failed); 20,000- and 60,000-byte headers got 200; a dropped SSE stream logged "Task was destroyed
but it is pending!"; a handler's exception was missing from nmt_http_requests_total.
"""
from __future__ import annotations

import gc
import http.client
import json
import logging
import socket

import httpx
import pytest

from server.edge.http.libre import LibreTranslateApi

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.fixture(scope="module")
def srv(shipped_server):
    return shipped_server


def connection(srv) -> http.client.HTTPConnection:
    host, port = srv.http.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.connect()
    return conn


def call(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | str | None = None,
         headers: dict | None = None) -> tuple[int, dict, dict]:
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(data) if data else {}


def still_open(conn: http.client.HTTPConnection) -> None:
    """The same TCP connection answers the next request (no reconnect: http.client would raise)."""
    sock = conn.sock
    status, _, body = call(conn, "GET", "/healthz")
    assert status == 200 and body == {"status": "SERVING"} and conn.sock is sock


HOSTILE = [  # (path, body, the API's error shape)
    ("/v2/translate", '{"target_lang": "DE", "text": ' + DEEP + '}', "message"),
    ("/translate", '{"q": "A dog.", "source": "en", "target": "de", "x": ' + DEEP + '}', "error"),
    ("/v1/translate", '{"texts": ["A dog."], "x": ' + DEEP + '}', "error"),
    ("/translate", '{"q": "A dog.", "source": "en", "target": "de", "alternatives": 1e999}', "error"),
    ("/translate", '{"q": "A dog.", "source": "en", "target": "de", "alternatives": Infinity}', "error"),
    ("/translate", '{"q": "A dog.", "source": "en", "target": "de", "alternatives": NaN}', "error"),
    ("/translate", '{"q": "A dog.", "source": "en", "target": "de", "alternatives": ' + "9" * 5000 + '}', "error"),
    ("/translate", '{"q": "A dog.", "source": "en", "target": "de", "alternatives": 2.5}', "error"),
    ("/v2/translate", '{"target_lang": "DE", "text": ["A dog."], "x": -1e999}', "message"),
    ("/v1/translate", '{"texts": ["A dog."], "options": {"temperature": 1e999}}', "error"),
    ("/v2/translate", '{"target_lang": "DE", "text": ["A \\ud800 dog."]}', "message"),  # half a surrogate pair
    ("/translate", '{"q": "A \\udfff dog.", "source": "en", "target": "de"}', "error"),
]


@pytest.mark.parametrize("path,body,shape", HOSTILE, ids=[f"{p}-{b[-24:]}" for p, b, _ in HOSTILE])
def test_hostile_bodies_get_the_apis_400_and_the_connection_serves_on(srv, path, body, shape):
    before = srv.metric("nmt_http_requests_total", missing_ok=True, status="400")
    conn = connection(srv)
    status, headers, answer = call(conn, "POST", path, body, {"Content-Type": "application/json"})
    assert status == 400 and shape in answer, (status, answer)
    assert "connection" not in headers  # kept: the body was read to its end
    still_open(conn)
    assert srv.settled_metric("nmt_http_requests_total", before + 1, status="400") == before + 1


@pytest.mark.parametrize("size", [20_000, 60_000])
def test_headers_over_the_limit_get_431_and_connection_close(srv, size):
    before = srv.metric("nmt_http_requests_total", missing_ok=True, status="431")
    conn = connection(srv)
    status, headers, answer = call(conn, "GET", "/healthz", headers={"X-Padding": "a" * size})
    assert status == 431 and headers.get("connection") == "close"
    assert "16384" in answer["error"]["message"]
    assert srv.settled_metric("nmt_http_requests_total", before + 1, status="431") == before + 1


def test_a_body_refused_unread_says_the_connection_closes(srv):
    """413 before reading a declared 10 MB: the rest is still on the wire, so the server must close."""
    sock = socket.create_connection(srv.http.removeprefix("http://").split(":"), timeout=30)
    sock.sendall(b"POST /v2/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 10000000\r\n\r\n{\"text\": [")
    head = sock.recv(65536).decode()
    sock.close()
    assert head.startswith("HTTP/1.1 413") and "connection: close" in head.lower()


def test_an_upload_over_the_limit_sent_whole_gets_its_413_not_a_reset(srv):
    """The file limit is 10 MB; a client that sends 13 MB anyway (as every simple client does, without
    `Expect: 100-continue`) must read the 413: the server reads and drops the rest before closing, since
    closing on unread bytes resets the connection and destroys the answer (server/edge/http/guard.py)."""
    from benchmarks.soak.http_hostile import multipart
    boundary, body = multipart({"target_lang": "DE"}, "big.txt", b"A man rides. " * (1 << 20))
    sock = socket.create_connection(srv.http.removeprefix("http://").split(":"), timeout=30)
    sock.sendall(f"POST /v2/document HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary={boundary}"
                 f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    answer = b""
    while chunk := sock.recv(65536):  # to the server's close: no ConnectionResetError on the way
        answer += chunk
    sock.close()
    head, _, payload = answer.decode().partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413") and "connection: close" in head.lower()
    assert "File too large" in json.loads(payload)["message"]


def test_a_handler_bug_is_a_counted_500_that_keeps_the_connection(srv, monkeypatch, caplog):
    def broken(self, params):
        raise ZeroDivisionError("a bug")
    monkeypatch.setattr(LibreTranslateApi, "_ask", broken)
    before = srv.metric("nmt_http_requests_total", missing_ok=True, status="500")
    conn = connection(srv)
    status, headers, answer = call(conn, "POST", "/translate", '{"q": "A dog.", "source": "en", "target": "de"}',
                                   {"Content-Type": "application/json"})
    assert status == 500 and "ZeroDivisionError" in answer["error"] and "connection" not in headers
    still_open(conn)
    assert srv.settled_metric("nmt_http_requests_total", before + 1, status="500") == before + 1
    assert any("failed" in r.getMessage() and r.exc_info for r in caplog.records)  # the bug is logged once


def test_unknown_paths_are_counted(srv):
    before = srv.metric("nmt_http_requests_total", missing_ok=True, status="404")
    conn = connection(srv)
    assert call(conn, "GET", "/no/such/path")[0] == 404
    still_open(conn)
    assert srv.settled_metric("nmt_http_requests_total", before + 1, status="404") == before + 1


def test_a_malformed_chunk_is_a_400_and_no_server_error(srv, caplog):
    before = srv.metric("nmt_http_requests_total", missing_ok=True, status="500")
    sock = socket.create_connection(srv.http.removeprefix("http://").split(":"), timeout=30)
    sock.sendall(b"POST /v2/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{\"text\": []}\r\n0\r\n\r\n")
    head = b""
    while chunk := sock.recv(65536):  # uvicorn answers and closes
        head += chunk
    sock.close()
    assert head.startswith(b"HTTP/1.1 400")
    with httpx.Client(base_url=srv.http) as client:  # the port serves on
        assert client.get("/healthz").status_code == 200
    assert srv.metric("nmt_http_requests_total", missing_ok=True, status="500") == before
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_dropped_sse_streams_log_no_error(srv, caplog):
    body = {"text": "Two dogs are playing in the snow while a man watches them from a bench.",
            "options": {"maxOutputTokens": 200, "minOutputTokens": 150}}  # still decoding when dropped
    with httpx.Client(base_url=srv.http, timeout=30) as client:
        for _ in range(5):
            with client.stream("POST", "/v1/translate:stream", json=body) as response:
                assert response.status_code == 200
                next(response.iter_lines())  # the first event, then the client goes away
    srv.wait_idle()  # every dropped stream's call was cancelled and its slots freed
    gc.collect()  # a task left pending is reported when it is collected
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def test_libretranslate_alternatives_up_to_the_servers_limit(srv):
    """The translation and its alternatives are the request's hypotheses (--max-hypotheses 8): 7 is the most,
    and 8 is the caller's 400, not admission's refusal of 9 hypotheses (found by the soak)."""
    with httpx.Client(base_url=srv.http, timeout=60) as client:
        body = {"q": "A dog runs in the park.", "source": "en", "target": "de"}
        ok = client.post("/translate", json={**body, "alternatives": 7})
        assert ok.status_code == 200 and len(ok.json()["alternatives"]) == 7
        refused = client.post("/translate", json={**body, "alternatives": 8})
        assert refused.status_code == 400 and "[0, 7]" in refused.json()["error"]
