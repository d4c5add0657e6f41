"""Where an engine step's time goes: ONNX Runtime vs the Python around it, at a fixed number of rows.

    python -m benchmarks.engine_overhead [--rows 64,256] [--steps 300] [--mode greedy,sampling,beam4]
        [--model model_repository/multi30k-en-de-small] [--tiny] [--out docs/benchmarks/engine_overhead.md]

--out rewrites its question's section of the page (modes, variants, rows), keeping the others.

The engine loop is driven by hand (no thread, no gRPC, no asyncio): jobs with long outputs (the
runaway guard off, max_output_tokens large) keep about R rows decoding (finished ones are replaced
between iterations, outside the timing), and every iteration is timed: "Python per step" is its
wall time minus the time inside ONNX Runtime's run calls (encoder and decoder), "update" the
scheduler's bookkeeping after the engine's choice (server/core/chooser.py's time is in "Python"). `--tiny` serves a randomly initialised tiny-preset export instead, whose
graph costs almost nothing: its tokens/s is the serving layer's own ceiling (issue 21's target).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import date_line, machine, machine_line

ROOT = Path(__file__).resolve().parents[1]


def tiny_bundle(out: Path) -> Path:
    """Export a random tiny-preset model (needs torch: the export extra)."""
    import torch

    from export.__main__ import main as export_main
    from models.core.config import preset
    from models.core.tokenizer import train_tokenizer
    from models.transformer import Transformer
    tok = train_tokenizer([" ".join(f"w{i}" for i in range(400))] * 3, vocab_size=500, min_frequency=1)
    ckpt = out / "tiny-en-de"
    ckpt.mkdir(parents=True)
    tok.save(ckpt / "tokenizer.json")
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(),
                "meta": {"src_lang": "en", "tgt_lang": "de"}}, ckpt / "model.pt")
    (ckpt / "MODEL_CARD.md").write_text("# tiny (random weights, benchmark only)\n")
    if export_main(["--checkpoint", str(ckpt / "model.pt"), "--out", str(out / "repo")]) != 0:
        raise SystemExit("tiny export failed")
    return next((out / "repo" / "tiny-en-de").iterdir())


class Timed:
    """Wraps a callable and sums its wall time."""

    def __init__(self, fn):
        self.fn, self.total, self.calls = fn, 0.0, 0

    def __call__(self, *a, **k):
        t0 = time.perf_counter()
        try:
            return self.fn(*a, **k)
        finally:
            self.total += time.perf_counter() - t0
            self.calls += 1


def measure(bundle_path: Path, rows: int, steps: int, mode: str, threads: int, forced_length: int = 0,
            variant: str = "fp32") -> dict:
    from models.core.bundle import load_bundle
    from server.config import ServerConfig
    from server.frontend.hosted import HostedModel
    from server.observability.metrics import Metrics
    from server.core.request import DecodingParams

    beam = int(mode[4:]) if mode.startswith("beam") else 1
    # "controls": greedy with a repetition penalty and no repeated 3-grams on every request (issue 27's check)
    controls = dict(repetition_penalty=1.2, no_repeat_ngram_size=3) if mode == "controls" else {}
    cfg = ServerConfig(max_batch_size=rows, max_queue_size=4 * rows, runaway_guard=False, warmup=False,
                       intra_op_threads=threads, max_output_tokens=400, variant=variant)
    model = HostedModel(load_bundle(bundle_path), cfg, Metrics())
    sched, engine = model.here.scheduler, model.here.engine
    # Phase timers: ONNX Runtime's own calls, and the scheduler's phases.
    ort_calls = []
    for session in filter(None, [model.here.runtime.encoder, model.here.runtime._decoder, model.here.runtime.inplace]):
        ort_calls.append(Timed(session.run))
        session.run = ort_calls[-1]
        if hasattr(session, "run_with_iobinding"):
            ort_calls.append(Timed(session.run_with_iobinding))
            session.run_with_iobinding = ort_calls[-1]
    update = Timed(sched.update)
    sched.update = update
    # What a step hands back to the host: with the in-place decoder the caches stay bound where they are,
    # so it is the logits, (rows, vocabulary) float32 (issue 21's target: <= 16 bytes per row).
    fetched = [0, 0]  # bytes, rows
    step = engine._step  # every decode step's logits, where the step left them (the engine's choice reads them)

    def counted_step():
        logits = step()
        if isinstance(logits, np.ndarray):  # on the host: the bytes the step handed back (a device's stay there)
            fetched[0] += logits.nbytes
        fetched[1] += logits.shape[0]
        return logits
    engine._step = counted_step
    # --forced-length: every request decodes exactly N tokens (EOS banned before), so two modes whose
    # outputs differ still do the same ONNX Runtime work and their ratio is the cost of the mode alone.
    length = dict(max_output_tokens=forced_length, min_output_tokens=forced_length) if forced_length else \
        dict(max_output_tokens=min(360, model.max_output))
    params = DecodingParams(beam_size=beam, temperature=1.0 if mode == "sampling" else 0.0, seed=1,
                            **length, **controls)
    texts = ["A man in a blue shirt is riding a bike down the street.", "Two dogs play in the snow."]
    jobs_per_fill = rows // max(beam, 1)
    produced = [0]

    def sink(event) -> None:
        from server.core.request import FinishEvent
        if isinstance(event, FinishEvent):
            produced[0] += len(event.hypotheses[0].tokens)

    def refill() -> None:
        missing = jobs_per_fill - len(sched.running) - len(sched.waiting)
        if missing > 0:
            sched.submit(model.jobs([texts[i % 2] for i in range(missing)], params, sink, None))
    refill()
    now = time.monotonic()
    model.here.loop.iteration(now)  # admit and encode the first batch (not timed)
    for t in ort_calls:
        t.total = 0.0
    update.total = 0.0
    fetched[:] = [0, 0]
    batch_sizes, wall = [], 0.0
    for _ in range(steps):
        refill()  # the benchmark's own submissions (tokenising new jobs) are not the engine's time
        batch_sizes.append(engine.cache.used)
        t0 = time.perf_counter()
        model.here.loop.iteration(time.monotonic())
        wall += time.perf_counter() - t0
    in_ort = sum(t.total for t in ort_calls)
    tokens = sum(batch_sizes) // max(beam, 1)  # output tokens of the best hypotheses (beam: one per k rows)
    return {"mode": mode, "variant": variant, "rows": rows, "steps": steps, "mean_rows": statistics.mean(batch_sizes),
            "wall_ms_per_step": 1000 * wall / steps, "ort_ms_per_step": 1000 * in_ort / steps,
            "python_ms_per_step": 1000 * (wall - in_ort) / steps, "update_ms_per_step": 1000 * update.total / steps,
            "python_share": (wall - in_ort) / wall, "tokens_per_s": tokens / wall,
            "host_bytes_per_row": fetched[0] / max(fetched[1], 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / "model_repository" / "multi30k-en-de-small"),
                   help="a bundle directory (or a model directory: its newest version)")
    p.add_argument("--tiny", action="store_true", help="a random tiny-preset export instead of --model")
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--mode", type=lambda s: s.split(","), default=["greedy", "sampling", "beam4"],
                   help="greedy, sampling, beamK, controls (greedy + repetition penalty + no repeated 3-grams)")
    p.add_argument("--variants", type=lambda s: s.split(","), default=["fp32"],
                   help="bundle variants to compare (fp32, int8), each with every mode, in the same rounds")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = default)")
    p.add_argument("--forced-length", type=int, default=0,
                   help="every request decodes exactly N tokens (min = max output tokens): equal work across modes")
    p.add_argument("--rounds", type=int, default=1,
                   help="measure every mode this many times, the modes' order rotating each round (the machine's "
                        "drift hits all alike); cells report the median, and the last column each mode's tokens/s "
                        "over the first mode's, the median of the per-round ratios")
    p.add_argument("--out", default="", help="write the table into this page (docs/benchmarks/engine_overhead.md): "
                                            "the section of this question (modes, variants, rows) is replaced, "
                                            "or added, and the page's other sections are kept")
    args = p.parse_args(argv)
    # A beam of K needs K rows per request: with fewer rows no request fits and the row would read 0 tokens/s.
    narrow = [f"{mode} at {rows} rows" for mode in args.mode if mode.startswith("beam")
              for rows in args.rows if rows < int(mode[4:] or 1)]
    if narrow:
        p.error(f"a beam of K needs at least K rows: {', '.join(narrow)}")
    from models.core.bundle import newest_version
    with tempfile.TemporaryDirectory() as tmp:
        path = tiny_bundle(Path(tmp)) if args.tiny else Path(args.model)
        if not (path / "config.json").exists():
            path = newest_version(path)
        m = machine()
        lines = [f"`python -m benchmarks.engine_overhead {' '.join(argv or sys.argv[1:])}` — {m['cpu']}, "
                 f"{m['cores']} cores; commit {m['commit']}, "
                 f"{'tiny random model' if args.tiny else path.parent.name + '/' + path.name}", "",
                 "| mode | rows | mean rows | ms/step | in ONNX Runtime | Python | of which update | Python share | "
                 "tokens/s | vs first case | to the host per row and step |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        # Every (mode, variant) pair is one case; the cases rotate each round.
        cases = [(mode, variant) for mode in args.mode for variant in args.variants]
        label = (lambda c: c[0]) if len(args.variants) == 1 else (lambda c: f"{c[0]} {c[1]}")
        runs: dict = {}  # (case, rows) -> one result per round
        for k in range(args.rounds):
            for rows in args.rows:
                order = cases[k % len(cases):] + cases[:k % len(cases)]
                for case in order:
                    r = measure(path, rows, args.steps, case[0], args.threads, args.forced_length, case[1])
                    runs.setdefault((case, rows), []).append(r)
                    print(f"round {k + 1}: {label(case)} {rows} rows: {r['tokens_per_s']:,.0f} tokens/s, Python "
                          f"{r['python_ms_per_step']:.2f} ms/step", file=sys.stderr, flush=True)
        for case in cases:
            for rows in args.rows:
                cells = runs[case, rows]
                med = {key: float(np.median([c[key] for c in cells])) for key in cells[0]
                       if key not in ("mode", "variant")}
                base = runs[cases[0], rows]
                ratio = float(np.median([c["tokens_per_s"] / b["tokens_per_s"] for c, b in zip(cells, base)]))
                lines.append(f"| {label(case)} | {rows} | {med['mean_rows']:.0f} | {med['wall_ms_per_step']:.2f} | "
                             f"{med['ort_ms_per_step']:.2f} | {med['python_ms_per_step']:.2f} | "
                             f"{med['update_ms_per_step']:.2f} | {100 * med['python_share']:.0f}% | "
                             f"{med['tokens_per_s']:,.0f} | {ratio:.2f} | {med['host_bytes_per_row']:,.0f} B |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        heading = (f"## Run: modes {','.join(args.mode)}; variants {','.join(args.variants)}; "
                   f"rows {','.join(map(str, args.rows))}")
        write_section(Path(args.out), heading, f"{date_line(m)}\n\n{machine_line(m=m)}\n\n{text}")
    print(text)
    return 0


def write_section(page: Path, heading: str, body: str) -> None:
    """Replace the section under `heading` (up to the next `## `) with `body`, or add it at the end: the
    page keeps the latest run of each question, one section each, and no history (that is in git)."""
    text = page.read_text() if page.exists() else "# Engine overhead: ONNX Runtime vs the Python around it\n"
    lines = text.splitlines()
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = [heading, "", *body.rstrip("\n").splitlines(), ""]
    else:
        lines += ["", heading, "", *body.rstrip("\n").splitlines()]
    page.write_text("\n".join(lines).rstrip("\n") + "\n")


if __name__ == "__main__":
    sys.exit(main())
