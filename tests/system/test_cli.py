"""The training, evaluation and translation command lines, end to end on real data."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models import train
from models.evaluate import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
needs_shared = pytest.mark.skipif(not MULTI30K.exists(), reason="no ../shared/data/multi30k here")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    if not MULTI30K.exists():
        pytest.skip("no ../shared/data/multi30k here")
    out = tmp_path_factory.mktemp("run")
    args = ["--preset", "tiny", "--data-dir", str(MULTI30K), "--out", str(out), "--vocab-size", "1000",
            "--epochs", "1", "--max-steps", "4", "--log-every", "2", "--val-sentences", "8",
            "--max-tokens", "1500", "--precision", "fp32"]
    assert train.main(args) == 0
    return out, args


def test_training_writes_checkpoints_log_and_curve(run_dir):
    out, _ = run_dir
    for name in ("tokenizer.json", "last.pt", "best.pt", "epoch_001.pt", "train.jsonl", "curve.png"):
        assert (out / name).exists(), name
    rows = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "train"] == [2, 4]
    assert rows[-1]["kind"] == "epoch" and rows[-1]["step"] == 4
    best = torch.load(out / "best.pt", weights_only=True)
    assert "optimizer" not in best and best["config"]["d_model"] == 64  # shipped weights carry no optimizer


def test_resume_continues_where_it_stopped(run_dir):
    out, args = run_dir
    before = torch.load(out / "last.pt", weights_only=False)
    resumed = list(args)
    resumed[resumed.index("--epochs") + 1] = "2"
    resumed[resumed.index("--max-steps") + 1] = "6"
    assert train.main(resumed + ["--resume"]) == 0
    after = torch.load(out / "last.pt", weights_only=False)
    assert (before["epoch"], before["step"]) == (1, 4)
    assert (after["epoch"], after["step"]) == (2, 6)
    epochs = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in epochs if r["kind"] == "epoch"] == [1, 2]


def test_init_from_continues_a_checkpoints_schedule_with_a_fresh_optimizer(run_dir, tmp_path):
    """Only a run's weights survived (another machine): go on from its step and epoch."""
    out, args = run_dir
    source = out / "epoch_001.pt"  # epoch 1, step 4
    cont = tmp_path / "cont"
    cont.mkdir()
    (cont / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes())
    more = list(args)
    more[more.index("--out") + 1] = str(cont)
    more[more.index("--epochs") + 1] = "2"
    more[more.index("--max-steps") + 1] = "6"
    more[more.index("--log-every") + 1] = "1"
    assert train.main(more + ["--init-from", str(source), "--rewarm", "4"]) == 0
    rows = [json.loads(x) for x in (cont / "train.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "train"]
    assert [(r["epoch"], r["step"]) for r in steps] == [(2, 5), (2, 6)]
    # the schedule goes on at step 5 (inverse sqrt, warm-up 800), halved by the re-warm's 2nd of 4 steps
    assert steps[0]["lr"] == pytest.approx(1e-3 * train.inverse_sqrt(5, 800) * 0.5)
    # --cooldown scales the same schedule down linearly over the run's batches; --bpe-dropout
    # re-tokenises the pairs (the run still trains: its loss is logged)
    cooled = tmp_path / "cooled"
    cooled.mkdir()
    (cooled / "tokenizer.json").write_bytes((out / "tokenizer.json").read_bytes())
    more_cooled = list(more)
    more_cooled[more_cooled.index("--out") + 1] = str(cooled)
    assert train.main(more_cooled + ["--init-from", str(source), "--rewarm", "4", "--cooldown",
                                     "--bpe-dropout", "0.2"]) == 0
    rows_cooled = [json.loads(x) for x in (cooled / "train.jsonl").read_text().splitlines()]
    lrs = [r["lr"] for r in rows_cooled if r["kind"] == "train"]
    assert all(0 < c < plain["lr"] for c, plain in zip(lrs, steps)) and len(lrs) == 2
    with pytest.raises(SystemExit, match="another architecture or shape"):
        other = list(more)
        other[other.index("--preset") + 1] = "small"
        train.main(other + ["--init-from", str(source), "--out", str(tmp_path / "other")])


def test_evaluate_prints_sacrebleu_signature(run_dir, tmp_path):
    out, _ = run_dir
    src = tmp_path / "src.en"
    ref = tmp_path / "ref.de"
    src.write_text("".join(MULTI30K.joinpath("val.en").read_text().splitlines(True)[:5]))
    ref.write_text("".join(MULTI30K.joinpath("val.de").read_text().splitlines(True)[:5]))
    hyp = tmp_path / "hyp.de"
    proc = subprocess.run([sys.executable, "-m", "models.evaluate", "--checkpoint", str(out / "best.pt"),
                           "--src-file", str(src), "--ref-file", str(ref), "--beam", "2", "--output", str(hyp)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[0]
    assert line.startswith("BLEU = ") and "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in line
    assert len(hyp.read_text().splitlines()) == 5


def test_evaluate_rejects_mismatched_files(run_dir, tmp_path):
    out, _ = run_dir
    (tmp_path / "a").write_text("one\ntwo\n")
    (tmp_path / "b").write_text("eins\n")
    proc = subprocess.run([sys.executable, "-m", "models.evaluate", "--checkpoint", str(out / "best.pt"),
                           "--src-file", str(tmp_path / "a"), "--ref-file", str(tmp_path / "b")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "has 2 lines" in proc.stderr


def test_loaded_checkpoint_matches_saved_weights(run_dir):
    out, _ = run_dir
    model, tok, meta = load_checkpoint(out / "best.pt")
    saved = torch.load(out / "best.pt", weights_only=True)["model"]
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert meta["epoch"] >= 1 and tok.vocab_size == model.cfg.vocab_size


def test_average_of_checkpoints(run_dir, tmp_path):
    from models.average import average
    out, _ = run_dir
    a = torch.load(out / "epoch_001.pt", weights_only=True)
    b = {**a, "model": {k: v + 1.0 if v.is_floating_point() else v for k, v in a["model"].items()}}
    torch.save(b, tmp_path / "b.pt")
    avg = average([out / "epoch_001.pt", tmp_path / "b.pt"])
    name = next(k for k, v in a["model"].items() if v.is_floating_point())
    assert torch.allclose(avg["model"][name], a["model"][name] + 0.5)
    assert avg["meta"]["averaged_from"] == ["epoch_001.pt", "b.pt"]
    bad = {**a, "config": {**a["config"], "d_model": 32}}
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match="config differs"):
        average([out / "epoch_001.pt", tmp_path / "bad.pt"])


def test_average_keeps_tied_weights_tied(run_dir, tmp_path):
    from models.average import average
    out, _ = run_dir
    avg = average([out / "epoch_001.pt", out / "epoch_001.pt"])
    assert avg["model"]["embed.weight"] is avg["model"]["tgt_embed.weight"]
