"""Train a Hugging Face MarianMTModel (OPUS-MT's architecture and file layout) on the shared data.

    python -m models.marian_train --src en --tgt de --out /work/runs/marian-en-de --minutes 35
    python -m export --from-huggingface /work/runs/marian-en-de/hf --out /work/runs/marian-repo \\
        --name multi30k-marian-en-de

Why: OPUS-MT's weights live on the Hugging Face hub, which this machine cannot reach, and the glossary
evaluation (server/glossary/evaluate.py, issue 37) asks for an imported Marian beside our own models.
This writes the same kind of directory as `Helsinki-NLP/opus-mt-*` (config.json with OPUS-MT's
settings: post-norm, swish, scaled embeddings, pad as the decoder start, final_logits_bias; a joint
SentencePiece model as source.spm and target.spm; vocab.json in OPUS-MT's id layout: </s> 0, <unk> 1,
<pad> last; generation_config.json with pad banned and renormalised scores), so what reads it is the
importer as users run it on a downloaded checkpoint. Its quality is a Multi30k model's, not OPUS-MT's.

Training: token-budget batches of similar lengths, Adam with inverse-square-root decay after a linear
warm-up, label smoothing, bf16 autocast where the CPU has it; validation loss on the `val` split after
each epoch, the best epoch kept (model selection on validation data only); stops at --epochs or when
the next epoch would pass --minutes.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def read(split: str, lang: str) -> list[str]:
    return (DATA / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()


def build_tokenizer(work: Path, src: list[str], tgt: list[str], vocab_size: int, src_lang: str, tgt_lang: str):
    """A joint SentencePiece model and OPUS-MT's vocab.json over it, as a MarianTokenizer."""
    import sentencepiece as spm
    from transformers import MarianTokenizer

    work.mkdir(parents=True, exist_ok=True)
    spm.SentencePieceTrainer.train(sentence_iterator=iter(src + tgt), model_prefix=str(work / "joint"),
                                   vocab_size=vocab_size, character_coverage=1.0, model_type="unigram",
                                   minloglevel=2, bos_id=-1, eos_id=-1, unk_id=0, num_threads=2)
    sp = spm.SentencePieceProcessor(model_file=str(work / "joint.model"))
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        if not sp.is_unknown(i):
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    return MarianTokenizer(source_spm=str(work / "joint.model"), target_spm=str(work / "joint.model"),
                           vocab=str(work / "vocab.json"), source_lang=src_lang, target_lang=tgt_lang)


def batches(examples: list[tuple[list[int], list[int]]], max_tokens: int, rng: random.Random) -> list[list[int]]:
    """Indices grouped by length so each batch holds about `max_tokens` target tokens, in random order."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i][1]), len(examples[i][0]), rng.random()))
    out, cur, width = [], [], 0
    for i in order:
        w = max(width, len(examples[i][1]), len(examples[i][0]))
        if cur and w * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, w = [], max(len(examples[i][1]), len(examples[i][0]))
        cur.append(i)
        width = w
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def tensors(examples, idx: list[int], pad: int):
    """(input_ids, attention_mask, decoder_input_ids, labels) for one batch: the decoder starts with pad."""
    src = [examples[i][0] for i in idx]
    tgt = [examples[i][1] for i in idx]
    s_w, t_w = max(map(len, src)), max(map(len, tgt))
    enc = torch.tensor([s + [pad] * (s_w - len(s)) for s in src])
    dec = torch.tensor([[pad] + t[:-1] + [pad] * (t_w - len(t)) for t in tgt])
    labels = torch.tensor([t + [-100] * (t_w - len(t)) for t in tgt])
    return enc, (enc != pad).long(), dec, labels


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m models.marian_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", default="en", help="source language (a multi30k file suffix)")
    p.add_argument("--tgt", default="de", help="target language")
    p.add_argument("--out", type=Path, required=True, help="work directory; the checkpoint goes to OUT/hf")
    p.add_argument("--vocab-size", type=int, default=8000, help="joint SentencePiece vocabulary size")
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (after warm-up)")
    p.add_argument("--warmup", type=int, default=800, help="warm-up steps")
    p.add_argument("--max-tokens", type=int, default=3000, help="padded tokens per batch")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--minutes", type=float, default=35.0, help="stop before the next epoch would pass this")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--limit", type=int, default=0, help="the first N training pairs only (a quick check)")
    a = p.parse_args(argv)

    from transformers import MarianConfig, MarianMTModel

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    train_src, train_tgt = read("train", a.src), read("train", a.tgt)
    if a.limit:
        train_src, train_tgt = train_src[:a.limit], train_tgt[:a.limit]
    val_src, val_tgt = read("val", a.src), read("val", a.tgt)
    tok = build_tokenizer(a.out / "tokenizer", train_src, train_tgt, a.vocab_size, a.src, a.tgt)
    pad = tok.pad_token_id

    def encode(src: list[str], tgt: list[str]):
        return list(zip(tok(src)["input_ids"], tok(text_target=tgt)["input_ids"]))
    train, val = encode(train_src, train_tgt), encode(val_src, val_tgt)
    cfg = MarianConfig(vocab_size=len(tok.get_vocab()), d_model=a.d_model, encoder_layers=a.layers,
                       decoder_layers=a.layers, encoder_attention_heads=a.heads, decoder_attention_heads=a.heads,
                       encoder_ffn_dim=a.ffn, decoder_ffn_dim=a.ffn, max_position_embeddings=256,
                       dropout=a.dropout, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=pad,
                       decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
                       activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
                       tie_word_embeddings=True, num_beams=4, max_length=256)
    model = MarianMTModel(cfg)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.98), eps=1e-9)
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=-100, label_smoothing=0.1)
    bf16 = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    print(json.dumps({"params": sum(x.numel() for x in model.parameters()), "train": len(train), "val": len(val),
                      "vocab": cfg.vocab_size, "bf16": bool(bf16)}), flush=True)

    def forward(idx, data):
        enc, mask, dec, labels = tensors(data, idx, pad)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=enc, attention_mask=mask, decoder_input_ids=dec).logits
        return logits.float(), labels

    def val_loss() -> float:
        model.eval()
        total, n = 0.0, 0
        with torch.no_grad():
            for idx in batches(val, a.max_tokens, random.Random(0)):
                logits, labels = forward(idx, val)
                tokens = int((labels != -100).sum())
                total += torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100,
                                                           reduction="sum").item()
                n += tokens
        model.train()
        return total / n

    start, step, best, epoch_s = time.monotonic(), 0, math.inf, 0.0
    best_state = None
    for epoch in range(1, a.epochs + 1):
        if epoch > 1 and (time.monotonic() - start + epoch_s) / 60 > a.minutes:
            break
        t0 = time.monotonic()
        model.train()
        plan = batches(train, a.max_tokens, rng)
        for i, idx in enumerate(plan):
            step += 1
            for group in opt.param_groups:
                group["lr"] = a.lr * min(step / a.warmup, math.sqrt(a.warmup / step))
            logits, labels = forward(idx, train)
            loss = loss_fn(logits.transpose(1, 2), labels)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if i % 100 == 0:
                print(json.dumps({"epoch": epoch, "batch": f"{i}/{len(plan)}", "step": step,
                                  "loss": round(loss.item(), 3), "minutes": round((time.monotonic() - start) / 60, 1)}),
                      flush=True)
        epoch_s = time.monotonic() - t0
        v = val_loss()
        print(json.dumps({"epoch": epoch, "val_loss": round(v, 4), "epoch_minutes": round(epoch_s / 60, 2)}), flush=True)
        if v < best:
            best, best_state = v, {k: t.detach().clone() for k, t in model.state_dict().items()}
            best_epoch = epoch
    model.load_state_dict(best_state)
    model.eval()
    # As OPUS-MT's generation_config.json: pad never generated, scores renormalised after that.
    model.generation_config.bad_words_ids = [[pad]]
    model.generation_config.renormalize_logits = True
    model.generation_config.num_beams = 4
    model.generation_config.max_length = 256
    model.save_pretrained(a.out / "hf")
    tok.save_pretrained(a.out / "hf")
    (a.out / "hf" / "TRAINING.json").write_text(json.dumps({
        "command": "python -m models.marian_train " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(a).items()),
        "best_epoch": best_epoch, "val_loss": round(best, 4), "steps": step,
        "minutes": round((time.monotonic() - start) / 60, 1)}, indent=1), encoding="utf-8")
    print(json.dumps({"saved": str(a.out / "hf"), "best_epoch": best_epoch, "val_loss": round(best, 4)}), flush=True)


if __name__ == "__main__":
    main()
