"""Choose and check the runaway guard's bounds (server/core/runaway.py) on real outputs.

    python -m benchmarks.runaway [--bundle model_repository/multi30k-en-de-small/4] \\
        [--ood ../shared/data/tatoeba-fra-eng/fra-eng.tsv] [--out docs/runaway.md]

Decodes the whole test_2016_flickr set (greedy and beam 5, as the server would) with the
static ONNX decoder, which gives the server's tokens (docs/benchmarks/serving_parity.md),
and reports, for every n-gram size, the longest back-to-back repetition any output
contains, and how many outputs the default guard would have cut (must be 0). Then does
the same on out-of-domain English (Tatoeba sentences, not captions), where the model
loops, to show what the guard stops and how many tokens it saves.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import asyncio

import sacrebleu

from benchmarks.harness import TEST_SOURCES, ServerProcess, wait_serving
from client.client import AsyncTranslatorClient
from models.core import static_decode
from models.core.bundle import load_bundle, newest_version
from models.core.runtime import OnnxModel, RuntimeOptions
from models.core.bundle_tokenizer import load_tokenizer
from protos.nmt.v1 import translator_pb2 as pb
from server.core.runaway import RunawayGuard, longest_loop

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def decode_all(model: OnnxModel, tok, texts: list[str], beam: int) -> list[tuple[list[int], list[int]]]:
    """(source ids, output ids) per text; batches of similar length, as the server's length groups."""
    encoded = [tok.encode(t) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    out: list = [None] * len(texts)
    for start in range(0, len(order), 32):
        idx = order[start:start + 32]
        ids, mask = static_decode.pad_batch([encoded[i] for i in idx], model.spec.pad_id)
        if beam > 1:
            results = [h[0].tokens for h in static_decode.beam_search(model, ids, mask, beam=beam)]
        else:
            results = static_decode.greedy(model, ids, mask)
        for i, res in zip(idx, results):
            out[i] = (encoded[i], list(res))
    return out


def cut_by(guard: RunawayGuard, src: list[int], out: list[int]) -> int:
    """Tokens the server returns (len(out) when the guard never trips): where it trips, the output
    up to the loop's first occurrence, its repeats dropped (server/core/scheduler.py's settled length)."""
    settled = 0
    for t in range(1, len(out) + 1):
        tripped, tail = guard.check(out[:t], len(src))
        settled = max(settled, t - tail)
        if tripped:
            return settled
    return len(out)


def report(name: str, pairs, guard: RunawayGuard, tok, texts: list[str]) -> list[str]:
    worst = {n: 0 for n in range(1, guard.max_ngram + 1)}
    cut, saved, examples = 0, 0, []
    for (src, out), text in zip(pairs, texts):
        for n, k in longest_loop(out, guard.max_ngram).items():
            worst[n] = max(worst[n], k)
        kept = cut_by(guard, src, out)
        if kept < len(out):
            cut += 1
            saved += len(out) - kept
            if len(examples) < 5:
                examples.append(f"  - `{text}` → `{tok.decode(out)[:120]}` (stopped, {kept} of {len(out)} tokens kept,"
                                f" the loop's repeats dropped: `{tok.decode(out[:kept])[-60:]}`)")
    lines = [f"| {name} | {len(pairs)} | " + " / ".join(str(worst[n]) for n in sorted(worst))
             + f" | {cut} | {saved} |"]
    return lines + (["", f"{name}, outputs the guard stops:", ""] + examples + [""] if examples else [])


async def _served(target: str, texts: list[str], beam: int) -> tuple[list[str], int]:
    """Translations of texts through a real server, each sentence alone (split off); and how many
    finished RUNAWAY."""
    async with AsyncTranslatorClient(target, timeout=600) as client:
        await wait_serving(client)
        calls = [client.translate(texts[i:i + 50], beam_size=beam, split_sentences="off")
                 for i in range(0, len(texts), 50)]
        replies = await asyncio.gather(*calls)
    out = [t for r in replies for t in r.translations]
    return [t.hypotheses[0].text for t in out], sum(t.finish_reason == pb.FINISH_REASON_RUNAWAY for t in out)


def server_check(texts: list[str], refs: list[str], bundle: Path) -> list[str]:
    """The test set through `python -m server` with the guard on and off: what changes, and BLEU.
    The server serves the repository the bundle is in, with the bundle's model as the default (so
    the newest version of that model, which the bundle is unless an older one was named)."""
    results = {}
    for guard in ("true", "false"):
        server = ServerProcess("--runaway-guard", guard, "--max-queue-size", "4096",
                               "--max-sentences-per-request", "64", "--model-repository", str(bundle.parent.parent),
                               "--default-model", bundle.parent.name, metrics=False).launch()
        try:
            for beam in (1, 5):
                print(f"server, guard {guard}, beam {beam}", flush=True)
                results[guard, beam] = asyncio.run(_served(server.target, texts, beam))
        finally:
            server.stop()
    lines = ["", "Through the server (`python -m server --runaway-guard true|false`, test_2016_flickr, each sentence "
             "its own text), sacreBLEU against the references:", "",
             "| decoding | outputs that differ | finished RUNAWAY | BLEU guard on | BLEU guard off |", "|---|---|---|---|---|"]
    for beam in (1, 5):
        (on, stopped), (off, _) = results["true", beam], results["false", beam]
        differ = [i for i, (a, b) in enumerate(zip(on, off)) if a != b]
        lines.append(f"| {'greedy' if beam == 1 else f'beam {beam}'} | {len(differ)} (lines {differ[:8]}) | {stopped} | "
                     f"{sacrebleu.corpus_bleu(on, [refs]).score:.2f} | {sacrebleu.corpus_bleu(off, [refs]).score:.2f} |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(newest_version(ROOT / "model_repository" / "multi30k-en-de-small")))
    p.add_argument("--test-src", default=str(TEST_SOURCES))
    p.add_argument("--ood", default=str(DATA / "tatoeba-fra-eng" / "fra-eng.tsv"),
                   help="out-of-domain English, one sentence per line (or a tab-separated file: first column)")
    p.add_argument("--ood-lines", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(ROOT / "docs" / "runaway.md"))
    args = p.parse_args()
    bundle = load_bundle(Path(args.bundle))
    tok = load_tokenizer(bundle.tokenizer_entry, bundle.path)
    model = OnnxModel(bundle, RuntimeOptions(intra_op_threads=args.threads))
    guard = RunawayGuard()
    test = Path(args.test_src).read_text().splitlines()
    ood_lines = [line.split("\t")[0].strip() for line in Path(args.ood).read_text().splitlines() if line.strip()]
    ood = ood_lines[::max(1, len(ood_lines) // args.ood_lines)][:args.ood_lines]  # the file runs short to long
    rows, t0 = [], time.perf_counter()
    for name, texts, beam in (("test_2016_flickr, greedy", test, 1), ("test_2016_flickr, beam 5", test, 5),
                              ("Tatoeba English (out of domain), greedy", ood, 1)):
        print(f"decoding {name} ({len(texts)} texts)", flush=True)
        rows += report(name, decode_all(model, tok, texts, beam), guard, tok, texts)
    head = [
        "# The runaway guard's bounds", "",
        f"`python -m benchmarks.runaway` ({time.perf_counter() - t0:.0f} s). Model: `{bundle.name}` "
        f"({args.bundle}), fp32, static ONNX decoder (the server's tokens). Guard defaults: n-grams of 1–"
        f"{guard.max_ngram} tokens repeated back to back over ≥ {guard.min_span} tokens and ≥ "
        f"{guard.min_repeats} times, or more than {guard.length_ratio:g} × source tokens + {guard.length_slack}.",
        "",
        "| outputs | texts | longest back-to-back repeat, n = 1 / 2 / 3 / 4 / 5 / 6 | outputs the guard would cut | "
        "tokens it saves |",
        "|---|---|---|---|---|"]
    refs = Path(args.test_src).with_suffix(".de").read_text().splitlines()
    rows += server_check(test, refs, Path(args.bundle).resolve())
    Path(args.out).write_text("\n".join(head + rows) + "\n")
    print("\n".join(head + rows))


if __name__ == "__main__":
    main()
