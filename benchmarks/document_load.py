"""Interactive calls while a big document translates in the background: does the document slow them?

    python -m benchmarks.document_load [--pages 200] [--streams 8] [--seconds 30] [--rounds 3]
        [--repository model_repository] [--server-flags '...'] [--out docs/benchmarks/document_load.md]

The target: a 200-page DOCX translates in the background without slowing interactive calls' time to
first token (TTFT) p50 by more than 20%.

1. A DOCX of --pages pages is built with python-docx from real English sentences (the English side of
   multi30k train, shuffled with a fixed seed, so the same file every run; a full stop added to a
   caption without one): a heading per page, now and then a second-level one, paragraphs of 3-7
   sentences (350-450 words a page), some bold and italic runs, a table every 10 pages, a page break
   at the end of each page.
2. Each phase runs on a fresh `python -m server --model-repository REPOSITORY [--server-flags]` (its
   default layout, with a gRPC and an HTTP port of its own; benchmarks/harness.py starts it), warmed up
   by a few interactive calls first. A fresh server per phase, so that no phase inherits another's
   work or state: a document job still translating (phase (b) deletes its job at the end, but a
   server that does not stop a deleted job's translation would go on with it), caches and slots
   filled by another phase's load.
3. Interactive load: --streams closed-loop TranslateStream clients (client/loadgen/) over
   test_2016_flickr.en, naming the en->de model, each call's TTFT (send to the first message carrying
   tokens) and latency (send to the call's end) recorded for --seconds.
4. Rounds (--rounds, the phases' order rotated each round):
   (a) interactive calls alone;
   (b) interactive calls while the DOCX is translated: it is uploaded through the native HTTP API
       (POST /v1/files), the measuring starts once its job is `translating` (GET /v1/files/{id}, polled
       every 0.25 s all phase long, every 0.05 s in a document's last second), and a document that
       finishes inside the phase is timed, uploaded again at once and then downloaded, so one is in the
       server the whole phase. The document's throughput is
       the segments it finished during the measured window (segmentsDone) per second;
   then, once, (c) the document alone: upload to `done`, the download, which must open with python-docx
   with as many paragraphs and tables as the original.
5. The page (--out) and its .json and .png (TTFT distributions alone vs with the document): medians
   over rounds of TTFT p50/p90, latency p50 and tokens/s both ways, their ratio against the target,
   the document's segments/s and characters/s under load and alone, and its time alone.

Client and server share this machine: every phase reports the client's event-loop lag (the time a
response that has arrived waits to be read), which counts in its latencies.
"""
from __future__ import annotations

import argparse
import asyncio
import html
import io
import itertools
import json
import platform
import random
import shlex
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional, Sequence

from benchmarks.harness import TEST_SOURCES, ServerProcess, date_line, machine_line, rotations, wait_serving
from client.loadgen import Sample, grpc_stream, run_level

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"
DOCUMENT_SOURCE = DATA / "train.en"  # the document: not the interactive calls' sentences, not model selection's
INTERACTIVE_SOURCE = TEST_SOURCES
SEED = 20261128
TARGET_RATIO = 1.20  # TTFT p50 with the document / alone, at most
POLL_S = 0.25  # the document's status, this often
END_POLL_S = 0.05  # and this often in its last second, so that a finished document is replaced at once
PROGRESS_S = 5.0  # a progress line this often
DOCX_TYPE = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
PHASES = ("alone", "document", "shared")
# "shared": the document again, on a server without the background replica (--background-replica false): its
# texts decode in the ordinary replicas, behind interactive ones in their queues. The baseline that shows what
# the nice-19 replica is for, measured in the same rounds.
PHASE_FLAGS = {"shared": ("--background-replica", "false")}
LABELS = {"alone": "interactive alone", "document": "with the document (background replica)",
          "shared": "with the document, no background replica"}


# -- the document ---------------------------------------------------------------------------------
def read_sentences(path: Path) -> list[str]:
    """One sentence a line, whitespace normalised, the corpus's stray `&amp;` decoded, duplicates dropped."""
    seen, out = set(), []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = " ".join(html.unescape(line).split())
        if text and text not in seen:
            seen.add(text)
            out.append(text)
    return out


class _Paragraph:
    """Runs of a paragraph: plain text gathered into one run until a bold or italic run comes."""

    def __init__(self, paragraph):
        self.paragraph, self.plain = paragraph, ""

    def add(self, text: str, bold: bool = False, italic: bool = False) -> None:
        if not (bold or italic):
            self.plain += text
            return
        self.flush()
        run = self.paragraph.add_run(text)
        run.bold, run.italic = bold or None, italic or None

    def flush(self) -> None:
        if self.plain:
            self.paragraph.add_run(self.plain)
            self.plain = ""


def _sentence(para: _Paragraph, text: str, rng: random.Random) -> None:
    """A sentence as plain text, in bold, in italics, or with a few words of it in italics."""
    roll = rng.random()
    if roll < 0.06:
        para.add(text, bold=True)
    elif roll < 0.11:
        para.add(text, italic=True)
    elif roll < 0.21 and len(text.split()) >= 6:
        words = text.split()
        start = rng.randrange(1, len(words) - 3)
        end = start + rng.randint(2, 3)
        para.add(" ".join(words[:start]) + " ")
        para.add(" ".join(words[start:end]), italic=rng.random() < 0.7, bold=rng.random() < 0.3)
        para.add(" " + " ".join(words[end:]))
    else:
        para.add(text)


def _heading(sentence: str) -> str:
    return sentence.rstrip(" .!?")


def build_docx(pages: int, sentences: Sequence[str], seed: int = SEED) -> tuple[bytes, dict]:
    """The document's bytes and what it holds (pages, paragraphs, tables, words, characters, bytes)."""
    import docx
    from docx.enum.text import WD_BREAK
    rng = random.Random(seed)
    pool = [s if s[-1] in ".!?" else s + "." for s in sentences]  # captions often lack the full stop prose has
    rng.shuffle(pool)
    short = [s for s in pool if 3 <= len(s.split()) <= 7]
    body, headings = itertools.cycle([s for s in pool if len(s.split()) > 7] or pool), itertools.cycle(short or pool)
    doc = docx.Document()
    props = doc.core_properties  # fixed, so that the same run builds the same file
    props.author = props.last_modified_by = "nmt-serve benchmarks"
    props.title = "Document load benchmark"
    props.created = props.modified = datetime(2026, 1, 1, tzinfo=timezone.utc)
    words = 0
    for page in range(1, pages + 1):
        budget, on_page = rng.randint(350, 450), 0
        title = _heading(next(headings))
        doc.add_heading(title, level=1)
        on_page += len(title.split())
        last = None
        if page % 10 == 0:
            on_page += _table(doc, rng, body)
        while on_page < budget:
            if last is not None and rng.random() < 0.12:
                sub = _heading(next(headings))
                doc.add_heading(sub, level=2)
                on_page += len(sub.split())
            last = _Paragraph(doc.add_paragraph())
            for k in range(rng.randint(3, 7)):
                text = next(body)
                if k:
                    last.add(" ")
                _sentence(last, text, rng)
                on_page += len(text.split())
                if on_page >= budget and k >= 1:
                    break
            last.flush()
        if page < pages:
            last.paragraph.add_run().add_break(WD_BREAK.PAGE)
        words += on_page
    buf = io.BytesIO()
    doc.save(buf)
    data = buf.getvalue()
    texts = [p.text for p in doc.paragraphs] + [c.text for t in doc.tables for row in t.rows for c in row.cells]
    return data, {"pages": pages, "bytes": len(data), "paragraphs": len(doc.paragraphs), "tables": len(doc.tables),
                  "table_cells": sum(len(row.cells) for t in doc.tables for row in t.rows), "words": words,
                  "characters": sum(len(t) for t in texts), "seed": seed, "source": DOCUMENT_SOURCE.name}


def _table(doc, rng: random.Random, body) -> int:
    """A table of 4-6 rows under a header row: a number, a sentence and a remark; returns its words."""
    rows = rng.randint(4, 6)
    table = doc.add_table(rows=rows + 1, cols=3)
    table.style = "Table Grid"
    for cell, label in zip(table.rows[0].cells, ("No.", "What the picture shows", "Remarks")):
        cell.paragraphs[0].add_run(label).bold = True
    words = 6
    for i in range(1, rows + 1):
        cells = table.rows[i].cells
        cells[0].text = str(i)
        for cell in cells[1:]:
            text = next(body)
            para = _Paragraph(cell.paragraphs[0])
            _sentence(para, text, rng)
            para.flush()
            words += len(text.split())
    return words


def docx_shape(data: bytes) -> dict:
    """Paragraphs and tables of a DOCX, and its paragraphs' texts (raises if python-docx cannot open it)."""
    import docx
    doc = docx.Document(io.BytesIO(data))
    return {"paragraphs": len(doc.paragraphs), "tables": len(doc.tables), "texts": [p.text for p in doc.paragraphs]}


# -- the native files API -------------------------------------------------------------------------
class Files:
    """POST /v1/files, GET /v1/files/{id}, GET /v1/files/{id}/content (server/edge/http/documents.py)."""

    def __init__(self, base_url: str, source: str, target: str):
        import httpx
        self.http = httpx.AsyncClient(base_url=base_url, timeout=600.0)
        self.source, self.target = source, target

    async def _ok(self, response):
        if response.status_code != 200:
            raise RuntimeError(f"{response.request.method} {response.request.url.path}: HTTP "
                               f"{response.status_code}: {response.text[:500]}")
        return response

    async def upload(self, name: str, data: bytes) -> dict:
        response = await self.http.post("/v1/files", files={"file": (name, data, DOCX_TYPE)},
                                        data={"target_language": self.target, "source_language": self.source})
        return (await self._ok(response)).json()

    async def status(self, ident: str) -> dict:
        return (await self._ok(await self.http.get(f"/v1/files/{ident}"))).json()

    async def content(self, ident: str) -> bytes:
        return (await self._ok(await self.http.get(f"/v1/files/{ident}/content"))).content

    async def delete(self, ident: str) -> None:
        await self.http.delete(f"/v1/files/{ident}")

    async def wait_ready(self, timeout: float = 120.0) -> None:
        """Until the HTTP port answers /readyz with 200 (gRPC may report SERVING before it listens)."""
        import httpx
        end = time.perf_counter() + timeout
        while True:
            try:
                if (await self.http.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            if time.perf_counter() > end:
                raise TimeoutError(f"the HTTP port did not answer /readyz with 200 within {timeout:g} s")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self.http.aclose()


def poll_interval(job: dict) -> float:
    """END_POLL_S while a job is queued or in its last second (or rebuilding the file), else POLL_S."""
    if job.get("status") == "queued":
        return END_POLL_S
    ending = job.get("status") == "translating" and (
        job.get("secondsRemaining", 99) <= 1 or job.get("segmentsDone", 0) >= job.get("segmentsTotal", 1))
    return END_POLL_S if ending else POLL_S


class Keeper:
    """Keeps the document translating: polls its job, and when it is done, times it, uploads it again at
    once and then downloads the finished one. `segments` counts every segment seen finished (all jobs)."""

    def __init__(self, files: Files, name: str, data: bytes):
        self.files, self.name, self.data = files, name, data
        self.lock = asyncio.Lock()
        self.job: dict = {}
        self.uploaded_at = 0.0
        self.last_done = 0
        self.segments = 0
        self.finished: list[dict] = []  # documents that finished: upload to done
        self.polls: list[tuple[float, str]] = []  # (when, status)

    async def upload(self) -> None:
        t = time.perf_counter()
        self.job = await self.files.upload(self.name, self.data)
        self.uploaded_at, self.last_done = t, 0

    async def poll(self) -> dict:
        async with self.lock:
            job = await self.files.status(self.job["id"])
            now = time.perf_counter()
            self.segments += job["segmentsDone"] - self.last_done
            self.last_done = job["segmentsDone"]
            self.job.update(job)
            self.polls.append((now, job["status"]))
            if job["status"] == "error":
                raise RuntimeError(f"the document job failed: {job.get('error')}")
            if job["status"] == "done":
                self.finished.append({"seconds": now - self.uploaded_at, "segments": job["segmentsTotal"],
                                      "characters": job["billedCharacters"]})
                print(f"    the document finished in {now - self.uploaded_at:.1f} s under load; uploading it "
                      "again", file=sys.stderr, flush=True)
                done_id = job["id"]
                await self.upload()
                await self.files.content(done_id)  # the result is held until downloaded
            return job

    async def wait_translating(self, timeout: float = 300.0) -> None:
        end = time.perf_counter() + timeout
        while (await self.poll())["status"] != "translating":
            if time.perf_counter() > end:
                raise TimeoutError(f"the document was not translating {timeout:g} s after its upload")
            await asyncio.sleep(0.05)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(poll_interval(self.job))
            await self.poll()

    def busy_share(self, t0: float, t1: float) -> float:
        """The share of polls in [t0, t1] that found a document in the server (queued or translating)."""
        seen = [status for when, status in self.polls if t0 <= when <= t1]
        return sum(s in ("queued", "translating") for s in seen) / max(len(seen), 1)


# -- phases ---------------------------------------------------------------------------------------
def start_server(args, phase: str = "") -> ServerProcess:
    t = time.perf_counter()
    server = ServerProcess("--model-repository", args.repository, *shlex.split(args.server_flags),
                           *PHASE_FLAGS.get(phase, ()), http_port=0)
    server.start(timeout=600)
    print(f"  server up in {time.perf_counter() - t:.1f} s (gRPC {server.target}, HTTP {server.http_url})",
          file=sys.stderr, flush=True)
    return server


async def _ticker(label: str, seconds: float, calls: list[int], keeper: Optional[Keeper]) -> None:
    t0 = time.perf_counter()
    while True:
        await asyncio.sleep(PROGRESS_S)
        line = f"    {label}: {time.perf_counter() - t0:.0f}/{seconds:g} s, {calls[0]} interactive calls"
        if keeper is not None:
            line += f", document {keeper.job.get('segmentsDone', 0)}/{keeper.job.get('segmentsTotal', '?')} segments"
        print(line, file=sys.stderr, flush=True)


def level_summary(level, ttfts: list[float]) -> dict:
    s = level.summary()
    keep = ("requests", "errors", "output_tokens", "duration_s", "output_tokens_per_s", "ttft_ms", "e2e_ms",
            "itl_ms", "client_loop_lag_ms")
    return {**{k: s[k] for k in keep if k in s}, "ttft_samples_ms": [round(1e3 * t, 2) for t in ttfts]}


async def run_phase(phase: str, args, model: dict, texts: list[str], name: str, data: bytes) -> dict:
    """One phase on a fresh server: `alone` (interactive calls only), `document` (with the DOCX) or `shared`
    (with the DOCX, no background replica)."""
    from client.client import AsyncTranslatorClient
    server = start_server(args, phase)
    files = Files(server.http_url, model["source"], model["target"])
    client = AsyncTranslatorClient(server.target, timeout=300, retries=0)
    keeper: Optional[Keeper] = None
    tasks: list[asyncio.Task] = []
    try:
        await wait_serving(client)
        await files.wait_ready()
        stream = grpc_stream(client, model=model["name"])
        await run_level(stream, texts[-256:], args.streams, 4 * args.streams, 60)  # warm-up, other sentences
        calls, ttfts = [0], []

        async def measured(text: str) -> Sample:
            sample = await stream(text)
            calls[0] += 1
            if sample.ttft is not None:
                ttfts.append(sample.ttft)
            return sample
        out: dict = {}
        if phase != "alone":
            keeper = Keeper(files, name, data)
            t = time.perf_counter()
            await keeper.upload()
            await keeper.wait_translating()
            out["upload_to_translating_s"] = time.perf_counter() - t
            tasks.append(asyncio.create_task(keeper.run()))
            await keeper.poll()
        t0, s0 = time.perf_counter(), keeper.segments if keeper else 0
        tasks.append(asyncio.create_task(_ticker(phase, args.seconds, calls, keeper)))
        level = await run_level(measured, texts, args.streams, 10 ** 9, args.seconds)
        if keeper is not None:
            if tasks[0].done():  # the keeper stopped (a failed job or upload): the window had no document
                tasks[0].result()
                raise RuntimeError("the document keeper stopped before the phase ended")
            await keeper.poll()
        t1 = time.perf_counter()
        out["interactive"] = level_summary(level, ttfts)
        if keeper is not None:
            job = keeper.job
            per_segment = job["billedCharacters"] / max(job["segmentsTotal"], 1)
            rate = (keeper.segments - s0) / (t1 - t0)
            out["document"] = {"window_s": t1 - t0, "segments": keeper.segments - s0, "segments_per_s": rate,
                               "characters_per_s": rate * per_segment, "segments_total": job["segmentsTotal"],
                               "billed_characters": job["billedCharacters"], "busy_share": keeper.busy_share(t0, t1),
                               "finished": keeper.finished, "polls": len(keeper.polls)}
        i = out["interactive"]
        print(f"  {phase}: {i['requests']} calls, {i['errors']} errors, TTFT p50 {i['ttft_ms']['p50']:.1f} ms, "
              f"p90 {i['ttft_ms']['p90']:.1f} ms, latency p50 {i['e2e_ms']['p50']:.1f} ms, "
              f"{i['output_tokens_per_s']:.0f} tok/s" + (
                  f"; document {out['document']['segments_per_s']:.1f} segments/s, in the server at "
                  f"{100 * out['document']['busy_share']:.0f}% of the status polls" if keeper else ""),
              file=sys.stderr, flush=True)
        return out
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if keeper is not None and keeper.job.get("id"):
            try:
                await files.delete(keeper.job["id"])  # its work ends with the phase
            except Exception:  # noqa: BLE001 (the server stops next anyway)
                pass
        await files.close()
        await client.close()
        server.stop(timeout=30)


async def document_alone(args, model: dict, texts: list[str], name: str, data: bytes, shape: dict) -> dict:
    """Phase (c): the document alone on a fresh server, upload to `done`, then the download checked."""
    from client.client import AsyncTranslatorClient
    server = start_server(args)
    files = Files(server.http_url, model["source"], model["target"])
    client = AsyncTranslatorClient(server.target, timeout=300, retries=0)
    try:
        await wait_serving(client)
        await files.wait_ready()
        await run_level(grpc_stream(client, model=model["name"]), texts[-256:], args.streams, 4 * args.streams, 60)
        t0 = time.perf_counter()
        job = await files.upload(name, data)
        answered = shown = time.perf_counter()  # the file is read; translating starts now (a worker is free)
        while job["status"] not in ("done", "error"):
            await asyncio.sleep(poll_interval(job))
            job = await files.status(job["id"])
            now = time.perf_counter()
            if now - shown >= PROGRESS_S:
                shown = now
                print(f"    alone: {now - t0:.0f} s, {job['segmentsDone']}/{job['segmentsTotal']} segments",
                      file=sys.stderr, flush=True)
        done_at = time.perf_counter()
        if job["status"] == "error":
            raise RuntimeError(f"the document job failed: {job.get('error')}")
        seconds = done_at - t0
        t = time.perf_counter()
        result = await files.content(job["id"])
        download_s = time.perf_counter() - t
        back = docx_shape(result)
        changed = sum(a != b for a, b in zip(shape["texts"], back["texts"]) if a.strip())
        translating = done_at - answered
        out = {"seconds": seconds, "upload_s": answered - t0, "translating_s": translating,
               "download_s": download_s, "segments_total": job["segmentsTotal"],
               "billed_characters": job["billedCharacters"], "segments_per_s": job["segmentsTotal"] / translating,
               "characters_per_s": job["billedCharacters"] / translating, "result_bytes": len(result),
               "result_paragraphs": back["paragraphs"], "result_tables": back["tables"],
               "paragraphs_changed": changed, "paragraphs_with_text": sum(bool(a.strip()) for a in shape["texts"]),
               "same_shape": back["paragraphs"] == shape["paragraphs"] and back["tables"] == shape["tables"]}
        print(f"  document alone: {seconds:.1f} s upload to done ({out['segments_per_s']:.1f} segments/s, "
              f"{out['characters_per_s']:.0f} characters/s); the download opens with python-docx: "
              f"{back['paragraphs']} paragraphs (original {shape['paragraphs']}), {back['tables']} tables "
              f"(original {shape['tables']})", file=sys.stderr, flush=True)
        if not out["same_shape"]:
            raise RuntimeError(f"the translated document has {back['paragraphs']} paragraphs and {back['tables']} "
                               f"tables, the original {shape['paragraphs']} and {shape['tables']}")
        return out
    finally:
        await files.close()
        await client.close()
        server.stop(timeout=30)


# -- results --------------------------------------------------------------------------------------
def med(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def summarize(rounds: list[dict]) -> dict:
    """Medians over rounds, each side, and the ratios with / alone."""
    out: dict = {}
    for phase in [p for p in PHASES if p in rounds[0]]:
        cells = [r[phase]["interactive"] for r in rounds]
        out[phase] = {"ttft_p50_ms": med([c["ttft_ms"]["p50"] for c in cells]),
                      "ttft_p90_ms": med([c["ttft_ms"]["p90"] for c in cells]),
                      "latency_p50_ms": med([c["e2e_ms"]["p50"] for c in cells]),
                      "tokens_per_s": med([c["output_tokens_per_s"] for c in cells]),
                      "calls": sum(c["requests"] for c in cells), "errors": sum(c["errors"] for c in cells),
                      "loop_lag_p99_ms": max(c["client_loop_lag_ms"]["p99"] or 0.0 for c in cells)}
    out["ratio"] = {k: out["document"][k] / out["alone"][k] if out["alone"][k] else float("nan")
                    for k in ("ttft_p50_ms", "ttft_p90_ms", "latency_p50_ms", "tokens_per_s")}
    if "shared" in out:
        out["ratio_shared"] = {k: out["shared"][k] / out["alone"][k] if out["alone"][k] else float("nan")
                               for k in ("ttft_p50_ms", "ttft_p90_ms", "latency_p50_ms", "tokens_per_s")}
        shared = [r["shared"]["document"] for r in rounds]
        out["document_shared"] = {"segments_per_s": med([d["segments_per_s"] for d in shared])}
    docs = [r["document"]["document"] for r in rounds]
    out["document_under_load"] = {"segments_per_s": med([d["segments_per_s"] for d in docs]),
                                  "characters_per_s": med([d["characters_per_s"] for d in docs]),
                                  "busy_share": min(d["busy_share"] for d in docs),
                                  "finished_s": [f["seconds"] for d in docs for f in d["finished"]]}
    out["met"] = out["ratio"]["ttft_p50_ms"] <= TARGET_RATIO
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    labels = LABELS
    phases = [p for p in PHASES if p in results["rounds"][0]]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for i, phase in enumerate(phases):
        ttft = np.sort([t for r in results["rounds"] for t in r[phase]["interactive"]["ttft_samples_ms"]])
        if len(ttft):
            axes[0].plot(ttft, np.arange(1, len(ttft) + 1) / len(ttft), color=f"C{i}", label=labels[phase])
            axes[0].axvline(results["summary"][phase]["ttft_p50_ms"], color=f"C{i}", ls=":", lw=1)
    axes[0].set(xlabel="time to first token (ms)", ylabel="share of calls", xscale="log",
                title="TTFT, all rounds (dotted: median of the rounds' p50)")
    axes[0].xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    axes[0].xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axes[0].xaxis.set_minor_formatter(NullFormatter())
    axes[0].grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    boxes, ticks, colors = [], [], []
    for r, rnd in enumerate(results["rounds"], 1):
        for i, phase in enumerate(phases):
            boxes.append(rnd[phase]["interactive"]["ttft_samples_ms"] or [float("nan")])
            ticks.append(f"{r}\n{ {'alone': 'alone', 'document': 'doc', 'shared': 'doc, shared'}[phase] }")
            colors.append(f"C{i}")
    parts = axes[1].boxplot(boxes, showfliers=False, patch_artist=True, medianprops={"color": "black"})
    for patch, color in zip(parts["boxes"], colors):
        patch.set(facecolor=color, alpha=0.45)
    axes[1].set_xticks(range(1, len(ticks) + 1), ticks, fontsize=7)
    axes[1].set(ylabel="time to first token (ms)", title="TTFT per round (box: p25-p75, whiskers 1.5 IQR)")
    axes[1].grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def render(results: dict, args, argv: list[str]) -> str:
    from server.files.jobs import CALLS_PER_JOB
    s, d, alone = results["summary"], results["docx"], results["document_alone"]
    a, w, ratio, load = s["alone"], s["document"], s["ratio"], s["document_under_load"]
    n = len(results["rounds"])
    rounds_word = f"{n} round{'s' * (n != 1)}"
    per_round = [r["document"]["interactive"]["ttft_ms"]["p50"] / r["alone"]["interactive"]["ttft_ms"]["p50"]
                 for r in results["rounds"]]
    verdict = "met" if s["met"] else "missed"
    finished = load["finished_s"]
    lines = [
        "# Interactive calls while a document translates in the background", "",
        "What it measures: whether a big DOCX translated in the background (native HTTP API, `POST /v1/files`) "
        "slows interactive TranslateStream calls: their time to first token (TTFT) and latency alone and while the "
        "document translates, phases alternating, each on a fresh server; then the document alone, upload to done. "
        "`python -m benchmarks.document_load` rewrites this page.", "",
        f"Command: `{' '.join(['python -m benchmarks.document_load', *map(shlex.quote, argv)])}`", "",
        date_line(), "",
        machine_line(f"Python {platform.python_version()}; client and server share it"), "",
        f"Server: `python -m server --model-repository {shown(args.repository)}"
        + (f" {args.server_flags}" if args.server_flags else "") + "` (its default layout), a fresh one per phase. "
        f"Interactive: {args.streams} closed-loop greedy streams over {INTERACTIVE_SOURCE.name}, naming "
        f"`{results['model']['name']}` (version {results['model']['version']}), {args.seconds:g} s per phase after a "
        f"warm-up, {rounds_word} (order rotated each round). Document: {d['pages']} pages built with python-docx from "
        f"{d['source']} (seed {d['seed']}): {d['paragraphs']:,} paragraphs, {d['tables']} tables "
        f"({d['table_cells']:,} cells), {d['words']:,} words, {d['characters']:,} characters, {d['bytes'] / 1024:,.0f} "
        f"KiB; the server made {alone['segments_total']:,} segments of it, {alone['billed_characters']:,} characters "
        f"to translate, {results['model']['source']} -> {results['model']['target']}.", "",
        f"## Interactive calls, alone vs with the document (median of {rounds_word})", "",
        "| | alone | with the document (background replica, the default) | with / alone |", "|---|---|---|---|",
        f"| TTFT p50 (ms) | {a['ttft_p50_ms']:.1f} | {w['ttft_p50_ms']:.1f} | **{ratio['ttft_p50_ms']:.2f}** |",
        f"| TTFT p90 (ms) | {a['ttft_p90_ms']:.1f} | {w['ttft_p90_ms']:.1f} | {ratio['ttft_p90_ms']:.2f} |",
        f"| latency p50 (ms) | {a['latency_p50_ms']:.1f} | {w['latency_p50_ms']:.1f} | {ratio['latency_p50_ms']:.2f} |",
        f"| interactive tokens/s | {a['tokens_per_s']:,.0f} | {w['tokens_per_s']:,.0f} | {ratio['tokens_per_s']:.2f} |",
        f"| calls (all rounds) / errors | {a['calls']:,} / {a['errors']} | {w['calls']:,} / {w['errors']} | |",
        f"| client event-loop lag p99, worst round (ms) | {a['loop_lag_p99_ms']:.1f} | {w['loop_lag_p99_ms']:.1f} | |",
        *shared_rows(s),
        "", "## Target", "",
        f"- TTFT p50 with the document / alone: {ratio['ttft_p50_ms']:.2f} (target <= {TARGET_RATIO:.2f}): {verdict}",
        "", "## The document", "",
        "| | under load (median of rounds) | alone |", "|---|---|---|",
        f"| segments/s | {load['segments_per_s']:.1f} | {alone['segments_per_s']:.1f} |",
        f"| characters/s | {load['characters_per_s']:,.0f} | {alone['characters_per_s']:,.0f} |",
        f"| upload to done (s) | {finished_cell(finished)} | {alone['seconds']:.1f} (upload answered after "
        f"{alone['upload_s']:.2f}) |",
        f"| status polls that found a document queued or translating (fewest of the rounds) | "
        f"{100 * load['busy_share']:.0f}% | |",
        f"| download | | {alone['result_bytes'] / 1024:,.0f} KiB in {alone['download_s']:.2f} s; opens with "
        "python-docx: "
        f"{alone['result_paragraphs']:,} paragraphs, {alone['result_tables']} tables (same as the original); "
        f"{alone['paragraphs_changed']:,} of {alone['paragraphs_with_text']:,} paragraphs with text changed |",
        "", "Under load: the segments finished in the measured windows per second of them (characters/s: times the "
        "document's mean characters per segment). Alone: the document's segments and characters over the time from "
        "the upload's answer (the file read) to done.", "",
        "## Per round", "",
        "| round | order | TTFT p50 alone / with (ms) | with / alone | TTFT p90 alone / with (ms) | "
        "latency p50 alone / with (ms) | tokens/s alone / with | document segments/s | document in the server |",
        "|---|---|---|---|---|---|---|---|---|"]
    for r, rnd in enumerate(results["rounds"], 1):
        x, y, doc = rnd["alone"]["interactive"], rnd["document"]["interactive"], rnd["document"]["document"]
        lines.append(f"| {r} | {', '.join(rnd['order'])} | {x['ttft_ms']['p50']:.1f} / {y['ttft_ms']['p50']:.1f} | "
                     f"{y['ttft_ms']['p50'] / x['ttft_ms']['p50']:.2f} | {x['ttft_ms']['p90']:.1f} / "
                     f"{y['ttft_ms']['p90']:.1f} | {x['e2e_ms']['p50']:.1f} / {y['e2e_ms']['p50']:.1f} | "
                     f"{x['output_tokens_per_s']:,.0f} / {y['output_tokens_per_s']:,.0f} | "
                     f"{doc['segments_per_s']:.1f} | {100 * doc['busy_share']:.0f}% |")
    share = load["segments_per_s"] / alone["segments_per_s"] if alone["segments_per_s"] else float("nan")
    lag = max(a["loop_lag_p99_ms"], w["loop_lag_p99_ms"])
    spread = f"; per round {min(per_round):.2f}-{max(per_round):.2f}x" if n > 1 else ""
    reading = [
        f"With the document translating, the interactive calls' TTFT p50 was {w['ttft_p50_ms']:.1f} ms against "
        f"{a['ttft_p50_ms']:.1f} ms alone, {ratio['ttft_p50_ms']:.2f}x (target <= {TARGET_RATIO:.2f}x: "
        f"{verdict}{spread}); p90 {ratio['ttft_p90_ms']:.2f}x, latency p50 {ratio['latency_p50_ms']:.2f}x, and "
        f"the interactive tokens/s {ratio['tokens_per_s']:.2f}x of alone.",
        f"Meanwhile the document went at {load['segments_per_s']:.1f} segments/s, {100 * share:.0f}% of its "
        f"{alone['segments_per_s']:.1f} alone (alone it took {alone['seconds']:.1f} s, upload to done, the "
        "background replica's start included); a document job sends at most "
        f"{CALLS_PER_JOB} Translate calls at a time (docs/documents.md), marked PRIORITY_BACKGROUND: they decode "
        "in the background replica, an engine core at nice 19 that runs on the CPU time interactive calls leave "
        "(server/frontend/cores/replicas.py)" + (
            f"; without it (the baseline) the document took {s['document_shared']['segments_per_s']:.1f} "
            f"segments/s from the interactive calls' share and their TTFT p50 went {s['ratio_shared']['ttft_p50_ms']:.2f}x."
            if "shared" in s else "."),
        "The measuring began once the job was translating, and a document was queued or translating at "
        f"{100 * load['busy_share']:.0f}% or more of the status polls of every window"
        + (" (a document that finished was uploaded again at once)." if finished else "."),
        f"Client and server share the machine: the client's event loop ran up to {lag:.1f} ms late (p99), which "
        "counts in every latency above"
        + (" and is a large share of them: more cores, or the client on another machine, would show the server "
           "better." if lag > 0.2 * a["ttft_p50_ms"] else "."),
    ]
    lines += ["", "## Reading it", "", " ".join(reading), "",
              f"![TTFT alone vs with the document]({Path(args.out).with_suffix('.png').name})", ""]
    return "\n".join(lines) + "\n"


def shared_rows(s: dict) -> list[str]:
    """The baseline phase, when it ran: the same document on a server without the background replica."""
    if "shared" not in s:
        return []
    x, r, a = s["shared"], s["ratio_shared"], s["alone"]
    return ["", "The baseline, in the same rounds: the document on a server without the background replica "
            "(`--background-replica false`: its texts decode in the ordinary replicas, after interactive ones in "
            "their queues).", "",
            "| | alone | with the document, no background replica | with / alone |", "|---|---|---|---|",
            f"| TTFT p50 (ms) | {a['ttft_p50_ms']:.1f} | {x['ttft_p50_ms']:.1f} | **{r['ttft_p50_ms']:.2f}** |",
            f"| TTFT p90 (ms) | {a['ttft_p90_ms']:.1f} | {x['ttft_p90_ms']:.1f} | {r['ttft_p90_ms']:.2f} |",
            f"| latency p50 (ms) | {a['latency_p50_ms']:.1f} | {x['latency_p50_ms']:.1f} | {r['latency_p50_ms']:.2f} |",
            f"| interactive tokens/s | {a['tokens_per_s']:,.0f} | {x['tokens_per_s']:,.0f} | {r['tokens_per_s']:.2f} |",
            f"| document segments/s under load | | {s['document_shared']['segments_per_s']:.1f} | |",
            f"| calls (all rounds) / errors | | {x['calls']:,} / {x['errors']} | |"]


def finished_cell(seconds: list[float]) -> str:
    """The upload-to-done times of the documents that finished under load, in a table cell."""
    if not seconds:
        return "none finished within a phase"
    if len(seconds) <= 4:
        return ", ".join(f"{x:.1f}" for x in seconds)
    return f"{len(seconds)} finished: median {med(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})"


def shown(path: str) -> str:
    """A path inside the repository as the command line would give it (relative to the root)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


def pick_model(repository: str) -> dict:
    """The en->de bundle (the repository's first if it has none): named by the interactive calls, and its
    languages those of the document."""
    from models.core.bundle import discover
    bundles = discover(repository)
    b = next((b for b in bundles if (b.source_language, b.target_language) == ("en", "de")), bundles[0])
    return {"name": b.name, "version": b.version, "source": b.source_language, "target": b.target_language}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", type=int, default=200, help="pages of the DOCX (350-450 words each, a table every 10)")
    p.add_argument("--streams", type=int, default=8,
                   help="concurrent interactive TranslateStream clients (closed loop)")
    p.add_argument("--seconds", type=float, default=30.0, help="seconds of interactive calls measured per phase")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of (a) alone and (b) with the document, order rotated; the page reports medians")
    p.add_argument("--repository", default=str(ROOT / "model_repository"), help="the server's --model-repository")
    p.add_argument("--server-flags", default="", help="more `python -m server` flags for every server, one string")
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the phase with the document on a server without the background replica")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "document_load.md"),
                   help="the results page; its .json and .png are written beside it")
    args = p.parse_args(argv)
    if args.pages < 1 or args.streams < 1 or args.seconds <= 0 or args.rounds < 1:
        p.error("--pages, --streams and --rounds must be >= 1, --seconds > 0")
    model = pick_model(args.repository)
    texts = read_sentences(INTERACTIVE_SOURCE)
    t = time.perf_counter()
    data, stats = build_docx(args.pages, read_sentences(DOCUMENT_SOURCE))
    shape = docx_shape(data)
    name = f"document-load-{args.pages}p.docx"
    print(f"document: {stats['pages']} pages, {stats['bytes'] / 1024:,.0f} KiB, {stats['paragraphs']:,} paragraphs, "
          f"{stats['tables']} tables, {stats['words']:,} words, {stats['characters']:,} characters "
          f"(built in {time.perf_counter() - t:.1f} s)", file=sys.stderr, flush=True)
    rounds = []
    phases = [p for p in PHASES if p != "shared" or not args.no_baseline]
    for r, order in enumerate(rotations(phases, args.rounds)):
        rnd: dict = {"order": order}
        for phase in order:
            print(f"round {r + 1}/{args.rounds}, {LABELS[phase]}:", file=sys.stderr, flush=True)
            rnd[phase] = asyncio.run(run_phase(phase, args, model, texts, name, data))
        rounds.append(rnd)
    print("the document alone:", file=sys.stderr, flush=True)
    alone = asyncio.run(document_alone(args, model, texts, name, data, shape))
    results = {"model": model, "docx": stats, "rounds": rounds, "document_alone": alone,
               "summary": summarize(rounds), "target_ratio": TARGET_RATIO,
               "args": {k: getattr(args, k) for k in ("pages", "streams", "seconds", "rounds", "server_flags")}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, separators=(",", ":")))  # the samples on one line
    plot(results, out.with_suffix(".png"))
    out.write_text(render(results, args, argv))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
