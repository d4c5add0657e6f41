"""TranslateFile, the gRPC API's document files: the same files, checks and translations as the HTTP
/v1/files (server/files/), progress streamed, the job gone however the call ends.

Files are made with their formats' own libraries and read back with them (the fixtures of
test_document_files.py); each result is compared with what /v1/files gives for the same file on the
same server: the two APIs must agree text for text.
"""
from __future__ import annotations

import asyncio
import datetime
import io
import random
import re
import struct
import time
import zlib

import grpc
import httpx
import pytest
from tests.serving import EngineGate, key_file, wait_for
from tests.system.test_document_files import CAPTIONS, _cases, _docx, _docx_shape, changed

from client import TranslatorClient
from client.__main__ import main as client_main
from protos.nmt.v1 import translator_pb2 as pb
from server.files import LIMITS
from server.files.rpc import FILE_REQUEST_BYTES

MODEL = "multi30k-en-de-small"


@pytest.fixture(scope="module")
def srv(shipped_server):
    return shipped_server


@pytest.fixture(scope="module")
def client(srv):
    with TranslatorClient(srv.target, timeout=120) as c:
        yield c


def on_loop(srv, fn):
    """fn() run on the server's event loop (the FileCalls' state is that loop's to touch)."""
    async def call():
        return fn()
    return asyncio.run_coroutine_threadsafe(call(), srv.loop).result(10)


def held(srv) -> tuple[list[str], int]:
    """(ids of the jobs of TranslateFile calls in progress, their Translate calls in flight)."""
    files = srv.app.service.files
    return on_loop(srv, lambda: (sorted(files.running), sum(map(len, files._calls.values()))))


def via_grpc(client, name: str, data: bytes, **languages) -> tuple[bytes, list]:
    messages: list = []
    out = client.translate_file(name, data, **{"source_language": "en", "target_language": "de", **languages},
                                timeout=120, progress=messages.append)
    return out, messages


def via_http(srv, name: str, data: bytes) -> bytes:
    r = httpx.post(f"{srv.http}/v1/files", data={"source_language": "en", "target_language": "de"},
                   files={"file": (name, data)}, timeout=60)
    assert r.status_code == 200, r.text
    ident = r.json()["id"]
    assert wait_for(lambda: httpx.get(f"{srv.http}/v1/files/{ident}", timeout=30).json()["status"] == "done",
                    timeout=120, every=0.1)
    content = httpx.get(f"{srv.http}/v1/files/{ident}/content", timeout=30)
    assert content.status_code == 200
    return content.content


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details() or ""


def _srt() -> bytes:
    import srt
    subs = [srt.Subtitle(k + 1, datetime.timedelta(seconds=2 * k, milliseconds=250),
                         datetime.timedelta(seconds=2 * k + 1, milliseconds=900), text)
            for k, text in enumerate(["A man is riding a bike\ndown the street.", "<i>Two dogs</i> play in the snow.",
                                      "{\\an8}A boy jumps into the water."])]
    subs[1].index = 7  # numbering is kept as written
    return srt.compose(subs, reindex=False).encode()


def _png(width: int, height: int) -> bytes:
    """An RGB PNG of noise, stored uncompressed: about width x height x 3 bytes however it is zipped."""
    rng = random.Random(0)
    raw = b"".join(b"\x00" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 0)) + chunk(b"IEND", b""))


# -- the same translations as /v1/files ------------------------------------------------------
def test_docx_matches_the_http_api(srv, client):
    import docx
    data = _docx()
    out, messages = via_grpc(client, "report.docx", data)
    before, grpc_doc, http_doc = (docx.Document(io.BytesIO(d)) for d in (data, out, via_http(srv, "report.docx", data)))
    assert _docx_shape(grpc_doc) == _docx_shape(before)  # styles, bold/italic runs, tables kept
    changed([p.text for p in before.paragraphs], [p.text for p in grpc_doc.paragraphs])

    def texts(d):
        return ([p.text for p in d.paragraphs], [c.text for t in d.tables for row in t.rows for c in row.cells],
                [d.sections[0].header.paragraphs[0].text])
    assert texts(grpc_doc) == texts(http_doc)
    assert messages[-1].filename == "report.docx"


def test_srt_matches_the_http_api(srv, client):
    import srt
    data = _srt()
    out, _ = via_grpc(client, "film.srt", data)
    subs, back, http_back = (list(srt.parse(d.decode())) for d in (data, out, via_http(srv, "film.srt", data)))
    assert [(s.index, s.start, s.end, s.content.count("\n")) for s in back] == \
        [(s.index, s.start, s.end, s.content.count("\n")) for s in subs]
    assert re.search(r"<i>[^<]+</i>", back[1].content) and back[2].content.startswith("{\\an8}")
    changed([s.content for s in subs], [s.content for s in back])
    assert [s.content for s in back] == [s.content for s in http_back]


# -- progress ------------------------------------------------------------------------------
def test_progress_is_monotonic_and_ends_with_the_file(srv, client):
    import srt
    captions = [f"{CAPTIONS[k % len(CAPTIONS)]} ({k})" for k in range(40)]  # 40 segments: three Translate calls
    data = srt.compose([srt.Subtitle(k + 1, datetime.timedelta(seconds=k), datetime.timedelta(seconds=k, milliseconds=900),
                                     text) for k, text in enumerate(captions)]).encode()
    started = time.monotonic()
    out, messages = via_grpc(client, "film/captions.srt", data, source_language="")  # the language detected
    elapsed = time.monotonic() - started
    *progress, last = messages
    assert progress, "the first message comes at once, before the job can have finished"
    assert progress[0].status in (pb.FILE_STATUS_QUEUED, pb.FILE_STATUS_TRANSLATING)
    assert all(not m.content and not m.filename and m.status != pb.FILE_STATUS_DONE for m in progress)
    statuses, done = [m.status for m in messages], [m.segments_done for m in messages]
    assert statuses == sorted(statuses) and done == sorted(done)
    assert {m.segments_total for m in messages} == {40}
    assert {m.billed_characters for m in messages} == {sum(map(len, captions))}
    assert len(messages) <= 3 + 2 * elapsed, (len(messages), elapsed)  # at most two a second, and the last
    assert (last.status, last.segments_done, last.seconds_remaining) == (pb.FILE_STATUS_DONE, 40, 0)
    assert last.filename == "captions.srt" and last.content == out and last.source_language == "en"
    back = list(srt.parse(out.decode()))
    assert len(back) == 40 and all(b.content != c for b, c in zip(back, captions))
    assert held(srv) == ([], 0)


# -- what is refused -----------------------------------------------------------------------
def test_bad_and_hostile_files_are_refused_and_the_server_serves(srv, client):
    for case, name, data, status, pattern in _cases():
        code, details = code_of(lambda: client.translate_file(name, data, target_language="de", timeout=60))
        assert code == (grpc.StatusCode.INVALID_ARGUMENT if status == 400 else grpc.StatusCode.RESOURCE_EXHAUSTED), \
            (case, code, details)
        if len(data) <= FILE_REQUEST_BYTES:  # a bigger one is refused by gRPC itself, before any reader
            assert re.search(pattern, details, re.I), (case, details)
        assert "root:" not in details
        assert client.health() == "SERVING"
    # Just over the file limit, well within the message bound: the reader's check, as /v1/files answers it.
    code, details = code_of(lambda: client.translate_file("big.txt", b"a" * (LIMITS.max_file_bytes + 1),
                                                          target_language="de"))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and details.startswith("File too large")
    # Every other request keeps --max-request-bytes, refused unparsed.
    code, details = code_of(lambda: client.translate(["x" * 250_000] * 20))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "request too large" in details
    assert held(srv) == ([], 0)
    assert client.translate([CAPTIONS[1]]).translations[0].hypotheses[0].text


def test_languages_are_checked_first_and_named(client):
    good = CAPTIONS[0].encode()
    code, details = code_of(lambda: client.translate_file("a.txt", good, target_language="ja"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "target_language 'ja'" in details
    code, details = code_of(lambda: client.translate_file("a.txt", good, target_language="de", source_language="ja"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "source_language 'ja'" in details
    code, details = code_of(lambda: client.translate_file("a.txt", good))  # two targets served: which?
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "target_language is required" in details
    # A language named before the file is read: a bad file with a bad language gets the language's error.
    code, details = code_of(lambda: client.translate_file("a.exe", b"MZ", target_language="ja"))
    assert "target_language" in details
    # The job's own check: German text into German, source left to detection.
    code, details = code_of(lambda: client.translate_file("a.txt", "Zwei Hunde spielen im Schnee.".encode(),
                                                          target_language="de"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "Source and target language are the same" in details


def test_full_store_oversized_result_and_failed_jobs_keep_their_status(srv, client, monkeypatch):
    from server.files import jobs as jobs_module
    from server.files import rpc as rpc_module
    data = CAPTIONS[0].encode()
    with monkeypatch.context() as m:
        m.setattr(jobs_module, "MAX_ACTIVE", 0)  # the job store refuses any new job
        code, details = code_of(lambda: client.translate_file("a.txt", data, source_language="en",
                                                              target_language="de"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "try again later" in details
    with monkeypatch.context() as m:
        m.setattr(rpc_module, "MAX_RESULT_BYTES", 10)  # a result no message may carry
        code, details = code_of(lambda: client.translate_file("a.txt", data, source_language="en",
                                                              target_language="de"))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "translated file is" in details
    # A job's failure keeps the status of the segment call that failed it: here NOT_FOUND.
    code, details = code_of(lambda: client.translate_file("a.txt", data, source_language="en", target_language="de",
                                                          glossary_id="6a2b1c3d-0000-4000-8000-000000000000"))
    assert code == grpc.StatusCode.NOT_FOUND and "glossary" in details
    assert held(srv) == ([], 0)


def test_a_file_up_to_the_limit_goes_both_ways(client):
    """A request and a result past gRPC's default 4 MiB (and --max-request-bytes), within the file limit."""
    import docx
    from docx.shared import Inches
    doc = docx.Document()
    doc.add_paragraph(CAPTIONS[0])
    doc.add_picture(io.BytesIO(_png(1800, 1800)), width=Inches(2))
    doc.add_paragraph(CAPTIONS[1])
    buf = io.BytesIO()
    doc.save(buf)
    data = buf.getvalue()
    assert 8 << 20 < len(data) <= LIMITS.max_file_bytes
    out, _ = via_grpc(client, "photo.docx", data)
    assert len(out) > 8 << 20
    back = docx.Document(io.BytesIO(out))
    changed([p.text for p in doc.paragraphs], [p.text for p in back.paragraphs])
    assert len(back.inline_shapes) == 1


# -- the call ending early -----------------------------------------------------------------
def test_cancel_mid_job_drops_the_job_and_its_calls(srv, client):
    files, model = srv.app.service.files, srv.app.models[MODEL]
    before = {rpc: srv.metric("nmt_requests_total", missing_ok=True, rpc=rpc, code="CANCELLED")
              for rpc in ("TranslateFile", "Translate")}
    request = pb.TranslateFileRequest(filename="captions.txt", content="\n".join(CAPTIONS).encode(),
                                      source_language="en", target_language="de")
    with EngineGate(model) as gate:
        stream = client.stub.TranslateFile(request, timeout=120)
        first = next(stream)
        assert first.status in (pb.FILE_STATUS_QUEUED, pb.FILE_STATUS_TRANSLATING) and not first.content
        # The job's one Translate call is in the engine, which the gate holds: the job is surely mid-way.
        assert wait_for(lambda: held(srv)[1] == 1 and gate.held.is_set())
        ((ident,), _) = held(srv)
        job = on_loop(srv, lambda: files.running[ident])
        stream.cancel()
        assert wait_for(lambda: held(srv) == ([], 0))  # the call's job and its Translate call: gone
        assert on_loop(srv, lambda: files.jobs.get(ident)) is None
    srv.wait_idle()  # the engine dropped the cancelled texts at its next step
    assert wait_for(lambda: job.ended.is_set() and on_loop(srv, lambda: ident not in files.jobs.jobs))
    assert on_loop(srv, lambda: files.jobs.spool.read(ident)) is None and job.status == "error"
    for rpc in ("TranslateFile", "Translate"):
        assert srv.settled_metric("nmt_requests_total", before[rpc] + 1, rpc=rpc, code="CANCELLED") == before[rpc] + 1
    out, _ = via_grpc(client, "captions.txt", request.content)  # and the next file goes through
    assert out.decode().count("\n") == len(CAPTIONS) - 1


def test_a_deadline_ends_the_call_and_its_job(srv, client):
    files, model = srv.app.service.files, srv.app.models[MODEL]
    with EngineGate(model):
        code, _ = code_of(lambda: client.translate_file("captions.txt", "\n".join(CAPTIONS).encode(),
                                                         source_language="en", target_language="de", timeout=1.0))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED  # the engine held: the job could not have finished
        assert wait_for(lambda: held(srv) == ([], 0))
    srv.wait_idle()
    assert wait_for(lambda: on_loop(srv, lambda: list(files.jobs.jobs)) == [])


# -- keys: every segment's call is the caller's --------------------------------------------
def test_the_callers_key_applies_to_every_segment(start_server, tmp_path):
    from server.security import keys
    path = key_file(tmp_path, keys.file_line("alice", "alice-key"), keys.file_line("thrifty", "thrifty-key", characters=20),
                    keys.file_line("french", "french-key", models=["multi30k-en-fr-small"]))
    keyed = start_server(api_keys_file=path, http_port=-1)  # files over gRPC with the HTTP port off
    data = CAPTIONS[0].encode()

    def call(key, **kwargs):
        with TranslatorClient(keyed.target, timeout=60, api_key=key) as c:
            return c.translate_file("a.txt", data, **{"source_language": "en", "target_language": "de", **kwargs})
    assert code_of(lambda: call(None))[0] == grpc.StatusCode.UNAUTHENTICATED
    assert "Fahrrad" in call("alice-key").decode()
    code, details = code_of(lambda: call("thrifty-key"))  # the quota, spent by the file's first call
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "Quota exceeded" in details and "thrifty" in details
    code, details = code_of(lambda: call("french-key"))  # a model the key may not use
    assert code == grpc.StatusCode.PERMISSION_DENIED and "french" in details
    assert call("french-key", target_language="fr")
    assert held(keyed) == ([], 0)


# -- the client's command line -------------------------------------------------------------
def test_client_translate_file_server_side(srv, tmp_path, capsys):
    import docx
    src, out = tmp_path / "in.docx", tmp_path / "in.de.docx"
    src.write_bytes(_docx())
    assert client_main(["--target", srv.target, "--timeout", "120", "translate-file", str(src), "-o", str(out),
                        "--target-language", "de", "--source-language", "en", "--server-side"]) == 0
    a, b = docx.Document(str(src)), docx.Document(str(out))
    assert _docx_shape(b) == _docx_shape(a)
    changed([p.text for p in a.paragraphs], [p.text for p in b.paragraphs])
    assert "done:" in capsys.readouterr().err
    bad = tmp_path / "bad.docx"
    bad.write_bytes(b"%PDF-1.7\n" + b"0" * 100)
    assert client_main(["--target", srv.target, "translate-file", str(bad), "-o", str(tmp_path / "x.docx"),
                        "--target-language", "de", "--server-side", "--no-progress"]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err and not (tmp_path / "x.docx").exists()
    assert client_main(["--target", srv.target, "translate-file", str(src), "--format", "jsonl",
                        "--server-side"]) == 2
