"""Exact-token parity of the serving paths on a whole test set, through a real server.

    python -m benchmarks.serving_parity [--src-file ../shared/data/multi30k/test_2016_flickr.en] \\
        [--decoders inplace,copy] [--beam 5] [--variant fp32|int8] [--engine-core thread|process]
        [--out docs/benchmarks/serving_parity.md]

For each --decoders value it starts `python -m server --decoder D` on loopback and
collects the token ids of every sentence four ways:

  batched   Translate calls of 64 texts, 4 in flight: the continuous batch full of strangers
  alone     one Translate call per sentence, one at a time
  stream    TranslateStream per sentence, 64 in flight, the streamed ids concatenated
  beam      beam --beam, batched vs alone (a beam occupies --beam rows next to others)

and compares them with each other and with PyTorch's own greedy decode of the
checkpoint (models/search.py, one sentence at a time), the reference every path must equal. Any
difference is listed with the sentence. Exits non-zero if a pair differs.

--variant int8 serves the int8 graphs: they are not meant to equal PyTorch's fp32 tokens, so
there the reference is the int8 server itself, one sentence at a time ("alone"): batched,
streamed and beam-in-a-batch must equal it (per-row activation scales, export/quantize.py).

The report is one page with a section per configuration (variant, decoder graphs, engine layout): a
run rewrites its own section, with its command, date and machine, and keeps the others, so the page
always holds the latest run of each configuration.
"""
from __future__ import annotations

import argparse
import asyncio
import platform
import sys
import time
from pathlib import Path
from typing import Sequence

from benchmarks.harness import TEST_SOURCES, ServerProcess, date_line, machine_line, wait_serving

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "models/pretrained/multi30k-en-de-small/model.pt"
INTRO = ["# Serving parity on the whole test set", "",
         "What it measures: token ids through a real server (`python -m server --decoder D`) on loopback,",
         "compared path by path on all 1,000 sentences of test_2016_flickr.en. The reference is PyTorch's",
         "greedy decode of the checkpoint, one sentence at a time (fp32), or the int8 server alone, one",
         "sentence at a time (int8). One section per configuration, each the latest run of it (`python -m",
         "benchmarks.serving_parity` rewrites its own section).", ""]


def write_section(out: Path, heading: str, body: list[str]) -> None:
    """Replace the section titled `heading` in the page (or add it), keeping the other sections."""
    sections: dict[str, list[str]] = {}
    if out.exists():
        current = None
        for line in out.read_text().splitlines():
            if line.startswith("## "):
                current = line
                sections[current] = []
            elif current is not None:
                sections[current].append(line)
    sections[heading] = body
    lines = list(INTRO)
    for title, rest in sections.items():
        while rest and not rest[-1].strip():
            rest = rest[:-1]
        lines += [title, *rest, ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


def torch_greedy(texts: list[str]) -> list[list[int]]:
    """PyTorch greedy, one sentence at a time: padded PyTorch batches are not a reference, they
    change near-tied choices (2 of the 1,000 test sentences, both runaway loops, decode
    differently in a padded batch of 64 than alone)."""
    import torch

    from models import search
    from models.evaluate import load_checkpoint
    model, tok, _ = load_checkpoint(CKPT)
    model.eval()
    with torch.no_grad():
        return [list(search.greedy(model, torch.tensor([tok.encode(t)]))[0]) for t in texts]


async def collect(target: str, texts: list[str], beam: int) -> dict[str, list[list[int]]]:
    from client.client import AsyncTranslatorClient
    async with AsyncTranslatorClient(target, timeout=600, retries=0) as client:
        await wait_serving(client)

        async def batched(**opts) -> list[list[int]]:
            chunks = [texts[i:i + 64] for i in range(0, len(texts), 64)]
            sem = asyncio.Semaphore(4)

            async def one(chunk):
                async with sem:
                    resp = await client.translate(chunk, return_tokens=True, **opts)
                    return [list(t.hypotheses[0].token_ids) for t in resp.translations]
            return [ids for part in await asyncio.gather(*(one(c) for c in chunks)) for ids in part]

        async def alone(**opts) -> list[list[int]]:
            out = []
            for t in texts:
                resp = await client.translate([t], return_tokens=True, **opts)
                out.append(list(resp.translations[0].hypotheses[0].token_ids))
            return out

        async def streamed() -> list[list[int]]:
            sem = asyncio.Semaphore(64)

            async def one(t):
                async with sem:
                    ids: list[int] = []
                    async for msg in client.translate_stream(t):
                        ids += list(msg.token_ids)
                    return ids
            return list(await asyncio.gather(*(one(t) for t in texts)))

        got = {"batched": await batched(), "alone": await alone(), "stream": await streamed()}
        if beam > 1:
            got[f"beam{beam} batched"] = await batched(beam_size=beam)
            got[f"beam{beam} alone"] = await alone(beam_size=beam)
        return got


def compare(a: list[list[int]], b: list[list[int]]) -> list[int]:
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src-file", default=str(TEST_SOURCES))
    p.add_argument("--decoders", type=lambda s: s.split(","), default=["inplace", "copy"])
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--variant", default="fp32", choices=["fp32", "int8"], help="bundle variant the server runs")
    p.add_argument("--int8-activations", default="auto", choices=["auto", "static", "row"],
                   help="with --variant int8: the server's --int8-activations (which int8 graphs it serves)")
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    p.add_argument("--engine-core", default="thread", choices=["thread", "process"],
                   help="server --engine-core: the engine in the server's process or in a core process")
    p.add_argument("--out", default=str(ROOT / "docs/benchmarks/serving_parity.md"),
                   help="the page whose section for this configuration the run rewrites")
    args = p.parse_args(argv)
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    texts = texts[:args.limit] if args.limit else texts
    t0 = time.monotonic()
    reference = None  # int8: the server alone is the reference (module docstring)
    if args.variant == "fp32":
        print(f"PyTorch greedy on {len(texts)} sentences", file=sys.stderr, flush=True)
        reference = torch_greedy(texts)
    rows, failed = [], False
    for decoder in args.decoders:
        # The reference has no runaway guard; what the guard changes (loops only) is measured by
        # benchmarks/runaway.py.
        server = ServerProcess("--decoder", decoder, "--max-queue-size", "4096", "--runaway-guard", "false",
                               "--variant", args.variant, "--int8-activations", args.int8_activations,
                               "--engine-core", args.engine_core).launch()
        try:
            print(f"server --decoder {decoder}", file=sys.stderr, flush=True)
            got = asyncio.run(collect(server.target, texts, args.beam))
            served = "/".join(sorted(set(server.served_variants().values())))
        finally:
            server.stop()
        if reference is not None:
            pairs = [("batched", "PyTorch greedy", got["batched"], reference),
                     ("alone", "PyTorch greedy", got["alone"], reference)]
        else:
            pairs = [("batched", "alone", got["batched"], got["alone"])]
        pairs.append(("stream", "batched", got["stream"], got["batched"]))
        if args.beam > 1:
            pairs.append((f"beam{args.beam} batched", f"beam{args.beam} alone", got[f"beam{args.beam} batched"],
                          got[f"beam{args.beam} alone"]))
        for name_a, name_b, a, b in pairs:
            diff = compare(a, b)
            failed |= bool(diff)
            rows.append((f"{decoder} {served}" + (" (engine core process)" if args.engine_core == "process"
                                                         else ""), name_a, name_b, len(texts) - len(diff), len(texts),
                         ", ".join(str(i) for i in diff[:10])))
            print(f"  {name_a} vs {name_b}: {len(texts) - len(diff)}/{len(texts)} identical", file=sys.stderr)
    variant = args.variant if args.variant == "fp32" or args.int8_activations == "auto" else \
        f"int8 (activations {args.int8_activations})"
    heading = (f"## {variant}, decoders {','.join(args.decoders)}, engine "
               + ("core process" if args.engine_core == "process" else "thread"))
    lines = ["", f"Command: `python -m benchmarks.serving_parity {' '.join(argv)}` ({time.monotonic() - t0:.0f} s)", "",
             date_line(), "", machine_line(f"Python {platform.python_version()}"), "",
             "| decoder graph | path | compared with | identical | of | first differing sentences |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {d} | {a} | {b} | {same} | {n} | {diff or '-'} |" for d, a, b, same, n, diff in rows]
    lines += ["", f"Verdict: **{'FAIL' if failed else 'PASS'}**.", ""]
    out = Path(args.out)
    write_section(out, heading, lines)
    print("\n".join([heading, *lines]))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
