"""An OPUS-MT-sized Marian model served by us vs by CTranslate2 (its own ct2-transformers-converter).

    python -m benchmarks.hf_compare [--concurrency 1,8,32] [--tokens 48] [--repeats 2] \\
        [--out docs/benchmarks/hf_compare.md]

The model has Helsinki-NLP/opus-mt-en-de's shape (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish,
58,101-token joint vocabulary, final_logits_bias) with random weights: this machine cannot download
the real one, and speed does not depend on the values. EOS and pad get a -1e4 logits bias, so every
text decodes exactly its output budget on both servers (the shared rule 1.5 x source tokens + 10;
no forced EOS), equal lengths on both sides. The same Hugging
Face directory goes through `python -m export --from-huggingface` (ours) and
`ct2-transformers-converter` (CTranslate2, float32); both servers are driven by the same client code in
serving_compare's rotation (all up at once, each load served to each in turn: run_rotation); the share of
texts both decode to the same tokens (50 texts) is reported.

--precision int8 serves int8 on both sides, as LibreTranslate deployments run CTranslate2: ours exported with
`--int8`, calibrated on Multi30k's validation captions (int8-static, the graphs `--variant int8` serves), plus
the row-wise int8 as a third contender (`ours:row`, `--int8-activations row`); the peer's compute_type int8 on
the same converted weights. The report adds how many of the 50 texts our int8 decodes to our fp32's tokens.
The peer is tuned as CTranslate2 advises: every --ct2-configs setting (replicas x intra-op threads,
texts per batch, GEMM library; serving_compare's notation) runs in the same rotation and each load is compared
with the best of them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Sequence

import torch

from benchmarks.serving_compare import (WARM_S, best_ct2, check_ct2_configs, default_ct2_configs, median_of,
                                        paired_range, run_rotation, start_all, start_peer, stop_all)
from benchmarks.harness import ServerProcess, date_line, machine_line, wait_serving

ROOT = Path(__file__).resolve().parents[1]
CAPTIONS = ROOT / "tests/data/test_2016_flickr.head200.en"
CALIBRATION = ROOT.parent / "shared/data/multi30k/val.en"  # validation captions: calibration reads no test data
OPUS_MT = dict(d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
               encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512, vocab_size=58101)


def build_model(out: Path) -> Path:
    """A Hugging Face MarianMT directory of OPUS-MT's size (random weights, EOS/pad never chosen)."""
    import sentencepiece as spm
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(input=str(CAPTIONS), model_prefix=str(out / "spm"), vocab_size=600,
                                   minloglevel=2, bos_id=-1, eos_id=-1, unk_id=0, num_threads=1)
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        vocab.setdefault(sp.id_to_piece(i), len(vocab))
    while len(vocab) < OPUS_MT["vocab_size"] - 1:  # the real vocabulary's size; unused ids never come up
        vocab[f"\u2581filler{len(vocab)}"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    tok = MarianTokenizer(source_spm=str(out / "spm.model"), target_spm=str(out / "spm.model"),
                          vocab=str(out / "vocab.json"), source_lang="en", target_lang="de")
    pad = vocab["<pad>"]
    cfg = MarianConfig(**OPUS_MT, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
                       forced_eos_token_id=None, activation_function="swish", scale_embedding=True,
                       share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias[0, [0, pad]] = -1e4  # equal lengths: EOS (and pad) never win
    model.save_pretrained(out / "hf")
    tok.save_pretrained(out / "hf")
    return out / "hf"


def prepare(work: Path, precision: str) -> dict:
    hf = build_model(work / "marian")
    repo = work / "repo"
    int8 = ["--int8", "--calibration-text", str(CALIBRATION)] if precision == "int8" else []
    subprocess.run([sys.executable, "-m", "export", "--from-huggingface", str(hf), "--out", str(repo),
                    "--name", "opus-mt-shaped", *int8], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    ct2 = work / "ct2"
    subprocess.run(["ct2-transformers-converter", "--model", str(hf), "--output_dir", str(ct2), "--force"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"repo": str(repo), "ct2": str(ct2), "bundle": str(repo / "opus-mt-shaped" / "1")}


def start(kind: str, paths: dict, args) -> tuple[Callable[[], object], int, str]:
    """The server of `kind` launched: (how to stop it, its pid, its target)."""
    if kind.startswith("ours"):
        activations = kind.partition(":")[2] or "auto"  # ours:row = the row-wise int8
        server = ServerProcess("--model-repository", paths["repo"], "--max-queue-size", "4096",
                               "--max-batch-size", str(args.max_batch_size), "--variant", args.precision,
                               "--int8-activations", activations,
                               "--runaway-guard", "false",  # random weights with EOS suppressed loop by design
                               metrics=False).launch()
        return (lambda: server.stop(timeout=30)), server.pid, server.target
    return start_peer(kind.partition(":")[2] or f"1x{args.ct2_threads}", args.max_batch_size,
                      "float32" if args.precision == "fp32" else "int8", "--model", paths["ct2"],
                      "--bundle", paths["bundle"])


def fp32_agreement(bundle: str, texts: list[str], n: int, got: list[list[int]]) -> int:
    """How many of `got` (our int8 server's tokens for `texts`, n each) equal our fp32 graphs' greedy tokens."""
    from models.core.bundle import load_bundle
    from models.core.bundle_tokenizer import load_tokenizer
    from models.core.runtime import OnnxModel, RuntimeOptions
    from models.core.static_decode import greedy, pad_batch

    config = load_bundle(Path(bundle))
    tok = load_tokenizer(config.tokenizer_entry, config.path)
    fp32 = OnnxModel(config, RuntimeOptions(variant="fp32", provider="cpu"))
    ids = [tok.encode(t) for t in texts]
    want = []
    for i in range(0, len(ids), 16):
        want += greedy(fp32, *pad_batch(ids[i:i + 16], config.spec.pad_id), max_len=n)
    return sum(list(a) == list(b) for a, b in zip(got, want))


async def tokens_of(target: str, texts: list[str], n: int) -> list[list[int]]:
    from client.client import AsyncTranslatorClient
    async with AsyncTranslatorClient(target, timeout=600, retries=0) as client:
        await wait_serving(client)
        resp = await client.translate(texts, return_tokens=True, max_output_tokens=n)
        return [list(t.hypotheses[0].token_ids) for t in resp.translations]


def render(res: dict, args, argv: list[str], same: int, n_same: int, to_fp32: int | None = None) -> str:
    ours, base = res["ours"], best_ct2(res)
    peers = [k for k in res if k.startswith("ct2:")]
    title = "" if args.precision == "fp32" else ", int8 on both sides"
    lines = ["# An OPUS-MT-sized Marian model: our server vs CTranslate2" + title, "",
             f"Command: `python -m benchmarks.hf_compare {shlex.join(argv)}`", "",
             date_line(), "",
             machine_line("both servers and the client share it"), "",
             "Every server up at once, each idle while another is measured; each load served to every server in "
             f"turn, back to back (the order rotated by repeat): {WARM_S:g} s of it unmeasured, then {args.seconds:g} s "
             f"measured. Cells are medians of {args.repeats} repeats; \"per repeat\" is the range of each repeat's "
             "own ratio. Greedy over the first 200 test_2016_flickr captions, every text decoding its whole output "
             "budget (EOS never wins: see the module docstring).", "",
             f"Same tokens: {same}/{n_same} texts identical between the two servers ({args.precision})."
             + ("" if to_fp32 is None else f" Our int8 against our fp32 graphs: {to_fp32}/{n_same} texts identical."),
             "",
             "CT2 = benchmarks/ct2_server.py at its best setting for each load, out of "
             f"{', '.join(f'`{c}`' for c in args.ct2_configs)} (replicas x intra-op threads each, `-bB` texts per "
             "batch, `@GEMM` a GEMM library other than CTranslate2's own choice; all in the same rotation).", "",
             "| load | ours tok/s | CT2 best tok/s (setting) | ours / CT2 | per repeat | TTFT p50 ours / CT2 (ms) | "
             "server CPU µs/token ours / CT2 | CT2 tok/s by setting |", "|---|---|---|---|---|---|---|---|"]
    for c in ours["streams"]:
        o, b = ours["streams"][c], base["streams"][c]
        each = ", ".join(f"{res[k]['streams'][c]['tokens_per_s']:,.0f}" for k in peers)
        lines.append(f"| {c} streams | {o['tokens_per_s']:,.0f} | {b['tokens_per_s']:,.0f} (`{b['setting']}`) | "
                     f"**{o['tokens_per_s'] / b['tokens_per_s']:.2f}** | {paired_range(o['per_repeat'], b['per_repeat'])} | "
                     f"{o['ttft_p50_ms']:.0f} / "
                     f"{b['ttft_p50_ms']:.0f} | {o['cpu_us_per_token']:.0f} / {b['cpu_us_per_token']:.0f} | {each} |")
    each = ", ".join(f"{res[k]['unary_tokens_per_s']:,.0f}" for k in peers)
    lines.append(f"| unary, {args.unary_texts} texts x {args.unary_clients} clients | "
                 f"{ours['unary_tokens_per_s']:,.0f} | {base['unary_tokens_per_s']:,.0f} (`{base['unary_setting']}`) | "
                 f"**{ours['unary_tokens_per_s'] / base['unary_tokens_per_s']:.2f}** | "
                 f"{paired_range(ours['unary_per_repeat'], base['unary_per_repeat'])} | | "
                 f"{ours['unary_cpu_us_per_token']:.0f} / {base['unary_cpu_us_per_token']:.0f} | {each} |")
    if "ours:row" in res:  # the two int8s of ours, same rotation
        row = res["ours:row"]
        lines += ["", "Our two int8s (same rotation): int8-static (`ours`, what `--variant int8` serves) and the "
                  "row-wise int8 (`ours:row`, `--int8-activations row`).", "",
                  "| load | int8-static tok/s | row-wise tok/s | static / row | per repeat |", "|---|---|---|---|---|"]
        for c in ours["streams"]:
            o, r = ours["streams"][c], row["streams"][c]
            lines.append(f"| {c} streams | {o['tokens_per_s']:,.0f} | {r['tokens_per_s']:,.0f} | "
                         f"{o['tokens_per_s'] / r['tokens_per_s']:.2f} | "
                         f"{paired_range(o['per_repeat'], r['per_repeat'])} |")
        lines.append(f"| unary | {ours['unary_tokens_per_s']:,.0f} | {row['unary_tokens_per_s']:,.0f} | "
                     f"{ours['unary_tokens_per_s'] / row['unary_tokens_per_s']:.2f} | "
                     f"{paired_range(ours['unary_per_repeat'], row['unary_per_repeat'])} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--tokens", type=int, default=48, help="tokens decoded per text in the same-tokens check")
    p.add_argument("--seconds", type=float, default=20.0,
                   help="measured seconds per load and server (after 1 s of it unmeasured)")
    p.add_argument("--unary-texts", type=int, default=32)
    p.add_argument("--unary-clients", type=int, default=2)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--ct2-threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--ct2-configs", type=lambda s: s.split(","), default=None,
                   help="the peer's settings in the rotation, serving_compare's notation (default: one replica "
                        "on every core, a replica per core, a replica per core with batches split)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--precision", default="fp32", choices=["fp32", "int8"],
                   help="int8: our int8 (int8-static, and the row-wise int8 as ours:row) against CTranslate2's int8")
    p.add_argument("--out", default=None, help="default docs/benchmarks/hf_compare.md (int8: marian_int8_vs_ct2.md)")
    args = p.parse_args(argv)
    args.out = args.out or str(ROOT / "docs/benchmarks" / ("hf_compare.md" if args.precision == "fp32"
                                                          else "marian_int8_vs_ct2.md"))
    args.ct2_configs = args.ct2_configs or default_ct2_configs(os.cpu_count() or 2, args.max_batch_size)
    check_ct2_configs(p, args.ct2_configs, args.max_batch_size)
    texts = [t for t in CAPTIONS.read_text().splitlines() if t.strip()]
    with tempfile.TemporaryDirectory(prefix="hf-compare-") as tmp:
        print("building the model, exporting it and converting it for CTranslate2", file=sys.stderr, flush=True)
        paths = prepare(Path(tmp), args.precision)
        peers = [f"ct2:{c}" for c in args.ct2_configs]
        ours = ("ours", "ours:row") if args.precision == "int8" else ("ours",)
        servers = start_all((*ours, *peers), lambda kind: start(kind, paths, args))
        try:
            a, b = (asyncio.run(tokens_of(servers[k][2], texts[:50], args.tokens)) for k in ("ours", peers[0]))
            same = sum(x == y for x, y in zip(a, b))
            to_fp32 = fp32_agreement(paths["bundle"], texts[:50], args.tokens, a) if args.precision == "int8" else None
            print(f"same tokens: {same}/50; int8 = our fp32: {to_fp32}/50", file=sys.stderr, flush=True)
            runs = run_rotation(servers, texts, args)
        finally:
            stop_all(servers)
    res = {k: median_of(v) for k, v in runs.items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(res, args, argv, same, 50, to_fp32))
    (out.with_suffix(".json")).write_text(json.dumps({"runs": runs, "median": res}, indent=1, default=str))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
