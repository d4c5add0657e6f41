"""The GRU + additive attention baseline (models/gru.py): masking, incremental decoding, search, learning, CLI.

Everything runs on one torch thread and is seeded, so each test is deterministic.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import train
from models.checkpoint import build_model, load_model
from models.core.tokenizer import train_tokenizer
from models.evaluate import _pad, load_checkpoint
from models.gru import GRUSeq2Seq, GRUState, gru_preset
from models.search import beam_search, greedy
from models.train import collate, inverse_sqrt, loss_fn

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
VOCAB = 40


def make_model(**overrides) -> GRUSeq2Seq:
    # Two layers on each side and a dropout that eval() must switch off: the paths a 1-layer model skips.
    torch.manual_seed(0)
    cfg = gru_preset("tiny", vocab_size=VOCAB, enc_layers=2, dec_layers=2, dropout=0.2, **overrides)
    return GRUSeq2Seq(cfg).eval()


def ragged(lengths, width=None, seed=1):
    """Right-padded random ids (B, max(lengths)) with real tokens only in [4, VOCAB)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, VOCAB, (len(lengths), width or max(lengths)), generator=g)
    for i, n in enumerate(lengths):
        src[i, n:] = 0
    return src


@torch.no_grad()
def test_padding_never_changes_a_sentence():
    model = make_model()
    short, long = ragged([4], seed=2), ragged([11], seed=3)
    batch = torch.cat([torch.nn.functional.pad(short, (0, 7)), long])  # (2, 11): the short row padded by 7
    tgt = ragged([6, 6], seed=4)
    alone = model(short, tgt[:1])  # (1, T, V)
    together = model(batch, tgt)  # (2, T, V)
    assert (alone[0] - together[0]).abs().max() <= 1e-5
    memory = model.encode(batch, batch != 0)
    assert torch.all(memory[0, 4:] == 0)  # pads never produce an encoder state


@torch.no_grad()
def test_stepwise_decoding_equals_teacher_forcing():
    model = make_model()
    src, tgt = ragged([7, 3, 5]), ragged([6, 6, 6], seed=5)
    full = model(src, tgt)  # (B, T, V)
    mask = src != 0
    state = model.init_state(model.encode(src, mask), mask)
    assert isinstance(state, GRUState) and state.hidden.shape == (2, 3, model.cfg.hidden_size)
    for t in range(tgt.size(1)):
        logits, state = model.decode_step(tgt[:, t:t + 1], state)  # (B, 1, V)
        assert (logits[:, 0] - full[:, t]).abs().max() <= 1e-5
    # reorder_state moves whole rows: row 2's state then equals row 2's state.
    picked = model.reorder_state(state, torch.tensor([2, 2, 0]))
    assert torch.equal(picked.hidden[:, 0], state.hidden[:, 2]) and torch.equal(picked.src_mask[2], state.src_mask[0])


def test_greedy_and_beam_search_run_and_beam_one_is_greedy():
    model = make_model()
    with torch.no_grad():  # unit-scale embeddings: varied, input-dependent outputs instead of one repeated token
        model.embed.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(7))
    src = ragged([6, 2, 4], seed=6)
    hyps = greedy(model, src, max_len=9)
    assert len(hyps) == 3 and all(len(h) <= 9 for h in hyps) and len({tuple(h) for h in hyps}) == 3
    assert greedy(model, src, max_len=9, use_cache=False) == hyps  # carried state = full recompute
    beams = beam_search(model, src, beam=3, n_best=3, max_len=9)
    assert [len(b) for b in beams] == [3, 3, 3]
    assert all(b[0].score >= b[-1].score for b in beams)
    assert [b[0].tokens for b in beam_search(model, src, beam=1, max_len=9)] == hyps


PAIRS = [
    ("A dog runs on the beach.", "Ein Hund rennt am Strand."),
    ("Two children play in the snow.", "Zwei Kinder spielen im Schnee."),
    ("A man is riding a bike.", "Ein Mann fährt Fahrrad."),
    ("The woman reads a book.", "Die Frau liest ein Buch."),
    ("A cat sleeps on the sofa.", "Eine Katze schläft auf dem Sofa."),
    ("People walk down the street.", "Leute gehen die Straße entlang."),
]


def test_tiny_gru_learns_a_handful_of_sentences():
    tok = train_tokenizer([s for pair in PAIRS for s in pair] * 3, vocab_size=120)
    data = [(tok.encode(s), tok.encode(t)) for s, t in PAIRS]  # both end with EOS
    torch.manual_seed(0)
    model = GRUSeq2Seq(gru_preset("tiny", vocab_size=tok.vocab_size))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: inverse_sqrt(s, 20))
    src, tgt_in, tgt_out = collate(data, tok.pad_id, tok.bos_id)
    losses = []
    model.train()
    for _ in range(200):
        loss = loss_fn(model(src, tgt_in), tgt_out, tok.pad_id, 0.0) / (tgt_out != tok.pad_id).sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0], (losses[0], losses[-1])
    model.eval()
    src = _pad([x for x, _ in data], tok.pad_id)
    targets = [y[:-1] for _, y in data]
    exact = sum(h == y for h, y in zip(greedy(model, src), targets))
    assert exact >= len(PAIRS) - 1, exact
    beams = [b[0].tokens for b in beam_search(model, src, beam=3)]
    assert sum(h == y for h, y in zip(beams, targets)) >= len(PAIRS) - 1


def test_checkpoint_round_trip_keeps_the_architecture(tmp_path):
    model = make_model()
    torch.save({"arch": "gru", "config": model.cfg.to_dict(), "model": model.state_dict()}, tmp_path / "g.pt")
    loaded, _ = load_model(tmp_path / "g.pt")
    assert isinstance(loaded, GRUSeq2Seq) and not loaded.training
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="unknown architecture"):
        build_model("lstm", {})


@pytest.mark.skipif(not MULTI30K.exists(), reason="no ../shared/data/multi30k here")
def test_train_cli_gru_checkpoint_loads_in_evaluate(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--arch", "gru", "--preset", "tiny", "--data-dir", str(MULTI30K), "--out", str(out),
            "--vocab-size", "1000", "--epochs", "1", "--max-steps", "20", "--log-every", "10",
            "--val-sentences", "8", "--max-tokens", "1500", "--precision", "fp32", "--threads", "1"]
    assert train.main(args) == 0
    assert "gru tiny:" in capsys.readouterr().err
    for name in ("tokenizer.json", "last.pt", "best.pt", "epoch_001.pt", "train.jsonl", "curve.png"):
        assert (out / name).exists(), name
    best = torch.load(out / "best.pt", weights_only=True)
    assert best["arch"] == "gru" and best["meta"]["arch"] == "gru" and best["meta"]["step"] == 20
    model, tok, meta = load_checkpoint(out / "best.pt")
    assert isinstance(model, GRUSeq2Seq) and tok.vocab_size == model.cfg.vocab_size

    # The CLI, in its own process, exactly as a user runs it.
    src, ref, hyp = tmp_path / "src.en", tmp_path / "ref.de", tmp_path / "hyp.de"
    src.write_text("".join(MULTI30K.joinpath("val.en").read_text().splitlines(True)[:5]))
    ref.write_text("".join(MULTI30K.joinpath("val.de").read_text().splitlines(True)[:5]))
    proc = subprocess.run([sys.executable, "-m", "models.evaluate", "--checkpoint", str(out / "best.pt"),
                           "--src-file", str(src), "--ref-file", str(ref), "--beam", "3", "--threads", "1",
                           "--output", str(hyp)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("BLEU = ") and len(hyp.read_text().splitlines()) == 5

    # Resuming a GRU run as a Transformer is refused instead of loading mismatched weights.
    with pytest.raises(SystemExit, match="is a gru run"):
        train.main([a if a != "gru" else "transformer" for a in args] + ["--resume"])


@pytest.mark.skipif(not MULTI30K.exists(), reason="no ../shared/data/multi30k here")
def test_train_cli_shape_flags_override_the_transformer_preset(tmp_path):
    out = tmp_path / "run"
    args = ["--preset", "tiny", "--d-model", "32", "--heads", "2", "--enc-layers", "3", "--dec-layers", "1",
            "--d-ff", "48", "--data-dir", str(MULTI30K), "--out", str(out), "--vocab-size", "600", "--epochs", "1",
            "--max-steps", "3", "--val-sentences", "4", "--max-tokens", "800", "--precision", "fp32",
            "--threads", "1"]
    assert train.main(args) == 0
    model, _, _ = load_checkpoint(out / "best.pt")
    cfg = model.cfg
    assert (cfg.d_model, cfg.n_heads, cfg.n_enc_layers, cfg.n_dec_layers, cfg.d_ff) == (32, 2, 3, 1, 48)
    with pytest.raises(SystemExit):
        train.parse_args(["--arch", "gru", "--preset", "tiny", "--out", str(out), "--d-model", "64"])
