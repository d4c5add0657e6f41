"""`python -m client translate-file` (client/translate_file/) end to end against a real server.

Counts, order and texts are asserted, never a rate: the machine is shared. Where a test needs
the server in a given state (a full queue), it holds the engine with EngineGate and waits for the
server's own counter instead of sleeping.
"""
import contextlib
import io
import json
import random
import re
import socket
import threading
import time
from dataclasses import fields

import pytest

from client.__main__ import main
from client.client import TranslatorClient
from tests.serving import SHARED, EngineGate, ServerThread, flickr_sentences
from server.config import ServerConfig

N_LINES = 2000


@pytest.fixture(scope="module")
def server(shipped_server):
    return shipped_server


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    return flickr_sentences(1000 if SHARED.exists() else 200)


def reference(srv, texts) -> dict:
    """text -> the server's translation through the client library (one plain Translate per 32)."""
    texts = sorted(set(texts))
    out = {}
    with TranslatorClient(srv.target, timeout=120) as c:
        for i in range(0, len(texts), 32):
            resp = c.translate(texts[i:i + 32])
            out.update({t: tr.hypotheses[0].text for t, tr in zip(texts[i:i + 32], resp.translations)})
    return out


def run(tmp_path, *args, name="summary"):
    """(exit status, summary or None) of one in-process CLI run."""
    path = tmp_path / f"{name}.json"
    if path.exists():
        path.unlink()
    rc = main(["translate-file", *map(str, args), "--summary-json", str(path)])
    return rc, (json.loads(path.read_text()) if path.exists() else None)


def lines_of(path) -> list[str]:
    data = path.read_bytes().decode("utf-8")
    assert data == "" or data.endswith("\n")
    return data.split("\n")[:-1]


def text_block(sentences) -> list[str]:
    """Half of the text input: test-set sentences with empty and whitespace-only lines mixed in."""
    n = N_LINES // 2
    return ["" if i % 25 == 7 else "   " if i % 97 == 3 else sentences[i % len(sentences)] for i in range(n)]


@pytest.fixture(scope="module")
def full_run(server, sentences, tmp_path_factory):
    """One uninterrupted run over N_LINES lines (the same block twice): its input, output, summary,
    stderr and the server's count of source tokens it cost."""
    tmp = tmp_path_factory.mktemp("full")
    src = tmp / "corpus.en"
    lines = text_block(sentences) * 2
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    before = server.metric("nmt_input_tokens_total")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc, summary = run(tmp, src, "-o", tmp / "corpus.de", "--target", server.target, "--concurrency", "4",
                          "--batch-size", "16", "--progress-interval", "0.2")
    tokens = server.metric("nmt_input_tokens_total") - before
    return dict(src=src, lines=lines, rc=rc, summary=summary, out=lines_of(tmp / "corpus.de"), tmp=tmp,
                tokens=tokens, stderr=err.getvalue())


def test_text_file_in_order_with_empty_lines_kept(full_run, server):
    lines, out, sm = full_run["lines"], full_run["out"], full_run["summary"]
    assert full_run["rc"] == 0
    assert len(out) == N_LINES
    empty = [i for i, x in enumerate(lines) if not x.strip()]
    assert [out[i] for i in empty] == [lines[i] for i in empty]  # passed through as they were
    assert all(out[i].strip() for i in range(N_LINES) if i not in set(empty))
    assert sm["lines"] == sm["lines_done"] == sm["input_lines"] == N_LINES and sm["complete"]
    assert sm["translated"] == N_LINES - len(empty) and sm["passed_through"] == len(empty)
    assert sm["errors"] == 0 and sm["retries"] == 0 and sm["resumed_from"] == 0
    assert sm["input_characters"] == sum(len(x) for x in lines if x.strip())
    assert sm["output_tokens"] > sm["translated"] and sm["lines_per_second"] > 0
    assert not (full_run["tmp"] / "corpus.de.errors.jsonl").exists()
    # The same sentence gives the same translation wherever it falls in the batches.
    by_text: dict = {}
    for x, y in zip(lines, out):
        if x.strip():
            by_text.setdefault(x, set()).add(y)
    assert all(len(ys) == 1 for ys in by_text.values())
    # Spot check against the client library: 200 lines at random (seeded).
    idx = random.Random(0).sample([i for i in range(N_LINES) if lines[i].strip()], 200)
    ref = reference(server, [lines[i] for i in idx])
    assert [out[i] for i in idx] == [ref[lines[i]] for i in idx]
    # stderr: the summary, and progress lines since stderr is not a terminal here.
    err = full_run["stderr"]
    assert re.search(rf"translate-file: 2000 lines in [\d.]+ s \([\d.]+ lines/s\): {sm['translated']} translated",
                     err)
    if sm["seconds"] > 1.0:  # 5+ progress periods: at least one progress line was due
        assert re.search(r"translate-file: \d+/2000 lines \([\d.]+%\), [\d.]+ lines/s, 0 errors, 0 retries", err)


def test_resume_after_a_stop_translates_no_line_twice(full_run, server, tmp_path):
    """The block alone (the first half of the uninterrupted run's input): stopped at line 300, a
    partial line appended as a kill mid-write would leave, then resumed."""
    half = N_LINES // 2
    assert full_run["lines"][:half] == full_run["lines"][half:]
    src, expected = tmp_path / "block.en", full_run["out"][:half]
    src.write_text("\n".join(full_run["lines"][:half]) + "\n", encoding="utf-8")
    out = tmp_path / "resumed.de"
    before = server.metric("nmt_input_tokens_total")
    rc, first = run(tmp_path, src, "-o", out, "--target", server.target, "--max-lines", "300", "--no-progress")
    assert rc == 0 and not first["complete"] and first["lines"] == 300 and first["stopped"] == "--max-lines 300"
    assert lines_of(out) == expected[:300]
    progress = json.loads((tmp_path / "resumed.de.progress").read_text())
    assert progress["lines_done"] == 300 and not progress["complete"]
    with open(out, "ab") as f:  # a run killed mid-write leaves part of a line
        f.write("Ein halber Sa".encode())
    rc, second = run(tmp_path, src, "-o", out, "--target", server.target, "--no-progress")
    assert rc == 0 and second["complete"] and second["resumed_from"] == 300 and second["lines"] == half - 300
    assert lines_of(out) == expected  # what the uninterrupted run wrote for these lines, partial line gone
    # No line was translated twice: the two runs translated as many texts as the uninterrupted run
    # did for one block, and cost the server exactly half its source tokens.
    assert first["translated"] + second["translated"] == full_run["summary"]["translated"] // 2
    assert full_run["tokens"] % 2 == 0
    assert server.settled_metric("nmt_input_tokens_total", before + full_run["tokens"] / 2) - before == \
        full_run["tokens"] / 2
    # A finished job: a rerun does nothing; other settings are refused; --overwrite starts over.
    rc, third = run(tmp_path, src, "-o", out, "--target", server.target, "--no-progress")
    assert rc == 0 and third["lines"] == 0 and third["translated"] == 0 and third["complete"]
    rc, _ = run(tmp_path, src, "-o", out, "--target", server.target, "--no-progress", "--beam", "2")
    assert rc == 2 and lines_of(out) == expected


def test_existing_output_not_written_by_us_is_left_alone(server, tmp_path, sentences):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(sentences[:5]) + "\n")
    out = tmp_path / "out.txt"
    out.write_text("precious\n")
    rc, _ = run(tmp_path, src, "-o", out, "--target", server.target, "--no-progress")
    assert rc == 2 and out.read_text() == "precious\n"
    rc, sm = run(tmp_path, src, "-o", out, "--target", server.target, "--no-progress", "--overwrite")
    assert rc == 0 and sm["translated"] == 5 and len(lines_of(out)) == 5


def test_jsonl_keeps_fields_and_records_failing_lines(server, tmp_path, sentences):
    too_long = "dog " * (ServerConfig().max_text_chars // 4 + 10)  # over the server's character limit
    rows, raw = [], []
    for i in range(200):
        rec = {"id": i, "src": sentences[i % len(sentences)], "meta": {"tags": ["a", "ü"], "n": i}}
        if i == 3:
            rec["de"] = "stale"  # overwritten
        if i == 5:
            del rec["src"]  # no field: BAD_INPUT
        if i == 9:
            rec["src"] = too_long  # INVALID_ARGUMENT from the server; the rest of its batch is translated
        if i == 10:
            rec["src"] = ""  # passes through
        rows.append(rec)
        raw.append(json.dumps(rec, ensure_ascii=False))
    raw[6] = "{not json"
    raw[8] = ""
    src = tmp_path / "docs.jsonl"
    src.write_text("\n".join(raw) + "\n", encoding="utf-8")
    rc, sm = run(tmp_path, src, "--target", server.target, "--field", "src", "--output-field", "de",
                 "--batch-size", "8", "--no-progress")
    out = lines_of(tmp_path / "docs.translated.jsonl")
    assert rc == 1 and len(out) == 200
    errors = [json.loads(x) for x in lines_of(tmp_path / "docs.translated.jsonl.errors.jsonl")]
    assert [(e["line"], e["code"]) for e in errors] == [(6, "BAD_INPUT"), (7, "BAD_INPUT"), (10, "INVALID_ARGUMENT")]
    assert errors[2]["text"].startswith("dog dog")
    assert sm["errors"] == sm["errors_total"] == 3 and sm["passed_through"] == 2 and sm["translated"] == 195
    ref = reference(server, [r["src"] for i, r in enumerate(rows) if i not in (5, 6, 8, 9, 10)])
    assert out[6] == "{not json" and out[8] == ""
    for i, line in enumerate(out):
        if i in (6, 8):
            continue
        got = json.loads(line)
        want = dict(rows[i])
        want["de"] = None if i in (5, 9) else "" if i == 10 else ref[rows[i]["src"]]
        assert got == want and list(got) == list(want), i  # every field kept, in its place


def test_tsv_appends_a_column_by_header_name_or_number(server, tmp_path, sentences):
    body = []
    for i in range(120):
        s = "" if i == 7 else sentences[i % len(sentences)]
        body.append("short" if i == 4 else f"{i}\t{s}\tnote {i}")
    src = tmp_path / "pairs.tsv"
    src.write_text("id\tsrc\tnote\n" + "\n".join(body) + "\n", encoding="utf-8")
    rc, sm = run(tmp_path, src, "--target", server.target, "--column", "src", "--output-field", "de",
                 "--no-progress")
    out = lines_of(tmp_path / "pairs.translated.tsv")
    assert rc == 1 and len(out) == 121 and out[0] == "id\tsrc\tnote\tde"
    ref = reference(server, [r.split("\t")[1] for r in body if "\t" in r and r.split("\t")[1]])
    for row, got in zip(body, out[1:]):
        cells = row.split("\t")
        want = "" if len(cells) < 2 or not cells[1] else ref[cells[1]]
        assert got == f"{row}\t{want}"
    errors = [json.loads(x) for x in lines_of(tmp_path / "pairs.translated.tsv.errors.jsonl")]
    assert [(e["line"], e["code"]) for e in errors] == [(6, "BAD_INPUT")]
    assert sm["translated"] == 118 and sm["passed_through"] == 2  # the header and the empty cell
    # By number, no header: --column 2 of the rows alone.
    plain = tmp_path / "rows.tsv"
    plain.write_text("\n".join(body[8:20]) + "\n", encoding="utf-8")
    rc, sm = run(tmp_path, plain, "-o", tmp_path / "rows.de.tsv", "--target", server.target, "--column", "2",
                 "--no-progress")
    assert rc == 0 and lines_of(tmp_path / "rows.de.tsv") == [f"{r}\t{ref[r.split(chr(9))[1]]}" for r in body[8:20]]


def test_blank_looking_cells_come_back_as_they_are(server, tmp_path, sentences):
    """A column with NBSP, zero-width and ideographic-space cells loses no line and reports no error."""
    blanks = ["\u00a0", "\u200b", "\u3000", "\ufeff\u2060", "\u00a0\u200b "]
    rows = [f"{i}\t{blanks[i % 5] if i % 2 else sentences[i]}" for i in range(20)]
    src = tmp_path / "cells.tsv"
    src.write_text("\n".join(rows) + "\n", encoding="utf-8")
    rc, sm = run(tmp_path, src, "-o", tmp_path / "cells.de.tsv", "--target", server.target, "--column", "2",
                 "--no-progress")
    ref = reference(server, [sentences[i] for i in range(0, 20, 2)])
    want = [f"{r}\t{ref.get(r.split(chr(9))[1], r.split(chr(9))[1])}" for r in rows]
    assert rc == 0 and lines_of(tmp_path / "cells.de.tsv") == want
    assert sm["passed_through"] == 10 and not (tmp_path / "cells.de.tsv.errors.jsonl").exists()


def test_whole_file_is_one_text(server, tmp_path, sentences):
    doc = f"{sentences[0]} {sentences[1]}\n\n{sentences[2]}\n"
    src = tmp_path / "letter.txt"
    src.write_text(doc, encoding="utf-8")
    rc, sm = run(tmp_path, src, "--whole-file", "--target", server.target, "--no-progress")
    with TranslatorClient(server.target) as c:
        want = c.translate([doc]).translations[0].hypotheses[0].text
    assert rc == 0 and sm["translated"] == 1 and sm["complete"]
    assert (tmp_path / "letter.translated.txt").read_text(encoding="utf-8") == want.rstrip("\n") + "\n"
    rc, sm = run(tmp_path, src, "--whole-file", "--target", server.target, "--no-progress")
    assert rc == 0 and sm["translated"] == 0  # done: not sent again


def dead_target():
    """A loopback port bound but not listening: connections to it are refused."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock, f"127.0.0.1:{sock.getsockname()[1]}"


def test_dead_target_beside_a_live_one_loses_no_line(server, tmp_path, sentences):
    texts = [sentences[i % len(sentences)] for i in range(160)]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    sock, dead = dead_target()
    with sock:
        rc, sm = run(tmp_path, src, "-o", tmp_path / "out.txt", "--target", f"{dead},{server.target}",
                     "--batch-size", "8", "--concurrency", "4", "--backoff", "0.01", "--no-progress")
    assert rc == 0 and sm["complete"] and sm["translated"] == 160 and sm["errors"] == 0
    assert sm["retries"] >= 1 and sm["calls_per_target"][dead] >= 1  # the first call went to the dead one
    ref = reference(server, texts)
    assert lines_of(tmp_path / "out.txt") == [ref[t] for t in texts]


def test_retries_spent_stop_the_run_resumably(server, tmp_path, sentences):
    texts = sentences[:40]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    sock, dead = dead_target()
    with sock:
        rc, sm = run(tmp_path, src, "-o", out, "--target", dead, "--retries", "2", "--backoff", "0.01",
                     "--no-progress")
    assert rc == 1 and sm["retries_exhausted"] and not sm["complete"] and sm["errors"] == 0
    assert "UNAVAILABLE after 2 retries" in sm["stopped"] and lines_of(out) == []
    assert not (tmp_path / "out.txt.errors.jsonl").exists()  # not failed lines: lines still to do
    rc, sm = run(tmp_path, src, "-o", out, "--target", server.target, "--no-progress")
    ref = reference(server, texts)
    assert rc == 0 and sm["complete"] and lines_of(out) == [ref[t] for t in texts]


def test_resource_exhausted_is_retried_until_every_line_is_done(server, tmp_path, sentences):
    """A queue of 2 texts, calls of 2 texts, 6 in flight, the engine held until the server has
    refused one: each refusal is one retry, and every line still comes back, in order."""
    texts = sentences[:60]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    limits = dict(max_batch_size=2, max_queue_size=2, max_texts_per_request=2)
    if "max_sentences_per_request" in {f.name for f in fields(ServerConfig)}:  # servers that split documents
        limits["max_sentences_per_request"] = 2
    tight = ServerThread(warmup=False, **limits).start()
    result = {}
    try:
        model = next(iter(tight.app.models.values()))
        with EngineGate(model) as gate:
            worker = threading.Thread(target=lambda: result.update(summary=run(
                tmp_path, src, "-o", tmp_path / "out.txt", "--target", tight.target, "--batch-size", "2",
                "--concurrency", "6", "--retries", "1000", "--backoff", "0.005", "--max-backoff", "0.05",
                "--no-progress")))
            worker.start()
            end = time.monotonic() + 60  # bounds a failure only
            while tight.metric("nmt_requests_total", missing_ok=True, code="RESOURCE_EXHAUSTED") < 1 and \
                    time.monotonic() < end:
                time.sleep(0.01)
            refused_while_held = tight.metric("nmt_requests_total", missing_ok=True, code="RESOURCE_EXHAUSTED")
            gate.open()
            worker.join(120)
        assert refused_while_held >= 1 and not gate.timed_out and not worker.is_alive()
        rc, sm = result["summary"]
        assert rc == 0 and sm["complete"] and sm["translated"] == 60 and sm["errors"] == 0
        refused = tight.settled_metric("nmt_requests_total", float(sm["retries"]), code="RESOURCE_EXHAUSTED")
        assert sm["retries"] == refused >= 1  # every refusal was retried, nothing else was
    finally:
        tight.stop()
    ref = reference(server, texts)
    assert lines_of(tmp_path / "out.txt") == [ref[t] for t in texts]
