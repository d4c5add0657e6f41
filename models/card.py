"""Write a model card from a training run, its checkpoint and the measured quality.

    python -m models.card --checkpoint models/pretrained/multi30k-en-de-small/model.pt \\
        --train-log runs/en-de-small/train.jsonl --quality docs/quality.json \\
        --out models/pretrained/multi30k-en-de-small/MODEL_CARD.md

Every figure in the card comes from those files; nothing is typed in by hand.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Sequence

import torch

from models.core.config import ModelConfig
from models.data import MULTI30K_COMMIT, MULTI30K_SHA256
from models.train import SHAPE_FLAGS
from models.transformer import Transformer


def command_of(args: dict) -> str:
    flags = []
    for key, value in args.items():
        # Thread counts and resumption change speed, not the result (seeded, deterministic batches).
        if key in ("resume", "threads") or value is None or value is False:
            continue
        flag = SHAPE_FLAGS.get(key, "--" + key.replace("_", "-"))  # their dest differs from the flag
        flags.append(flag if value is True else f"{flag} {value}")
    return "python -m models.train " + " ".join(flags)


def stages_of(log: list[dict], meta: dict) -> list[tuple[str, dict]]:
    """(command, start row) of every stage in the log, in order: a run, then any run continuing its
    weights (--init-from) where it stopped. Restarts with --resume repeat their stage's command."""
    starts = [(command_of(r["args"]), r) for r in log if r["kind"] == "start"]
    stages = [st for i, st in enumerate(starts) if i == 0 or st[0] != starts[i - 1][0]]
    return stages or [(command_of(meta["args"]), {"step": 0, "epoch": 1})]


def training_lines(log: list[dict], meta: dict) -> list[str]:
    stages = stages_of(log, meta)
    if len(stages) == 1:
        return [f"- Command: `{stages[0][0]}`"]
    return ["- Commands, in stages (a stage with --init-from continues the previous stage's weights, its step "
            "and epoch count, with a fresh optimizer):",
            *[f"  {i + 1}. `{cmd}`" + (f" (from epoch {row['epoch']}, step {row['step']})" if row["step"] else "")
              for i, (cmd, row) in enumerate(stages)]]


def checkpoint_line(meta: dict, epochs: int) -> str:
    if "averaged_from" in meta:
        return (f"- Checkpoint: the weights averaged over {', '.join(meta['averaged_from'])} "
                f"(of {epochs} epochs), chosen on the validation set (table below).")
    return f"- Checkpoint: epoch {meta['epoch']} (step {meta['step']}), the best of {epochs} epochs by validation BLEU."


def selection_table(rows: list[dict]) -> list[str]:
    """Candidates scored on val.* with models.evaluate --json."""
    if not rows:
        return []
    out = ["", "Checkpoint and decoding selection on the validation set (never on test):", "",
           "| run / checkpoint | beam | length penalty | val BLEU |", "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {Path(r['checkpoint']).parent.name}/{Path(r['checkpoint']).name} | {r['beam']} | {r['alpha']} | {r['bleu']:.2f} |")
    return out


LANGUAGE_NAMES = {"en": "English", "de": "German", "fr": "French"}


SHAPE_ARGS = {"d_model": "d_model", "n_heads": "heads", "n_enc_layers": "encoder layers",
              "n_dec_layers": "decoder layers", "d_ff": "FFN"}


def shape_note(args: dict) -> str:
    """', its shape overridden (d_model 128, ...)' when the run's flags changed the preset's dimensions."""
    changed = [f"{label} {args[key]}" for key, label in SHAPE_ARGS.items() if args.get(key) is not None]
    return f", its shape overridden ({', '.join(changed)})" if changed else ""


def render(state: dict, log: list[dict], quality: dict, name: str, selection: list[dict] | None = None,
           quality_file: str = "docs/quality.json") -> str:
    cfg = ModelConfig.from_dict(state["config"])
    meta = state["meta"]
    src, tgt = meta.get("src_lang", "en"), meta.get("tgt_lang", "de")
    params = Transformer(cfg).num_parameters()
    epochs = [r for r in log if r["kind"] == "epoch"]
    train_s = sum(r["train_seconds"] for r in epochs)
    best = max(epochs, key=lambda r: r["val_bleu"])
    tps = [r["tok_per_s"] for r in log if r["kind"] == "train"]
    q = quality
    beam_key = f"beam{q['beam']}"
    lines = [
        f"# Model card: {name}",
        "",
        f"{LANGUAGE_NAMES.get(src, src)}→{LANGUAGE_NAMES.get(tgt, tgt)} translation, trained from scratch on "
        f"Multi30k (task 1) with this repository's "
        f"`{meta.get('preset', '?')}` preset{shape_note(meta['args'])}.",
        "",
        "## Model",
        "",
        f"- Encoder-decoder Transformer, pre-norm={cfg.pre_norm}, d_model {cfg.d_model}, {cfg.n_heads} heads, "
        f"{cfg.n_enc_layers}+{cfg.n_dec_layers} layers, FFN {cfg.d_ff}, ReLU, sinusoidal positions, tied "
        f"embeddings; dropout {cfg.dropout}, attention dropout {cfg.attn_dropout}.",
        f"- {params:,} parameters; joint BPE vocabulary of {cfg.vocab_size} pieces (`tokenizer.json`, "
        "HF tokenizers, NFC + whitespace normalisation, ▁ word marker).",
        checkpoint_line(meta, len(epochs)),
        "",
        "## Training",
        "",
        *training_lines(log, meta),
        f"- Time: {train_s / 60:.0f} minutes of training steps over {len(epochs)} epochs on a 2-core CPU "
        f"({meta['args'].get('precision', 'fp32')}{' autocast' if meta['args'].get('precision') == 'bf16' else ''}, "
        f"{meta['args'].get('threads') or 'default'} thread(s)), {min(tps):,}–{max(tps):,} target tokens/s; validation "
        "after each epoch not counted."
        + (f" The run was stopped after epoch {epochs[-1]['epoch']} of the {meta['args']['epochs']} it was started for "
           "(the session's time ran out; the schedule does not depend on the total)."
           if epochs[-1]["epoch"] < meta["args"].get("epochs", epochs[-1]["epoch"]) else ""),
        "- Data: Multi30k task 1 raw (`train`, validation on `val`), upstream commit "
        f"`{MULTI30K_COMMIT[:7]}`. SHA-256 of the files used:",
        "",
        "```",
        *[f"{MULTI30K_SHA256[f]}  {f}" for f in (f"train.{src}", f"train.{tgt}", f"val.{src}", f"val.{tgt}",
                                                  f"test_2016_flickr.{src}", f"test_2016_flickr.{tgt}")],
        "```",
        "",
        f"- Best validation BLEU (greedy, during training): {best['val_bleu']:.2f} at epoch {best['epoch']}.",
        "- Training curve: `curve.png` beside this card; the log: `train.jsonl`.",
        *selection_table(selection or []),
        "",
        f"## Quality on test_2016_flickr ({q['sentences']:,} sentences)",
        "",
        f"sacreBLEU signature: `{q['signature']}` (cased, detokenised output against the raw references).",
        "",
        "| decoder | greedy BLEU | beam BLEU | tokens identical to PyTorch (greedy / beam) |",
        "|---|---|---|---|",
        f"| PyTorch (models/search.py) | {q['pytorch']['greedy']:.2f} | {q['pytorch'][beam_key]:.2f} | — |",
    ]
    for variant in [v for v in ("fp32", "int8", "int8-vnni", "int8-static") if f"onnx_{v}_greedy" in q]:
        g, b = q[f"onnx_{variant}_greedy"], q[f"onnx_{variant}_{beam_key}"]
        lines.append(f"| ONNX Runtime {variant} + numpy (models/core/static_decode.py) | {g['bleu']:.2f} | {b['bleu']:.2f} | "
                     f"{100 * g['identical_to_pytorch']:.1f}% / {100 * b['identical_to_pytorch']:.1f}% |")
    drop = q[f"onnx_fp32_{beam_key}"]["bleu"] - q[f"onnx_int8_{beam_key}"]["bleu"]
    lines += [
        "",
        f"Beam search: width {q['beam']}, length penalty α = {q['alpha']} (score = log-prob / length^α).",
        f"int8 (7-bit weights per output channel, 8-bit activations per row, so a sentence's output does not depend on "
        f"its batch; every product of the encoder, and the decoder step's products of at least 2^18 weights, here the "
        f"vocabulary projection, the smaller ones staying fp32 where quantising the row costs more than the int8 "
        f"product saves: export/quantize.py): BLEU change {-drop:+.2f} with beam search; "
        f"greedy decoding of the test set at batch 32 ran at {q['int8_speedup_greedy_b32']:.2f}× fp32's speed "
        "(same decoder, same process, one timed pass; docs/serving_speed.md has the served comparison).",
        *(["int8-vnni: the same with 8-bit weights, exact on a CPU with VNNI or AMX only; `--variant int8` serves it "
           "on such a CPU with `--int8-activations row` or `--int8-weights 8` (export/quantize.py)."]
          if "onnx_int8-vnni_greedy" in q else []),
        *([f"int8-static: 7-bit weights and every product in int8, each activation quantised by a constant range "
           f"calibrated at export on the model's own greedy decoding of validation sentences (export/calibrate.py, "
           f"export/quantize_static.py; batch-invariant by construction): BLEU change "
           f"{q[f'onnx_int8-static_{beam_key}']['bleu'] - q[f'onnx_fp32_{beam_key}']['bleu']:+.2f} with beam "
           f"search, {q['onnx_int8-static_greedy']['bleu'] - q['onnx_fp32_greedy']['bleu']:+.2f} greedy; "
           "`--variant int8` serves it where the bundle has it (`--int8-activations`; its speed: docs/export.md)."]
          if "onnx_int8-static_greedy" in q else []),
        f"Measured by `python -m export.quality` (see {quality_file}).",
        "",
        "## Intended use and limits",
        "",
        "- Short, literal image-caption-style English sentences (the Multi30k domain). Expect poor output on "
        "other domains, long documents, or informal text.",
        "- Multi30k is for non-commercial research and education (its images come from Flickr); the model "
        "inherits that restriction.",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--train-log", required=True)
    p.add_argument("--quality", required=True)
    p.add_argument("--name", default="multi30k-en-de-small")
    p.add_argument("--selection", help="JSON lines of models.evaluate --json runs on the validation set")
    p.add_argument("--runs", help="Markdown list of every training run tried for this model (kept, abandoned, "
                                  "replaced), appended as the card's run history")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    selection = ([json.loads(x) for x in Path(args.selection).read_text().splitlines() if x.strip()]
                 if args.selection else [])
    state = torch.load(args.checkpoint, map_location="cpu", weights_only=True)
    log = [json.loads(line) for line in Path(args.train_log).read_text().splitlines() if line.strip()]
    quality = json.loads(Path(args.quality).read_text())
    card = render(state, log, quality, args.name, selection, args.quality)
    if args.runs:
        card += "\n## Every run for this model\n\n" + Path(args.runs).read_text().strip() + "\n"
    Path(args.out).write_text(card)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
