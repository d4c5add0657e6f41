"""A CTranslate2 gRPC server with request-level batching: the baseline our server must beat.

    python -m benchmarks.ct2_server --model DIR --tokenizer tokenizer.json --port 50061 [--threads 2]
    python -m benchmarks.ct2_server --model DIR --bundle model_repository/NAME/1 ...   # any bundle's tokenizer

Built the way a competent engineer would put CTranslate2 behind the same nmt.v1 API,
following CTranslate2's own advice for throughput (parallel replicas, `inter_threads`):
--replicas collector threads share one inbox; each takes whatever texts are waiting
(up to --max-batch texts, after at most --max-delay-ms), runs one `translate_batch`
over them with the GIL released (CTranslate2 runs each thread's batch on a free
replica of --threads intra-op threads), and answers each request; greedy streams get
their tokens from CTranslate2's per-token callback. No continuous batching: texts that
arrive while every replica decodes wait for the next free one. Same tokenizer, same output
budget rule (models.core.config.max_output_len) and the same finish semantics as the
real server, so the two produce the same tokens (fp32) and the same message shapes.
Beam streams send their text once, at the end. Embed is not offered.
"""
from __future__ import annotations

import argparse
import asyncio
import queue
import signal
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from models.core.config import max_output_len
from models.core.bundle_tokenizer import load_tokenizer
from models.core.tokenizer import SubwordTokenizer
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.frontend.detok import IncrementalDetokenizer

MODEL_NAME = "ct2"
# CTranslate2 chooses its CPU GEMM library itself (Intel MKL on Intel CPUs, oneDNN elsewhere); these settings
# override the choice through the environment variables its CPU backend reads at start-up. The peer at its
# best is the fastest of them on the machine at hand (docs/benchmarks/ct2_backends.md: on the AVX2 AMD EPYC,
# CTranslate2's own choice).
GEMM_BACKENDS = {"default": {}, "mkl": {"CT2_USE_MKL": "1"},
                 "mkl-packed": {"CT2_USE_MKL": "1", "CT2_USE_EXPERIMENTAL_PACKED_GEMM": "1"},
                 "onednn": {"CT2_USE_MKL": "0"}}


def backend_env(backend: str, base: Mapping[str, str]) -> dict:
    """`base` without any CTranslate2 override it carries (a setting names its own), with `backend`'s."""
    return {**{k: v for k, v in base.items() if not k.startswith("CT2_USE_")}, **GEMM_BACKENDS[backend]}


@dataclass
class Item:
    """One text waiting for a batch; `post` hands results to the request's event loop."""
    pieces: list[str]
    max_len: int
    beam: int
    post: callable
    stream: bool
    sent: int = 0  # tokens streamed so far (a batch decodes to its longest budget; each item stops at its own)


class Collector(threading.Thread):
    """Request-level batching: one translate_batch at a time over whatever is waiting. Several
    collectors may share one inbox (one per CTranslate2 replica)."""

    def __init__(self, translator, tok: SubwordTokenizer, max_batch: int, max_delay: float,
                 inbox: "queue.Queue[Item]", index: int = 0):
        super().__init__(daemon=True, name=f"ct2-collector-{index}")
        self.translator, self.tok = translator, tok
        self.max_batch, self.max_delay = max_batch, max_delay
        self.inbox = inbox

    def run(self) -> None:
        while True:
            batch = [self.inbox.get()]
            end = time.monotonic() + self.max_delay
            while len(batch) < self.max_batch:
                try:
                    batch.append(self.inbox.get(timeout=max(0.0, end - time.monotonic())))
                except queue.Empty:
                    break
            # One call per beam size (translate_batch takes one); greedy is the common case.
            for beam in sorted({it.beam for it in batch}):
                self._translate([it for it in batch if it.beam == beam], beam)

    def _translate(self, items: list[Item], beam: int) -> None:
        def on_token(step) -> bool:
            item = items[step.batch_id]
            if item.stream and step.token_id != self.tok.eos_id and item.sent < item.max_len:
                item.sent += 1
                item.post(("token", [step.token_id]))
            return False  # keep decoding
        try:
            results = self.translator.translate_batch(
                [it.pieces for it in items], beam_size=beam, max_decoding_length=max(it.max_len for it in items),
                max_batch_size=self.max_batch, callback=on_token if beam == 1 else None)
        except Exception as e:  # noqa: BLE001 (fail the batch, keep serving)
            for it in items:
                it.post(("error", str(e)))
            return
        for it, res in zip(items, results):
            ids = [self.tok.token_id(p) for p in res.hypotheses[0]][: it.max_len]
            it.post(("done", ids))


class Ct2Servicer(pb_grpc.TranslatorServicer):
    def __init__(self, inbox: "queue.Queue[Item]", tok: SubwordTokenizer, max_output: int):
        self.inbox, self.tok, self.max_output = inbox, tok, max_output

    def _items(self, texts: Sequence[str], beam: int, stream: bool, max_tokens: int):
        loop = asyncio.get_running_loop()
        out = []
        for text in texts:
            ids = self.tok.encode(text)
            budget = max_tokens or max_output_len(len(ids), self.max_output)
            events: asyncio.Queue = asyncio.Queue()
            item = Item([self.tok.piece(i) for i in ids], min(budget, self.max_output), max(beam, 1),
                        lambda ev, q=events: loop.call_soon_threadsafe(q.put_nowait, ev), stream)
            out.append((item, events, len(ids)))
        for item, _, _ in out:
            self.inbox.put(item)
        return out

    async def Translate(self, request, context):
        items = self._items(request.texts, request.options.beam_size, False, request.options.max_output_tokens)
        resp = pb.TranslateResponse(model=MODEL_NAME)
        for item, events, n_in in items:
            kind, value = await events.get()
            if kind == "error":
                await context.abort(grpc.StatusCode.INTERNAL, value)
            t = resp.translations.add(input_tokens=n_in, output_tokens=len(value),
                                      finish_reason=pb.FINISH_REASON_LENGTH if len(value) >= item.max_len
                                      else pb.FINISH_REASON_EOS)
            t.hypotheses.add(text=self.tok.decode(value), token_ids=value if request.return_tokens else [])
        return resp

    async def TranslateStream(self, request, context):
        ((item, events, n_in),) = self._items([request.text], request.options.beam_size, True,
                                              request.options.max_output_tokens)
        detok, unsent, n = IncrementalDetokenizer(self.tok), [], 0
        while True:
            kind, value = await events.get()
            if kind == "error":
                await context.abort(grpc.StatusCode.INTERNAL, value)
            if kind == "token":
                n += 1
                unsent += value
                delta = detok.push(value)
                if delta:
                    await context.write(pb.TranslateStreamResponse(delta=delta, token_ids=unsent, model=MODEL_NAME))
                    unsent = []
                continue
            rest = value[n:]  # beam search (or tokens past the callback): the remainder at the end
            await context.write(pb.TranslateStreamResponse(
                delta=detok.push(rest) + detok.finish(), token_ids=unsent + rest, final=True,
                output_tokens=len(value), input_tokens=n_in, model=MODEL_NAME,
                finish_reason=pb.FINISH_REASON_LENGTH if len(value) >= item.max_len else pb.FINISH_REASON_EOS))
            return

    async def ListModels(self, request, context):
        out = pb.ListModelsResponse(default_model=MODEL_NAME)
        out.models.add(name=MODEL_NAME, is_default=True, max_output_tokens=self.max_output, provider="ctranslate2")
        return out


async def serve(args) -> None:
    import ctranslate2
    translator = ctranslate2.Translator(args.model, device="cpu", compute_type=args.compute_type,
                                        inter_threads=args.replicas, intra_threads=args.threads)
    if args.bundle:
        import json
        from pathlib import Path
        config = json.loads((Path(args.bundle) / "config.json").read_text())
        tok = load_tokenizer(config.get("tokenizer", "tokenizer.json"), args.bundle)
    else:
        tok = SubwordTokenizer.load(args.tokenizer)
    inbox: "queue.Queue[Item]" = queue.Queue()
    for i in range(args.replicas):
        Collector(translator, tok, args.max_batch, args.max_delay_ms / 1000.0, inbox, i).start()
    server = grpc.aio.server()
    pb_grpc.add_TranslatorServicer_to_server(Ct2Servicer(inbox, tok, args.max_output_tokens), server)
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    port = server.add_insecure_port(f"{args.host}:{args.port}")
    await server.start()
    await checker.set("", health_pb2.HealthCheckResponse.SERVING)
    print(f"ct2-server on {args.host}:{port} ({args.compute_type}, {args.replicas} replicas x {args.threads} "
          "threads)", flush=True)
    # SIGTERM (the harness's stop) ends it cleanly, exit status 0, as the real server's drain does
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(server.stop(1.0)))
    await server.wait_for_termination()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="a CTranslate2 model directory (benchmarks.ct2_convert)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokenizer", help="the bundle's tokenizer.json")
    source.add_argument("--bundle", help="a bundle version directory: its tokenizer, whatever the kind")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=50061)
    p.add_argument("--threads", type=int, default=2, help="CTranslate2 intra-op threads per replica")
    p.add_argument("--replicas", type=int, default=1,
                   help="CTranslate2 inter_threads: batches decoded in parallel, one collector thread each")
    p.add_argument("--compute-type", default="default", help="default, float32, int8, ...")
    p.add_argument("--max-batch", type=int, default=64, help="texts per translate_batch")
    p.add_argument("--max-delay-ms", type=float, default=2.0, help="wait this long for company after the first text")
    p.add_argument("--max-output-tokens", type=int, default=256)
    args = p.parse_args(argv)
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
