"""Train a translation model.

    python -m models.train --preset small --corpus multi30k --src en --tgt de \\
        --data-dir ../shared/data/multi30k --out runs/en-de

Writes into --out: tokenizer.json, last.pt (with optimizer state, for
--resume), epoch_NNN.pt and best.pt (weights + config only; best by
validation BLEU), train.jsonl (one JSON object per log line) and curve.png.

--arch gru trains the GRU + additive attention baseline (models/gru.py) with
everything else unchanged: data, tokenizer, loss, optimizer, schedule,
validation, checkpoints (which record the architecture for models.evaluate).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

from models.checkpoint import ARCHS, Model, arch_of, build_model
from models.core.config import PRESETS, preset
from models.data import load_pairs, token_batches
from models.evaluate import bleu, translate
from models.core.tokenizer import SubwordTokenizer, train_tokenizer
from models.gru import GRU_PRESETS, gru_preset


# Transformer shape flags that override the preset, by config field (the run's config is saved in every
# checkpoint; models/card.py spells a run's command with these names).
SHAPE_FLAGS = {"d_model": "--d-model", "n_heads": "--heads", "n_enc_layers": "--enc-layers",
               "n_dec_layers": "--dec-layers", "d_ff": "--d-ff"}


def inverse_sqrt(step: int, warmup: int) -> float:
    """LR multiplier: linear warm-up to 1 over `warmup` steps, then sqrt(warmup / step)."""
    step = max(step, 1)
    return step / warmup if step < warmup else math.sqrt(warmup / step)


def collate(batch: Sequence[tuple[list[int], list[int]]], pad_id: int, bos_id: int):
    """[(src ids + EOS, tgt ids + EOS)] -> src (B, S), tgt_in (B, T) = BOS + y, tgt_out (B, T) = y + EOS."""
    s = max(len(x) for x, _ in batch)
    t = max(len(y) for _, y in batch)
    src = torch.full((len(batch), s), pad_id, dtype=torch.long)
    tgt_in = torch.full((len(batch), t), pad_id, dtype=torch.long)
    tgt_out = torch.full((len(batch), t), pad_id, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        src[i, : len(x)] = torch.tensor(x)
        tgt_in[i, : len(y)] = torch.tensor([bos_id] + y[:-1])
        tgt_out[i, : len(y)] = torch.tensor(y)
    return src, tgt_in, tgt_out


def loss_fn(logits: torch.Tensor, target: torch.Tensor, pad_id: int, smoothing: float) -> torch.Tensor:
    """Summed label-smoothed cross entropy over non-pad target tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1),
                           ignore_index=pad_id, label_smoothing=smoothing, reduction="sum")


@torch.no_grad()
def validation_loss(model: Model, data, batches, pad_id: int, bos_id: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for idx in batches:
        src, tgt_in, tgt_out = collate([data[i] for i in idx], pad_id, bos_id)
        total += float(loss_fn(model(src, tgt_in), tgt_out, pad_id, 0.0))
        count += int((tgt_out != pad_id).sum())
    return total / max(count, 1)


def plot_curve(log_path: Path, png_path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    train = [r for r in rows if r["kind"] == "train"]
    val = [r for r in rows if r["kind"] == "epoch"]
    fig, ax1 = plt.subplots(figsize=(8, 4.5))
    ax1.plot([r["step"] for r in train], [r["loss"] for r in train], lw=0.8, label="train loss (smoothed CE)")
    ax1.plot([r["step"] for r in val], [r["val_loss"] for r in val], "o-", label="val loss (CE)")
    ax1.set_xlabel("optimizer step")
    ax1.set_ylabel("loss / token (nats)")
    ax2 = ax1.twinx()
    ax2.plot([r["step"] for r in val], [r["val_bleu"] for r in val], "s-", color="tab:green", label="val BLEU")
    ax2.set_ylabel("sacreBLEU (greedy)")
    lines = ax1.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    labels = ax1.get_legend_handles_labels()[1] + ax2.get_legend_handles_labels()[1]
    ax1.legend(lines, labels, loc="center right")
    ax1.set_title(png_path.parent.name)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="transformer", choices=ARCHS,
                   help="transformer (default), or gru: the bidirectional GRU encoder + GRU decoder with "
                        "additive (Bahdanau) attention baseline of models/gru.py, trained the same way")
    p.add_argument("--preset", default="small", choices=sorted(set(PRESETS) | set(GRU_PRESETS)),
                   help=f"model size; transformer: {', '.join(sorted(PRESETS))}; gru: {', '.join(sorted(GRU_PRESETS))}")
    p.add_argument("--corpus", default="multi30k", choices=["multi30k", "tatoeba"])
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="de")
    p.add_argument("--data-dir", help="local copy of the corpus files (else download and verify)")
    p.add_argument("--out", required=True)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0 = no limit)")
    p.add_argument("--max-tokens", type=int, default=3000, help="padded tokens per batch (each side)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=800)
    p.add_argument("--weight-decay", type=float, default=1e-4)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--dropout", type=float, help="override the preset's dropout")
    p.add_argument("--attn-dropout", type=float, help="override the preset's attention dropout (transformer only)")
    for key, flag in SHAPE_FLAGS.items():
        p.add_argument(flag, type=int, dest=key, help=f"override the transformer preset's {key}")
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16"],
                   help="bf16 autocast for the forward pass (master weights stay fp32); "
                        "about 1.8x faster on CPUs with AVX512-BF16/AMX")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = default)")
    p.add_argument("--val-sentences", type=int, default=0, help="BLEU on the first N val sentences (0 = all)")
    p.add_argument("--keep-epochs", type=int, default=5, help="epoch_NNN.pt files kept")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    p.add_argument("--init-from", help="start from this checkpoint's weights (same shape) and continue its "
                   "schedule and epoch count from its step/epoch, with a fresh optimizer; for runs that outlive "
                   "a machine, where only the weights survived")
    p.add_argument("--rewarm", type=int, default=300,
                   help="with --init-from: steps of linear warm-up while the fresh optimizer's moments settle")
    p.add_argument("--bpe-dropout", type=float, default=0.0,
                   help="re-tokenise the training pairs every epoch with BPE-dropout of this rate (0 = off); "
                   "validation and the saved tokenizer are unaffected (the tokenizer's own random numbers: "
                   "such runs are not bit-reproducible)")
    p.add_argument("--cooldown", action="store_true",
                   help="decay the learning rate linearly to 0 by the end of the last epoch (on top of inverse-sqrt)")
    args = p.parse_args(argv)
    if args.preset not in (GRU_PRESETS if args.arch == "gru" else PRESETS):
        p.error(f"--preset {args.preset} is not a {args.arch} preset")
    if args.arch == "gru" and args.attn_dropout is not None:
        p.error("--attn-dropout applies to the transformer only")
    if args.arch == "gru" and any(getattr(args, k) is not None for k in SHAPE_FLAGS):
        p.error(f"{'/'.join(SHAPE_FLAGS.values())} apply to the transformer only")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)

    train_pairs = load_pairs(args.corpus, "train", args.src, args.tgt, args.data_dir)
    val_pairs = load_pairs(args.corpus, "val", args.src, args.tgt, args.data_dir)
    tok_path = out / "tokenizer.json"
    if tok_path.exists():
        tok = SubwordTokenizer.load(tok_path)
    else:
        texts = [p.src for p in train_pairs] + [p.tgt for p in train_pairs]
        tok = train_tokenizer(texts, vocab_size=args.vocab_size)
        tok.save(tok_path)

    overrides = {"vocab_size": tok.vocab_size}
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    if args.attn_dropout is not None:
        overrides["attn_dropout"] = args.attn_dropout
    overrides.update({k: getattr(args, k) for k in SHAPE_FLAGS if getattr(args, k) is not None})
    cfg = gru_preset(args.preset, **overrides) if args.arch == "gru" else preset(args.preset, **overrides)
    limit = cfg.max_positions

    def encode(pairs, dropout: float = 0.0):
        if dropout:
            src = tok.encode_batch_sampled([p.src for p in pairs], dropout)
            tgt = tok.encode_batch_sampled([p.tgt for p in pairs], dropout)
        else:
            src, tgt = tok.encode_batch([p.src for p in pairs]), tok.encode_batch([p.tgt for p in pairs])
        return [(x, y) for x, y in zip(src, tgt) if len(x) <= limit and len(y) <= limit]

    train_data, val_data = encode(train_pairs), encode(val_pairs)
    val_pairs = val_pairs[: args.val_sentences] if args.val_sentences else val_pairs
    val_batches = token_batches([len(x) for x, _ in val_data], [len(y) for _, y in val_data],
                                args.max_tokens, shuffle=False)

    model = build_model(args.arch, cfg.to_dict())
    decay = [p for n, p in model.named_parameters() if p.dim() > 1 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.dim() <= 1 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    step, start_epoch, best_bleu = 0, 1, -1.0
    first_step = 0  # where a run begun with --init-from took over its source's schedule
    if args.init_from:
        src_state = torch.load(args.init_from, map_location="cpu", weights_only=False)
        if src_state.get("arch", "transformer") != args.arch or src_state["config"] != cfg.to_dict():
            raise SystemExit(f"{args.init_from} has another architecture or shape than this run's flags give")
        model.load_state_dict(src_state["model"])
        first_step = step = int(src_state["meta"]["step"])
        start_epoch = int(src_state["meta"]["epoch"]) + 1
    first_epoch, progress = start_epoch, [0.0]  # progress: share of this run's epochs done (--cooldown)

    def lr_factor(s: int) -> float:
        # LambdaLR counts its own steps from 0; the run's step is first_step + s
        f = inverse_sqrt(first_step + s, args.warmup)
        if args.init_from:
            f *= min(1.0, (s + 1) / max(1, args.rewarm))
        if args.cooldown:
            f *= max(0.0, 1.0 - progress[0])
        return f

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    log_path = out / "train.jsonl"
    if args.resume and (out / "last.pt").exists():
        state = torch.load(out / "last.pt", map_location="cpu", weights_only=False)
        if state.get("arch", "transformer") != args.arch:
            raise SystemExit(f"{out / 'last.pt'} is a {state.get('arch', 'transformer')} run, not --arch {args.arch}")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, start_epoch, best_bleu = state["step"], state["epoch"] + 1, state["best_bleu"]
        torch.set_rng_state(state["torch_rng"])
        print(f"resumed from epoch {state['epoch']} (step {step}, best BLEU {best_bleu:.2f})", file=sys.stderr)
    elif log_path.exists():
        log_path.unlink()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as f:  # every start (fresh or resumed) is on record
        f.write(json.dumps({"kind": "start", "step": step, "epoch": start_epoch, "args": vars(args),
                            "torch_threads": torch.get_num_threads()}) + "\n")
    print(f"{args.arch} {args.preset}: {model.num_parameters():,} parameters; {len(train_data):,} train pairs",
          file=sys.stderr)

    def log(row: dict) -> None:
        with log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def weights(meta: dict) -> dict:
        return {"arch": arch_of(model), "config": cfg.to_dict(), "model": model.state_dict(), "meta": meta}

    for epoch in range(start_epoch, args.epochs + 1):
        model.train()
        if args.bpe_dropout:
            train_data = encode(train_pairs, args.bpe_dropout)  # a new segmentation every epoch
        batches = token_batches([len(x) for x, _ in train_data], [len(y) for _, y in train_data],
                                args.max_tokens, shuffle=True, seed=args.seed * 1000 + epoch)
        bar = tqdm(batches, desc=f"epoch {epoch}", unit="batch", file=sys.stderr,
                   mininterval=1.0 if sys.stderr.isatty() else 30.0)
        t_epoch = time.perf_counter()
        win_loss, win_tok, win_t0 = 0.0, 0, time.perf_counter()
        for n_done, idx in enumerate(bar):
            src, tgt_in, tgt_out = collate([train_data[i] for i in idx], cfg.pad_id, cfg.bos_id)
            ntok = int((tgt_out != cfg.pad_id).sum())
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
                logits = model(src, tgt_in)
            loss = loss_fn(logits.float(), tgt_out, cfg.pad_id, args.label_smoothing)
            opt.zero_grad(set_to_none=True)
            (loss / ntok).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            progress[0] = (epoch - first_epoch + (n_done + 1) / len(batches)) / max(1, args.epochs - first_epoch + 1)
            sched.step()
            step += 1
            win_loss += loss.item()
            win_tok += ntok
            if step % args.log_every == 0:
                tps = win_tok / (time.perf_counter() - win_t0)
                row = {"kind": "train", "epoch": epoch, "step": step, "loss": win_loss / win_tok,
                       "tok_per_s": round(tps), "lr": sched.get_last_lr()[0]}
                log(row)
                bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{tps:.0f}", lr=f"{row['lr']:.2e}")
                win_loss, win_tok, win_t0 = 0.0, 0, time.perf_counter()
            if args.max_steps and step >= args.max_steps:
                break
        bar.close()
        train_secs = time.perf_counter() - t_epoch
        val_loss = validation_loss(model, val_data, val_batches, cfg.pad_id, cfg.bos_id)
        hyps = translate(model, tok, [p.src for p in val_pairs])
        val_bleu = bleu(hyps, [p.tgt for p in val_pairs]).score
        meta = {"epoch": epoch, "step": step, "val_loss": val_loss, "val_bleu_greedy": val_bleu,
                "corpus": args.corpus, "src_lang": args.src, "tgt_lang": args.tgt, "arch": args.arch, "preset": args.preset,
                "args": vars(args)}
        torch.save(weights(meta), out / f"epoch_{epoch:03d}.pt")
        stale = sorted(out.glob("epoch_*.pt"))[: -args.keep_epochs] if args.keep_epochs > 0 else []
        for old in stale:
            old.unlink()
        if val_bleu > best_bleu:
            best_bleu = val_bleu
            torch.save(weights(meta), out / "best.pt")
        torch.save({**weights(meta), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                    "step": step, "epoch": epoch, "best_bleu": best_bleu,
                    "torch_rng": torch.get_rng_state()}, out / "last.pt")
        log({"kind": "epoch", "epoch": epoch, "step": step, "val_loss": val_loss, "val_bleu": val_bleu,
             "best_bleu": best_bleu, "train_seconds": round(train_secs, 1)})
        plot_curve(log_path, out / "curve.png")
        print(f"epoch {epoch}: val loss {val_loss:.3f}, val BLEU {val_bleu:.2f} (best {best_bleu:.2f}), "
              f"{train_secs:.0f}s", file=sys.stderr, flush=True)
        if args.max_steps and step >= args.max_steps:
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
