"""Our server vs the CTranslate2 baseline server, side by side in one run.

    python -m benchmarks.serving_compare [--precisions fp32,int8] [--repeats 3] \\
        [--out docs/benchmarks/serving_compare.md]

Both servers run as subprocesses on this machine behind the same nmt.v1 API and are
driven by the same client code over loopback: greedy streams at each --concurrency
level (TranslateStream, tokens/s and TTFT), and unary batches (--unary-texts texts per
Translate call from --unary-clients clients, the pipeline-sidecar load), each load for
--seconds. Every contender of a precision is started at once and waits idle while another
is measured; each load is served to every contender back to back, the order rotated by
repeat (run_rotation), so the figures a ratio divides are seconds apart and a shared
machine's drift hits both alike. Each cell is the median over repeats, and the table gives
the range of the per-repeat ratios beside it. The server's CPU per output token comes from
/proc/PID/stat, and the idle CPU from 5 s of doing nothing after warm-up.

The peer is tuned as CTranslate2 advises, not taken at one setting: every --ct2-configs
setting (replicas x intra-op threads per replica, texts per batch, wait for company, GEMM library) runs
in the same rotation, and each load is compared with the best of them at that load
(which one is named in the table).

fp32: our bundle's fp32 graphs vs CTranslate2 float32 on the converted checkpoint.
int8: our int8 variant (exported here if the bundle lacks one) vs CTranslate2 int8.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from benchmarks.ct2_server import GEMM_BACKENDS, backend_env
from benchmarks.harness import (TEST_SOURCES, PeerProcess, ServerProcess, cpu_seconds, date_line, machine_line,
                                rotations, wait_serving)

ROOT = Path(__file__).resolve().parents[1]
CKPT = ROOT / "models/pretrained/multi30k-en-de-small/model.pt"


def prepare(work: Path, precisions: list[str]) -> dict:
    """Per precision: our repository (with the variant) and the CTranslate2 model directory."""
    from benchmarks.ct2_convert import convert
    repo = ROOT / "model_repository"
    from models.core.bundle import discover
    bundle = next(b.path for b in discover(repo) if b.name == CKPT.parent.name)  # its served (highest) version
    # Our server serves the compared model alone, as the CTranslate2 peer does: with the whole repository
    # (two models, both from English) every call that names no model would also pay for language
    # identification, which routes between several models and which the peer never does.
    alone = work / "repo-alone"
    alone.mkdir(exist_ok=True)
    if not (alone / bundle.parent.name).exists():
        (alone / bundle.parent.name).symlink_to(bundle.parent)
    out = {}
    for prec in precisions:
        ours_repo = alone
        if prec == "int8" and "int8" not in json.loads((bundle / "config.json").read_text())["variants"]:
            ours_repo = work / "repo-int8"
            subprocess.run([sys.executable, "-m", "export", "--checkpoint", str(CKPT), "--out", str(ours_repo),
                            "--name", bundle.parent.name, "--int8"], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        ct2 = convert(CKPT, work / f"ct2-{prec}", "int8" if prec == "int8" else None)
        out[prec] = {"repo": str(ours_repo), "ct2": str(ct2), "tokenizer": str(bundle / "tokenizer.json")}
    return out


def ct2_config(spec: str, max_batch: int) -> dict:
    """'RxT[-bB][-dD][@GEMM]': R replicas (inter_threads) x T intra-op threads each, B texts per batch (default
    --max-batch-size), D ms of waiting for company (default 2), GEMM one of benchmarks/ct2_server.py's
    GEMM_BACKENDS (default: CTranslate2's own choice for the CPU)."""
    spec, _, backend = spec.partition("@")
    if (backend or "default") not in GEMM_BACKENDS:
        raise ValueError(f"unknown CTranslate2 GEMM setting {backend!r}; known: {', '.join(GEMM_BACKENDS)}")
    head, *rest = spec.split("-")
    replicas, threads = (int(x) for x in head.split("x"))
    out = {"replicas": replicas, "threads": threads, "batch": max_batch, "delay_ms": 2.0,
           "backend": backend or "default"}
    for part in rest:
        key = {"b": "batch", "d": "delay_ms"}[part[0]]
        out[key] = float(part[1:]) if key == "delay_ms" else int(part[1:])
    return out


def check_ct2_configs(parser: argparse.ArgumentParser, specs: Sequence[str], max_batch: int) -> None:
    """Stop at the command line on a malformed --ct2-configs setting, not after an hour of runs (or, in
    hf_compare, after the export)."""
    for spec in specs:
        try:
            ct2_config(spec, max_batch)
        except (ValueError, KeyError) as e:  # KeyError: a part other than -bB / -dD
            parser.error(f"--ct2-configs {spec}: {e}")


def default_ct2_configs(cores: int, max_batch: int) -> list[str]:
    """One replica on every core, a replica per core, and a replica per core with batches split between them."""
    out = [f"1x{cores}", f"{cores}x1", f"{cores}x1-b{max(1, max_batch // cores)}"]
    if cores >= 4:
        out.append(f"{cores // 2}x2")
    return out


def start(kind: str, prec: str, paths: dict, args) -> tuple[Callable[[], object], int, str]:
    """The server of `kind` ("ours", "before" or "ct2:SETTING") launched: (how to stop it, its pid, its target)."""
    if kind in ("ours", "before"):
        flags = args.ours_flags if kind == "ours" else args.before_flags
        server = ServerProcess("--model-repository", paths["repo"], "--variant", prec, "--max-queue-size", "4096",
                               "--max-batch-size", str(args.max_batch_size), *flags.split(), metrics=False).launch()
        return (lambda: server.stop(timeout=30)), server.pid, server.target
    return start_peer(kind.partition(":")[2], args.max_batch_size, "int8" if prec == "int8" else "float32",
                      "--model", paths["ct2"], "--tokenizer", paths["tokenizer"])


def start_peer(setting: str, max_batch: int, compute_type: str, *model: str) -> tuple[Callable[[], object], int, str]:
    """The CTranslate2 peer at `setting` (ct2_config's form) serving `model` (its --model and tokenizer flags)."""
    cfg = ct2_config(setting, max_batch)
    peer = PeerProcess(*model, "--replicas", str(cfg["replicas"]), "--threads", str(cfg["threads"]),
                       "--compute-type", compute_type, "--max-batch", str(cfg["batch"]),
                       "--max-delay-ms", str(cfg["delay_ms"]), env=backend_env(cfg["backend"], os.environ)).launch()
    return (lambda: peer.stop(timeout=30)), peer.pid, peer.target


WARM_S = 1.0  # of each level's own load before it is measured
IDLE_S = 5.0  # of doing nothing, for the idle CPU


async def settle(target: str, pid: int, texts: list[str]) -> float:
    """Wait for SERVING, warm the server up, then its CPU over IDLE_S of doing nothing (% of a core)."""
    from client.client import AsyncTranslatorClient
    from client.loadgen import grpc_stream, run_level
    async with AsyncTranslatorClient(target, timeout=300, retries=0) as client:
        await wait_serving(client)
        await run_level(grpc_stream(client), texts, 4, 16, 60)
        c0 = cpu_seconds(pid)
        await asyncio.sleep(IDLE_S)
        return 100 * (cpu_seconds(pid) - c0) / IDLE_S


async def measure_level(target: str, pid: int, texts: list[str], level, args) -> dict:
    """One load on a warm server: `level` N = N closed-loop streams, "unary" = --unary-clients clients of
    --unary-texts-text Translate calls. WARM_S of the same load first, unmeasured (a server that sat idle while
    the others were measured meets its first calls with cold caches), then --seconds of it, in-flight calls
    finishing. The cell: tokens/s, server CPU per output token, errors; for streams also TTFT p50 and e2e p90."""
    from client.client import AsyncTranslatorClient
    from client.loadgen import grpc_stream, run_level
    async with AsyncTranslatorClient(target, timeout=300, retries=0) as client:
        if level == "unary":
            await unary_load(client, texts, args, WARM_S)
            c0 = cpu_seconds(pid)
            cell = await unary_load(client, texts, args, args.seconds)
        else:
            stream = grpc_stream(client)
            await run_level(stream, texts, level, None, WARM_S)
            c0 = cpu_seconds(pid)
            res = (await run_level(stream, texts, level, None, args.seconds)).summary()
            cell = {"tokens": res["tokens"], "tokens_per_s": res["tokens_per_s"], "errors": res["errors"],
                    "ttft_p50_ms": res["ttft_ms"]["p50"], "e2e_p90_ms": res["e2e_ms"]["p90"]}
        cell["cpu_us_per_token"] = 1e6 * (cpu_seconds(pid) - c0) / max(cell["tokens"], 1)
        return cell


async def unary_load(client, texts: list[str], args, seconds: float) -> dict:
    """--unary-clients clients, each sending Translate calls of --unary-texts texts until `seconds` have
    passed (the calls in flight then finish and count)."""
    tokens, errors, sent = 0, 0, 0
    end = time.monotonic() + seconds

    async def one_client() -> None:
        nonlocal tokens, errors, sent
        while time.monotonic() < end:
            start, sent = sent * args.unary_texts, sent + 1
            batch = [texts[(start + j) % len(texts)] for j in range(args.unary_texts)]
            try:
                resp = await client.translate(batch)
                tokens += sum(t.output_tokens for t in resp.translations)
            except Exception:  # noqa: BLE001 (counted)
                errors += 1
    t0 = time.monotonic()
    await asyncio.gather(*(one_client() for _ in range(args.unary_clients)))
    dt = time.monotonic() - t0
    return {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt, "errors": errors}


def levels_of(args) -> list:
    return [*args.concurrency, "unary"]


def run_rotation(servers: dict[str, tuple[Callable[[], object], int, str]], texts: list[str], args,
                 label: str = "") -> dict[str, dict]:
    """Every contender in `servers` (kind -> (stop, pid, target)), all started and each idle while another
    is measured: each settles (warm-up, idle CPU), then every repeat serves each load to every contender back
    to back, in the repeat's rotated order. The contenders' figures for one load are then seconds apart, not
    the minutes a whole run of every load takes: a shared machine's drift (its speed moved by a quarter within
    minutes on these virtual machines) falls on both sides of each ratio alike. Returns per kind
    {"idle_cpu_percent", "levels": {level: [cell per repeat]}}."""
    raw = {kind: {"idle_cpu_percent": asyncio.run(settle(target, pid, texts)),
                  "levels": {level: [] for level in levels_of(args)}}
           for kind, (_, pid, target) in servers.items()}
    for rep, order in enumerate(rotations(list(servers), args.repeats)):
        for level in levels_of(args):
            for kind in order:
                _, pid, target = servers[kind]
                cell = asyncio.run(measure_level(target, pid, texts, level, args))
                raw[kind]["levels"][level].append(cell)
                name = "unary" if level == "unary" else f"{level} streams"
                print(f"  repeat {rep + 1}/{args.repeats}{label}, {name}, {kind}: {cell['tokens_per_s']:,.0f} tokens/s",
                      file=sys.stderr, flush=True)
    return raw


def start_all(kinds: Sequence[str], launch: Callable[[str], tuple]) -> dict[str, tuple]:
    """Every contender launched (`launch(kind)` -> (stop, pid, target)); if one fails, those already up stop."""
    servers: dict[str, tuple] = {}
    try:
        for kind in kinds:
            servers[kind] = launch(kind)
    except BaseException:
        stop_all(servers)
        raise
    return servers


def stop_all(servers: dict[str, tuple]) -> None:
    for stop, _, _ in servers.values():
        stop()


def median_of(raw: dict) -> dict:
    """One contender's cell-wise medians over repeats (tokens/s, TTFT p50, e2e p90, CPU per token), each
    stream load's range, and each load's tokens/s per repeat (for the paired ratios)."""
    med = statistics.median
    levels = raw["levels"]
    unary = levels["unary"]
    out = {"idle_cpu_percent": raw["idle_cpu_percent"], "streams": {},
           "unary_tokens_per_s": med([x["tokens_per_s"] for x in unary]),
           "unary_cpu_us_per_token": med([x["cpu_us_per_token"] for x in unary]),
           "unary_per_repeat": [x["tokens_per_s"] for x in unary],
           "unary_errors": sum(x["errors"] for x in unary)}
    for c, cells in levels.items():
        if c == "unary":
            continue
        tps = [x["tokens_per_s"] for x in cells]
        out["streams"][c] = {"tokens_per_s": med(tps),
                             "ttft_p50_ms": med([x["ttft_p50_ms"] for x in cells]),
                             "e2e_p90_ms": med([x["e2e_p90_ms"] for x in cells]),
                             "cpu_us_per_token": med([x["cpu_us_per_token"] for x in cells]),
                             "range": [min(tps), max(tps)], "per_repeat": tps,
                             "errors": sum(x["errors"] for x in cells)}
    return out


def paired_range(ours: list[float], peer: list[float]) -> str:
    """The lowest and highest of the per-repeat ratios ours / peer (a repeat's two figures for one load are
    measured seconds apart), as 'a-b'."""
    ratios = [o / p for o, p in zip(ours, peer)]
    return f"{min(ratios):.2f}-{max(ratios):.2f}"


def best_ct2(res: dict) -> dict:
    """The CTranslate2 contender at its best per load: {"streams": {c: cell + setting}, "unary_tokens_per_s",
    "unary_per_repeat", "unary_cpu_us_per_token", "unary_setting", "idle_cpu_percent"} over every ct2:SETTING
    in `res` (median_of's results), the best chosen by its median."""
    peers = {kind.partition(":")[2]: r for kind, r in res.items() if kind.startswith("ct2:")}
    out = {"streams": {}}
    for c in next(iter(peers.values()))["streams"]:
        setting, r = max(peers.items(), key=lambda kv: kv[1]["streams"][c]["tokens_per_s"])
        out["streams"][c] = {**r["streams"][c], "setting": setting}
    setting, r = max(peers.items(), key=lambda kv: kv[1]["unary_tokens_per_s"])
    out.update(unary_tokens_per_s=r["unary_tokens_per_s"], unary_per_repeat=r["unary_per_repeat"],
               unary_cpu_us_per_token=r["unary_cpu_us_per_token"], unary_setting=setting,
               idle_cpu_percent=min(p["idle_cpu_percent"] for p in peers.values()))
    return out


def render(results: dict, args, argv: list[str]) -> str:
    lines = ["# Serving: our server vs a CTranslate2 gRPC server", "",
             "What it measures: tokens/s, time to first token and server CPU per output token of our server "
             "(serving the compared model alone) against CTranslate2 behind benchmarks/ct2_server.py on the same "
             "checkpoint, streams at each load and unary batches. `python -m benchmarks.serving_compare` "
             "rewrites this page.", "",
             f"Command: `python -m benchmarks.serving_compare {shlex.join(argv)}`", "",
             date_line(), "",
             machine_line(f"Python {platform.python_version()}; both servers and the client share it"), "",
             f"Every server up at once, each idle while another is measured; each load served to every server in "
             f"turn, back to back (the order rotated by repeat): {WARM_S:g} s of it unmeasured, then {args.seconds:g} s "
             f"measured. Cells are medians of {args.repeats} repeats; \"per repeat\" is the range of each repeat's own "
             "ratio (its two figures seconds apart). Greedy decoding over test_2016_flickr.en.", "",
             "CT2 = benchmarks/ct2_server.py at its best setting for each load, out of "
             f"{', '.join(f'`{c}`' for c in args.ct2_configs)} (replicas x intra-op threads each, `-bB` texts per "
             "batch, `-dD` ms of waiting for company, `@GEMM` a GEMM library other than CTranslate2's own choice; all in "
             "the same rotation).", ""]
    if args.before_flags:
        lines += [f"\"before\" is our server with `{args.before_flags}` (the previous code path), run in the "
                  "same rotation.", ""]
    for prec, res in results.items():
        ours, base, before = res["ours"], best_ct2(res), res.get("before")
        peers = [k for k in res if k.startswith("ct2:")]
        extra_head, extra_rule = (" before tok/s | ours / before |", "---|---|") if before else ("", "")
        lines += [f"## {prec}", "",
                  f"| load | ours tok/s | CT2 best tok/s (setting) | ours / CT2 | per repeat |{extra_head} TTFT p50 ours "
                  "/ CT2 (ms) | e2e p90 ours / CT2 (ms) | server CPU µs/token ours / CT2 | CT2 tok/s by setting |",
                  f"|---|---|---|---|---|{extra_rule}---|---|---|---|"]
        for c in ours["streams"]:
            o, b = ours["streams"][c], base["streams"][c]
            extra = ""
            if before:
                x = before["streams"][c]
                extra = f" {x['tokens_per_s']:,.0f} | {o['tokens_per_s'] / x['tokens_per_s']:.2f} |"
            each = ", ".join(f"{res[k]['streams'][c]['tokens_per_s']:,.0f}" for k in peers)
            lines.append(f"| {c} streams | {o['tokens_per_s']:,.0f} | {b['tokens_per_s']:,.0f} (`{b['setting']}`) | "
                         f"**{o['tokens_per_s'] / b['tokens_per_s']:.2f}** | "
                         f"{paired_range(o['per_repeat'], b['per_repeat'])} |{extra} {o['ttft_p50_ms']:.1f} / "
                         f"{b['ttft_p50_ms']:.1f} | {o['e2e_p90_ms']:.0f} / {b['e2e_p90_ms']:.0f} | "
                         f"{o['cpu_us_per_token']:.0f} / {b['cpu_us_per_token']:.0f} | {each} |")
        extra = (f" {before['unary_tokens_per_s']:,.0f} | "
                 f"{ours['unary_tokens_per_s'] / before['unary_tokens_per_s']:.2f} |") if before else ""
        each = ", ".join(f"{res[k]['unary_tokens_per_s']:,.0f}" for k in peers)
        lines.append(f"| unary, {args.unary_texts} texts x {args.unary_clients} clients | "
                     f"{ours['unary_tokens_per_s']:,.0f} | {base['unary_tokens_per_s']:,.0f} (`{base['unary_setting']}`) | "
                     f"**{ours['unary_tokens_per_s'] / base['unary_tokens_per_s']:.2f}** | "
                     f"{paired_range(ours['unary_per_repeat'], base['unary_per_repeat'])} |{extra} | | "
                     f"{ours['unary_cpu_us_per_token']:.0f} / {base['unary_cpu_us_per_token']:.0f} | {each} |")
        lines += ["", f"Idle server CPU: ours {ours['idle_cpu_percent']:.1f}% of a core, "
                  f"CT2 server {base['idle_cpu_percent']:.1f}%"
                  + (f", before {before['idle_cpu_percent']:.1f}%" if before else "") + ".", ""]
    lines.append(f"![tokens/s]({Path(args.out).with_suffix('.png').name})")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (prec, res) in zip(axes[0], results.items()):
        res = {**res, "ct2": best_ct2(res)}
        levels = list(res["ours"]["streams"])
        for i, (kind, style) in enumerate((("ours", "o-"), ("ct2", "s--"), ("before", "^:"))):
            if kind not in res:
                continue
            ax.plot([str(c) for c in levels], [res[kind]["streams"][c]["tokens_per_s"] for c in levels], style,
                    color=f"C{i}", label=f"{'CT2 best' if kind == 'ct2' else kind} streams")
            ax.axhline(res[kind]["unary_tokens_per_s"], ls=":", color=f"C{i}", label=f"{'CT2 best' if kind == 'ct2' else kind} unary batches")
        ax.set(title=prec, xlabel="concurrent streams", ylabel="output tokens/s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src-file", default=str(TEST_SOURCES))
    p.add_argument("--precisions", type=lambda s: s.split(","), default=["fp32", "int8"])
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--seconds", type=float, default=10.0,
                   help="measured seconds per load and server (after 1 s of it unmeasured)")
    p.add_argument("--unary-texts", type=int, default=32)
    p.add_argument("--unary-clients", type=int, default=4)
    p.add_argument("--max-batch-size", type=int, default=64, help="decode slots (ours) / texts per batch (CT2)")
    p.add_argument("--ct2-configs", type=lambda s: s.split(","), default=None,
                   help="CTranslate2 settings to try, each 'RxT[-bB][-dD][@GEMM]' (R replicas x T threads each, B texts "
                        "per batch, D ms wait, GEMM one of default, mkl, mkl-packed, onednn: CTranslate2's GEMM "
                        "library); each load is compared with the best. Default: 1xC, Cx1 and Cx1 with batches "
                        "split, C = this machine's cores, each with CTranslate2's own GEMM choice")
    p.add_argument("--ours-flags", default="", help="extra flags for our server, e.g. '--stream-interval 4'")
    p.add_argument("--before-flags", default="",
                   help="also run our server with these flags as a third contender, e.g. '--decoder copy'")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "docs/benchmarks/serving_compare.md"))
    args = p.parse_args(argv)
    if not Path(args.src_file).exists():
        args.src_file = str(ROOT / "tests/data/test_2016_flickr.head200.en")
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    args.ct2_configs = args.ct2_configs or default_ct2_configs(os.cpu_count() or 2, args.max_batch_size)
    check_ct2_configs(p, args.ct2_configs, args.max_batch_size)
    kinds = ["ours", *(f"ct2:{spec}" for spec in args.ct2_configs)] + (["before"] if args.before_flags else [])
    raw: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = prepare(Path(tmp), args.precisions)
        for prec in args.precisions:
            print(f"{prec}: starting {', '.join(kinds)}", file=sys.stderr, flush=True)
            servers = start_all(kinds, lambda kind: start(kind, prec, paths[prec], args))
            try:
                raw[prec] = run_rotation(servers, texts, args, f", {prec}")
            finally:
                stop_all(servers)
    results = {prec: {kind: median_of(r) for kind, r in by.items()} for prec, by in raw.items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"results": results, "raw": raw}, indent=1))
    plot(results, out.with_suffix(".png"))
    notes = out.read_text()[out.read_text().index("\n## Reading") + 1:] \
        if out.exists() and "\n## Reading" in out.read_text() else ""
    out.write_text(render(results, args, argv) + ("\n" + notes if notes else ""))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
