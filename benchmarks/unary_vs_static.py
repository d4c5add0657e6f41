"""Unary Translate calls through gRPC against static decoding of the same texts, in one run.

    python -m benchmarks.unary_vs_static [--texts-per-call 32] [--clients 4] [--sentences 1000]
        [--variant fp32] [--rounds 2] [--server-flags "..."] [--out docs/benchmarks/unary_vs_static.md]

Issue 35's target: unary calls of 32 texts served through gRPC at >= 0.8x the engine's own static
speed on the same texts. Before this benchmark the two figures came from different runs and
different texts (serving_compare's unary load against decode_throughput's forced 32-token outputs).

Static: the test sentences in file order, tokenised as the server does, in batches of
--texts-per-call, greedy to each row's own end, no serving code; timed from the first batch to the
last, the model loaded and one batch decoded before. Two decoders: static_decode.greedy (encode, then
the in-place step over the whole batch until its longest row ends) and the same step dropping each
row from the batch as it ends ("dropping": what a static decoder tuned for throughput does); two
layouts: one process with two intra-op threads ("1x2") and two single-thread processes decoding
alternate batches at once ("2x1", the server's default layout of two single-thread replicas). The
best of the four is the baseline.

Served: the default server (one harness for every server a benchmark starts), the same texts in the
same batches, --clients callers taking the next batch as each finishes, the whole list --passes times
after one warm-up call; tokens are what the server reports per translation (the count static
decoding's ids give: no BOS, no EOS). The served tokens of every text are compared with static
decoding's (exact greedy parity), so the two sides did the same work.

Rounds alternate static and served; the ratio of each round is reported, then the median.
"""
from __future__ import annotations

import argparse
import json
import queue
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from benchmarks.harness import TEST_SOURCES, ServerProcess, date_line, machine, machine_line

ROOT = Path(__file__).resolve().parents[1]
SRC = TEST_SOURCES
MODEL = "multi30k-en-de-small"
LAYOUTS = ("1x2", "2x1", "1x2-dropping", "2x1-dropping")


def batches(texts: list[str], size: int) -> list[list[str]]:
    return [texts[i:i + size] for i in range(0, len(texts), size)]


# -- static decoding: a worker process per layout part ---------------------------------------------
def static_worker(args) -> None:
    """Decode batches part::parts with `threads` intra-op threads; print {tokens, seconds, counts}."""
    from models.core import static_decode
    from models.core.bundle import load_bundle, newest_version
    from models.core.runtime import OnnxModel, RuntimeOptions
    from models.core.bundle_tokenizer import load_tokenizer
    bundle = load_bundle(newest_version(ROOT / "model_repository" / MODEL))
    tok = load_tokenizer(bundle.tokenizer_entry, bundle.path)
    model = OnnxModel(bundle, RuntimeOptions(variant=args.variant, intra_op_threads=args.threads))
    texts = SRC.read_text(encoding="utf-8").splitlines()[:args.sentences]
    mine = [(i, b) for i, b in enumerate(batches(texts, args.texts_per_call)) if i % args.parts == args.part]
    encoded = [(i, static_decode.pad_batch(tok.encode_batch(b), bundle.spec.pad_id)) for i, b in mine]
    decode = greedy_dropping_finished if args.dropping else static_decode.greedy
    decode(model, *encoded[0][1])  # warm-up
    counts: dict[int, list[int]] = {}
    t0 = time.perf_counter()
    for i, (ids, mask) in encoded:
        counts[i] = [len(out) for out in decode(model, ids, mask)]
    seconds = time.perf_counter() - t0
    print(json.dumps({"tokens": sum(sum(c) for c in counts.values()), "seconds": seconds, "counts": counts}))


def greedy_dropping_finished(model, src_ids, src_mask) -> list[list[int]]:
    """Greedy over the in-place step, each row leaving the batch (SlotCache.release) when it ends."""
    import numpy as np

    from models.core.inplace_step import InPlaceStep
    from models.core.kv_cache import SlotCache
    from models.core.config import max_output_len
    spec = model.spec
    b, src_len = src_ids.shape
    budget = [max_output_len(int(n), spec.max_positions - 1) for n in src_mask.sum(1)]
    _, cross_k, cross_v = model.encode(src_ids, src_mask)
    cache = SlotCache(spec, b, src_len, max(budget) + 1)
    rows = [cache.allocate(cross_k[:, i], cross_v[:, i], src_mask[i], 1, spec.bos_id)[0] for i in range(b)]
    step = InPlaceStep(model.inplace, cache, spec.out_vocab_size)
    out = {id(r): [] for r in rows}
    limit = {id(r): n for r, n in zip(rows, budget)}
    while cache.rows:
        chosen = np.argmax(step.run(), axis=-1).tolist()
        ended = []
        for row, token in zip(list(cache.rows), chosen):
            if token == spec.eos_id or len(out[id(row)]) >= limit[id(row)]:
                ended.append(row)
            else:
                out[id(row)].append(token)
                row.token = token
        cache.release(ended)
    return [out[id(r)] for r in rows]


def static_run(args, layout: str) -> dict:
    """`layout` "1x2" or "2x1", "-dropping" after it for that decoder: processes x threads, all started
    together; tokens/s over the slowest."""
    shape, _, decoder = layout.partition("-")
    parts, threads = (int(x) for x in shape.split("x"))
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.unary_vs_static", "--static-worker",
                               "--part", str(p), "--parts", str(parts), "--threads", str(threads),
                               "--variant", args.variant, "--sentences", str(args.sentences),
                               "--texts-per-call", str(args.texts_per_call)] + (["--dropping"] if decoder else []),
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for p in range(parts)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        if proc.returncode:
            raise RuntimeError(f"static worker failed ({proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    counts = {int(i): c for r in results for i, c in r["counts"].items()}
    tokens = sum(r["tokens"] for r in results)
    seconds = max(r["seconds"] for r in results)
    return {"layout": layout, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "counts": [n for i in sorted(counts) for n in counts[i]]}


# -- served ----------------------------------------------------------------------------------------
def served_run(args, server: ServerProcess) -> dict:
    from client.client import TranslatorClient
    texts = SRC.read_text(encoding="utf-8").splitlines()[:args.sentences]
    calls = batches(texts, args.texts_per_call)
    work: queue.Queue = queue.Queue()
    for _ in range(args.passes):
        for i, b in enumerate(calls):
            work.put((i, b))
    counts: dict[int, list[int]] = {}
    tokens, errors, lock = [0], [], threading.Lock()

    def caller() -> None:
        with TranslatorClient(server.target, timeout=300, retries=0) as client:
            while True:
                try:
                    i, b = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    resp = client.translate(b, model=MODEL)
                except Exception as e:  # noqa: BLE001 (counted and reported: the run is then invalid)
                    errors.append(repr(e))
                    continue
                got = [t.output_tokens for t in resp.translations]
                with lock:
                    tokens[0] += sum(got)
                    counts.setdefault(i, got)

    with TranslatorClient(server.target, timeout=300) as client:
        client.translate(calls[0], model=MODEL)  # warm-up: first-call costs out of the timing
    threads = [threading.Thread(target=caller) for _ in range(args.clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    return {"tokens": tokens[0], "seconds": seconds, "tokens_per_s": tokens[0] / seconds, "errors": len(errors),
            "counts": [n for i in sorted(counts) for n in counts[i]]}


def render(args, argv: Sequence[str], rounds: list[dict]) -> str:
    m = machine()
    ratios = [r["served"]["tokens_per_s"] / r["static"]["tokens_per_s"] for r in rounds]
    same = rounds[-1]["same_tokens"]
    lines = ["# Unary calls through gRPC against static decoding of the same texts", "",
             "What it measures: " + __doc__.split("\n\n")[2].replace("\n", " "), "",
             f"Command: `python -m benchmarks.unary_vs_static {' '.join(argv)}`", "", date_line(m), "",
             machine_line("the server, its callers and the static workers share it, one at a time", m), "",
             f"{args.sentences} sentences of test_2016_flickr.en in calls of {args.texts_per_call}, {args.clients} "
             f"callers, {args.passes} passes per served run; model {MODEL}, {args.variant}; server flags: "
             f"`{args.server_flags or '(defaults)'}`.", "",
             "| round | static tokens/s (best) | static 1x2 / 2x1 / 1x2-dropping / 2x1-dropping | served tokens/s | "
             "served / static |", "|---|---|---|---|---|"]
    for n, (r, ratio) in enumerate(zip(rounds, ratios), 1):
        lines.append(f"| {n} | {r['static']['tokens_per_s']:,.0f} ({r['static']['layout']}) | "
                     + " / ".join(f"{r['layouts'][k]:,.0f}" for k in LAYOUTS) + f" | {r['served']['tokens_per_s']:,.0f} | "
                     f"{ratio:.2f}x |")
    lines += ["", f"**Median: {statistics.median(ratios):.2f}x** (target >= 0.8x). Served output lengths equal "
              f"static decoding's on {same[0]} of {same[1]} texts (greedy parity); served errors: "
              f"{sum(r['served']['errors'] for r in rounds)}. A length that differs is the server's runaway guard "
              "stopping an output that loops (on by default; `--server-flags '--runaway-guard false'` tells them "
              "apart).", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--texts-per-call", type=int, default=32)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--passes", type=int, default=2, help="times the served run sends the whole list")
    p.add_argument("--variant", default="fp32", choices=["fp32", "int8"])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--server-flags", default="", help="extra flags for the server, one string")
    p.add_argument("--out", help="write the Markdown page here (default: print only)")
    p.add_argument("--static-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--part", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--parts", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--dropping", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.static_worker:
        static_worker(args)
        return 0
    flags = ["--variant", args.variant, *args.server_flags.split()]
    rounds = []
    with ServerProcess(*flags) as server:
        for n in range(args.rounds):
            layouts = {layout: static_run(args, layout) for layout in LAYOUTS}
            best = max(layouts.values(), key=lambda r: r["tokens_per_s"])
            served = served_run(args, server)
            same = sum(a == b for a, b in zip(served["counts"], best["counts"]))
            rounds.append({"static": best, "served": served, "same_tokens": (same, len(best["counts"])),
                           "layouts": {k: v["tokens_per_s"] for k, v in layouts.items()}})
            print(f"round {n + 1}: static {best['tokens_per_s']:,.0f} ({best['layout']}), served "
                  f"{served['tokens_per_s']:,.0f} tokens/s: {served['tokens_per_s'] / best['tokens_per_s']:.2f}x; "
                  f"same lengths {same}/{len(best['counts'])}", flush=True)
    page = render(args, argv, rounds)
    if args.out:
        Path(args.out).write_text(page, encoding="utf-8")
    print(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
