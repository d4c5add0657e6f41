"""What the host can carry: the server serving a model whose decode step costs almost nothing.

    python -m benchmarks.host_bound [--levels stream:1,stream:64,stream:256,stream:512,unary:4]
        [--seconds 10] [--rounds 2] [--before ../before] [--flags "..."] [--out docs/benchmarks/host_bound.md]

Issue 58's stand-in for a GPU on any CPU. On an H200 the shipped model's step replays in 0.84 ms for 256 rows
while the server delivered ~3% of what that allows: the time went to the host (admission, scheduling, token
choice, bookkeeping, events, messages), not to the device. On a CPU the real model's step hides that cost, so
this benchmark removes the model: a Transformer of d_model 16 and one encoder and one decoder layer, randomly
initialised (seeded), with the shipped model's vocabulary and tokenizer, exported by the project's own
exporter (`python -m export`, every check of it) and served with the server's default flags. Its logits bias
holds EOS back, so every request decodes exactly `--output-tokens` tokens (the request's max_output_tokens)
and every server compared does the same work; the runaway guard is off (a random model repeats itself).

Each round starts each checkout's server (this one, and --before's when given: a `git worktree` of an earlier
commit, the same bundle), warms it, serves every level with `python -m client.loadgen` (harness.serve_level)
and reads every process's CPU time from /proc over the level: the frontend(s) and the engine core(s) apart.
The order of the checkouts alternates by round. Reports, per level and side, the median over rounds of
served tokens/s and host CPU microseconds per output token, by process kind.
"""
from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

from benchmarks.harness import ServerProcess, commit_of, date_line, descendants, machine_line, parse_levels, \
    process_cpu_seconds, rotations, serve_level

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "host_bound"
SHIPPED = ROOT / "model_repository" / "multi30k-en-de-small" / "4"
MODEL = "host-bound-d16"
OUTPUT_TOKENS = 44  # what the outside measurement decoded per request
WARM_S = 3
# The tiny model: d_model 16 (2 heads of 8), one layer each side, a feed-forward of 32. Its decode step at
# 256 rows is mostly the 16 x 8,000 output projection: what is left is the host.
SIZES = dict(d_model=16, n_heads=2, n_enc_layers=1, n_dec_layers=1, d_ff=32, dropout=0.0, attn_dropout=0.0,
             output_bias=True)


def build_bundle(repository: Path = BUILD / "repository", seed: int = 0, force: bool = False) -> Path:
    """The near-free model exported into `repository` (once; `force` builds it again): a randomly initialised
    Transformer of SIZES with the shipped model's tokenizer and vocabulary, EOS held back by its logits bias.
    Needs torch (the `export` extra); the server that serves it does not."""
    target = repository / MODEL / "1"
    if target.exists() and not force:
        return target
    import torch

    from export.__main__ import main as export_main
    from models.core.config import EOS_ID, ModelConfig
    from models.core.bundle_tokenizer import load_tokenizer
    from models.transformer import Transformer

    shipped = json.loads((SHIPPED / "config.json").read_text())
    tok = load_tokenizer(shipped["tokenizer"], SHIPPED)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=tok.vocab_size, **SIZES)).eval()
    with torch.no_grad():
        model.final_logits_bias[EOS_ID] = -1e4  # never chosen: each request runs to its max_output_tokens
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / MODEL
        ckpt.mkdir()
        tok.save(ckpt / "tokenizer.json")
        meta = {"src_lang": shipped.get("source_language", "en"), "tgt_lang": shipped.get("target_language", "de")}
        torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(), "meta": meta}, ckpt / "model.pt")
        flags = ["--checkpoint", str(ckpt / "model.pt"), "--out", str(repository), "--name", MODEL, "--force"]
        if export_main(flags) != 0:
            raise RuntimeError("the exporter refused the host-bound model (its problems are printed above)")
    return target


def process_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """{pid: (kind, CPU seconds)} for the server `pid` and its live descendants: "frontend" (the server's own
    process and extra frontends) or "engine core" (server.coreprocess)."""
    out = {}
    for p in [pid, *descendants(pid)]:
        try:
            command = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except FileNotFoundError:  # exited meanwhile
            continue
        cpu = process_cpu_seconds(p)
        if cpu is not None:
            out[p] = ("engine core" if "server.coreprocess" in command else "frontend", cpu)
    return out


def client_cpu() -> float:
    """CPU seconds of this process's waited-for children: the load generators serve_level ran."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def serve_side(root: Path, repository: Path, flags: list[str], levels: list[str], seconds: float,
               output_tokens: int) -> dict[str, dict]:
    """One checkout's server on the near-free model: every level's tokens/s and CPU µs per output token by
    process kind (and the load generator's)."""
    results = {}
    extra = ["--max-output-tokens", str(output_tokens)]
    with ServerProcess("--model-repository", str(repository), "--runaway-guard", "false", *flags, metrics=False,
                       root=root) as server:
        serve_level(server.target, "stream:8", WARM_S, extra)
        for level in levels:
            before, client = process_cpu(server.pid), client_cpu()
            figures = serve_level(server.target, level, seconds, extra)
            after, client = process_cpu(server.pid), client_cpu() - client
            tokens = max(figures["output_tokens"], 1)
            by_kind: dict[str, float] = {}
            for p, (kind, cpu) in after.items():
                by_kind[kind] = by_kind.get(kind, 0.0) + cpu - before.get(p, (kind, 0.0))[1]
            results[level] = {"tokens_per_s": figures["tokens_per_s"], "errors": figures["errors"],
                              "server_us_per_token": 1e6 * sum(by_kind.values()) / tokens,
                              **{f"{kind}_us_per_token": 1e6 * cpu / tokens for kind, cpu in by_kind.items()},
                              "client_us_per_token": 1e6 * client / tokens,
                              "ttft_p50_ms": (figures.get("ttft_ms") or {}).get("p50")}
    return results


def render(runs: dict, sides: dict, args, argv: list[str]) -> str:
    def med(side: str, level: str, key: str) -> float:
        values = [r.get(key, 0.0) for r in runs[side][level]]
        return statistics.median(values) if values else float("nan")
    lines = ["# Host-bound serving: the near-free model (benchmarks/host_bound.py)", "",
             date_line(), machine_line(), "",
             f"Command: `python -m benchmarks.host_bound {' '.join(shlex.quote(a) for a in argv)}`", "",
             f"Model: {MODEL} (d_model 16, 1 + 1 layers, random weights, the shipped vocabulary), every request "
             f"{args.output_tokens} output tokens; the server's default flags and `--runaway-guard false`"
             + (f", and `{args.flags}`" if args.flags else "") + ". "
             f"Medians of {args.rounds} rounds of {args.seconds:g} s per level, the sides alternating.", "",
             "Sides: " + "; ".join(f"{side} = commit {commit_of(root)}" for side, root in sides.items())
             + (f" (before's flags: `{args.before_flags}`)" if args.before_flags else "")
             + (f" (after's flags: `{args.after_flags}`)" if args.after_flags else "") + ".", "",
             "| level | side | tokens/s | server µs CPU/token | frontend | engine core | load generator | "
             "TTFT p50 ms | errors |", "|---|---|---|---|---|---|---|---|---|"]
    for level in args.levels.split(","):
        for side in sides:
            ttft = [r["ttft_p50_ms"] for r in runs[side][level] if r["ttft_p50_ms"] is not None]
            lines.append(f"| {level} | {side} | {med(side, level, 'tokens_per_s'):,.0f} | "
                         f"{med(side, level, 'server_us_per_token'):,.0f} | {med(side, level, 'frontend_us_per_token'):,.0f} | "
                         f"{med(side, level, 'engine core_us_per_token'):,.0f} | "
                         f"{med(side, level, 'client_us_per_token'):,.0f} | "
                         f"{statistics.median(ttft) if ttft else float('nan'):.1f} | "
                         f"{sum(r['errors'] for r in runs[side][level])} |")
        if len(sides) == 2:
            ratio = med("after", level, "tokens_per_s") / med("before", level, "tokens_per_s")
            lines.append(f"| {level} | after / before | {ratio:.2f}x | | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.host_bound", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="stream:1,stream:64,stream:256,stream:512,unary:4",
                   help="comma-separated stream:N, unary:N (32-text calls) and rate:R (harness.level_command)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds of load per level")
    p.add_argument("--rounds", type=int, default=2, help="rounds; each serves every side, the order alternating")
    p.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS, help="output tokens of every request")
    p.add_argument("--before", type=Path, help="an earlier checkout (a git worktree) served beside this one")
    p.add_argument("--flags", default="", help="more server flags for every side")
    p.add_argument("--before-flags", default="", help="more server flags for the before side (with --before, "
                   "or alone: this checkout with these flags is the before side)")
    p.add_argument("--after-flags", default="", help="more server flags for this checkout's side")
    p.add_argument("--repository", type=Path, default=BUILD / "repository",
                   help="where the near-free model is built once (needs torch the first time)")
    p.add_argument("--out", type=Path, help="write the table here (markdown) and every round's figures beside it "
                   "(.json)")
    args = p.parse_args(argv)
    levels = parse_levels(p, args.levels, args.seconds)
    build_bundle(args.repository.resolve())
    sides = {"after": ROOT}
    if args.before is not None or args.before_flags:
        sides = {"before": (args.before or ROOT).resolve(), "after": ROOT}
    runs: dict[str, dict[str, list[dict]]] = {side: {level: [] for level in levels} for side in sides}
    print(date_line(), machine_line(), sep="\n", flush=True)
    for number, order in enumerate(rotations(list(sides), args.rounds), 1):
        for side in order:
            flags = args.flags.split() + (args.before_flags if side == "before" else args.after_flags).split()
            figures = serve_side(sides[side], args.repository.resolve(), flags, levels, args.seconds,
                                 args.output_tokens)
            for level, f in figures.items():
                runs[side][level].append(f)
                print(f"round {number} {side:6s} {level:10s} {f['tokens_per_s']:9,.0f} tokens/s  "
                      f"{f['server_us_per_token']:6,.0f} µs server CPU/token (frontend "
                      f"{f.get('frontend_us_per_token', 0):,.0f}, engine core {f.get('engine core_us_per_token', 0):,.0f}), "
                      f"load generator {f['client_us_per_token']:,.0f}  errors {f['errors']}", flush=True)
    text = render(runs, sides, args, argv)
    print(text)
    if args.out:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps({"sides": {k: str(v) for k, v in sides.items()},
                                                             "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
