"""--report DIR: PNG plots and an index.html that shows them with the results table.

Drawn from the result JSON alone (each level keeps a 101-point percentile grid of its
latencies), so `python -m client.loadgen report run.json DIR` redraws an old run.

    latency_cdf.png   TTFT, TPOT and e2e distributions, one line per level
    saturation.png    achieved and good throughput, and p90 TTFT / e2e, against offered load:
                      where throughput stops following the load and latency turns up is the knee
    windows.png       throughput and p90 latency per window over the run (and the server's KV
                      cache use and queue depth when /metrics was sampled): drift and warm-up show here
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from client.loadgen.report import COLUMNS, label, rows

PNGS = ("latency_cdf.png", "saturation.png", "windows.png")


def _plt():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on a server or in CI
    import matplotlib.pyplot as plt
    return plt


def latency_cdf(levels: list[dict], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in zip(axes, ("ttft", "tpot", "e2e"),
                              ("time to first token", "time per output token", "end to end")):
        for lv in levels:
            q = (lv.get("quantiles_ms") or {}).get(key) or []
            if q:
                ax.plot(q, [i / (len(q) - 1) for i in range(len(q))], label=label(lv))
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def saturation(levels: list[dict], knee, path: Path) -> None:
    plt = _plt()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    open_loop = bool(levels) and levels[0].get("mode") == "open"
    x = [lv["offered_rps"] if open_loop else lv["concurrency"] for lv in levels]
    xlabel = "offered load (requests/s)" if open_loop else "concurrency (requests in flight)"
    left.plot(x, [lv["achieved_rps"] for lv in levels], "o-", label="achieved (OK) req/s")
    left.plot(x, [lv["goodput_rps"] for lv in levels], "s--", label="goodput (meets SLOs) req/s")
    if open_loop:
        left.plot(x, x, ":", color="grey", label="offered")
    twin = left.twinx()
    twin.plot(x, [lv["output_tokens_per_s"] for lv in levels], "^-", color="tab:green", alpha=0.6,
              label="output tokens/s")
    twin.set_ylabel("output tokens/s")
    left.set_ylabel("requests/s")
    left.set_title("throughput")
    for key, style in (("ttft_ms", "o-"), ("e2e_ms", "s--")):
        ys = [(lv.get(key) or {}).get("p90") for lv in levels]
        pts = [(a, b) for a, b in zip(x, ys) if b is not None]
        if pts:
            right.plot(*zip(*pts), style, label=f"p90 {key[:-3]}")
    right.set_ylabel("ms")
    right.set_title("p90 latency")
    for ax in (left, right):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if knee is not None:
            ax.axvline(knee, color="red", alpha=0.4, linestyle="--")
    handles = left.get_legend_handles_labels()
    extra = twin.get_legend_handles_labels()
    left.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7)
    if right.get_legend_handles_labels()[0]:
        right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def windows(levels: list[dict], path: Path) -> None:
    plt = _plt()
    has_server = any((lv.get("server") or {}).get("series") for lv in levels)
    fig, axes = plt.subplots(3 if has_server else 2, 1, figsize=(12, 8 if has_server else 5.5), sharex=True)
    for lv in levels:
        t0 = lv.get("started_s", 0.0)
        wins = lv.get("windows") or []
        mid = [t0 + (w["start_s"] + w["end_s"]) / 2 for w in wins]
        axes[0].plot(mid, [w["rps"] for w in wins], "o-", label=label(lv))
        for key, style in (("ttft_p90_ms", "o-"), ("e2e_p90_ms", "s--")):
            pts = [(m, w[key]) for m, w in zip(mid, wins) if w[key] is not None]
            if pts:
                axes[1].plot(*zip(*pts), style, label=f"{label(lv)} {key[:-7]} p90")
        if has_server:
            pts = (lv.get("server") or {}).get("series") or []
            kv = [(t0 + p["t_s"], 100 * p["kv_usage"]) for p in pts if p["kv_usage"] is not None]
            if kv:
                axes[2].plot(*zip(*kv), "-", label=f"{label(lv)} KV %")
            axes[2].plot([t0 + p["t_s"] for p in pts], [p["waiting"] for p in pts], ":", label=f"{label(lv)} waiting")
    axes[0].set_ylabel("OK requests/s")
    axes[1].set_ylabel("ms")
    if has_server:
        axes[2].set_ylabel("KV cache % / queued")
    axes[-1].set_xlabel("seconds since the run started (levels one after another)")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _html(result: dict) -> str:
    levels, cfg = result.get("levels", []), result.get("config", {})
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{esc(v)}</td>" for v in r) + "</tr>" for r in rows(levels))
    notes = []
    for lv in levels:
        errs = {k: v for k, v in lv.get("codes", {}).items() if k != "OK"}
        if errs:
            notes.append(f"{label(lv)}: errors by code {errs}")
        if lv.get("stability"):
            notes.append(f"{label(lv)}: {lv['stability']}")
    knee = (result.get("saturation") or {}).get("knee")
    summary = {k: cfg.get(k) for k in ("targets", "mode", "levels", "requests", "duration", "seed", "arrival",
                                       "burstiness", "slo", "metrics_urls")}
    imgs = "".join(f'<h2>{esc(p[:-4].replace("_", " "))}</h2><img src="{p}" alt="{p}">' for p in PNGS)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>nmt.v1 load report</title><style>"
            "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}img{max-width:100%}"
            "pre{background:#f4f4f4;padding:1em}</style></head><body>"
            f"<h1>nmt.v1 load report</h1><p>started {esc(str(result.get('started', '')))}; "
            f"latencies in ms; knee: {esc(str(knee))}</p>"
            f"<table><tr>{head}</tr>{body}</table>"
            + ("<ul>" + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>" if notes else "")
            + imgs + f"<h2>configuration</h2><pre>{esc(json.dumps(summary, indent=1))}</pre>"
            + f"<h2>mix</h2><pre>{esc(json.dumps(cfg.get('mix'), indent=1))}</pre></body></html>\n")


def write_report(result: dict, directory: str | Path) -> list[Path]:
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    levels = result.get("levels", [])
    latency_cdf(levels, out / PNGS[0])
    saturation(levels, (result.get("saturation") or {}).get("knee"), out / PNGS[1])
    windows(levels, out / PNGS[2])
    (out / "index.html").write_text(_html(result), encoding="utf-8")
    return [out / p for p in PNGS] + [out / "index.html"]
