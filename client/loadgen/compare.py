"""`compare A.json B.json`: level by level, what changed from run A to run B.

Levels are matched by mode and load (concurrency or offered rate). Each metric shows A, B
and the relative change, flagged `worse` when it moved the wrong way by more than the
threshold; with --fail-above PCT the command exits 1 on any such regression, so a CI job
can gate on it. A different schedule digest is called out: then the two runs did not
offer the same requests at the same times, and only large differences mean much.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional, Sequence

# (path into the level, label, +1 if higher is better / -1 if lower is better)
METRICS = (
    ("achieved_rps", "OK req/s", +1),
    ("goodput_rps", "goodput req/s", +1),
    ("output_tokens_per_s", "output tok/s", +1),
    ("ttft_ms.p50", "TTFT p50 ms", -1),
    ("ttft_ms.p90", "TTFT p90 ms", -1),
    ("tpot_ms.p50", "TPOT p50 ms", -1),
    ("tpot_ms.p90", "TPOT p90 ms", -1),
    ("itl_ms.p90", "ITL p90 ms", -1),
    ("e2e_ms.p50", "e2e p50 ms", -1),
    ("e2e_ms.p90", "e2e p90 ms", -1),
    ("e2e_ms.p99", "e2e p99 ms", -1),
    ("errors", "errors", -1),
    ("late_sends", "late sends", -1),
    ("server.queue_ms_mean", "server queue ms", -1),
    ("server.decode_batch_mean", "server decode batch", +1),
)


def load(path: str | Path) -> dict:
    """A result file; the pre-package tool's bare list of closed-loop levels is accepted too."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if isinstance(data, list):
        data = {"levels": [{"mode": "closed", **lv} for lv in data]}
    for lv in data.get("levels", []):
        lv.setdefault("achieved_rps", lv["requests"] / lv["seconds"] if lv.get("seconds") else None)
        lv.setdefault("output_tokens_per_s", lv.get("tokens_per_s"))
    return data


def key(lv: dict) -> tuple:
    return ("open", float(lv["offered_rps"])) if lv.get("mode") == "open" else ("closed", int(lv["concurrency"]))


def get(lv: dict, path: str):
    for part in path.split("."):
        if not isinstance(lv, dict):
            return None
        lv = lv.get(part)
    return lv if isinstance(lv, (int, float)) else None


def change(a, b) -> Optional[float]:
    """Relative change; None when either side is missing or A is 0 (no ratio to speak of)."""
    if a is None or b is None or a == 0:
        return None
    return (b - a) / abs(a)


def is_worse(a, b, better: int, threshold: float) -> bool:
    if a is None or b is None or a == b:
        return False
    if a == 0:  # e.g. errors 0 -> 3: any move the wrong way counts
        return (b - a) * better < 0
    return (b - a) / abs(a) * better < -threshold


def compare(a: dict, b: dict, threshold: float = 0.05) -> dict:
    """{"levels": [{"level", "digest_differs", "rows": [...]}], "only_a", "only_b", "regressions"}."""
    a_levels, b_levels = {key(lv): lv for lv in a["levels"]}, {key(lv): lv for lv in b["levels"]}
    out, regressions = [], 0
    for k in [k for k in a_levels if k in b_levels]:
        la, lb = a_levels[k], b_levels[k]
        lines = []
        for path, name, better in METRICS:
            va, vb = get(la, path), get(lb, path)
            if va is None and vb is None:
                continue
            c = change(va, vb)
            worse = is_worse(va, vb, better, threshold)
            regressions += worse
            lines.append({"metric": name, "a": va, "b": vb, "change": c, "worse": worse})
        differs = bool(la.get("schedule_digest") and lb.get("schedule_digest")
                       and la["schedule_digest"] != lb["schedule_digest"])
        out.append({"level": f"c={k[1]}" if k[0] == "closed" else f"{k[1]:g} rps", "digest_differs": differs,
                    "rows": lines})
    return {"levels": out, "only_a": [str(k) for k in a_levels if k not in b_levels],
            "only_b": [str(k) for k in b_levels if k not in a_levels], "regressions": regressions,
            "threshold": threshold}


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:,.3g}" if abs(x) < 10 else f"{x:,.1f}"


def render(result: dict, name_a: str = "A", name_b: str = "B") -> str:
    lines = []
    for lv in result["levels"]:
        lines.append(f"== {lv['level']}" + ("  (schedules differ: different seed, mix or sources)"
                                             if lv["digest_differs"] else ""))
        width = max(len(r["metric"]) for r in lv["rows"]) if lv["rows"] else 10
        lines.append(f"  {'metric'.ljust(width)}  {name_a[:12]:>12}  {name_b[:12]:>12}  {'change':>8}")
        for r in lv["rows"]:
            c = r["change"]
            pct = "-" if c is None else f"{100 * c:+.1f}%"
            lines.append(f"  {r['metric'].ljust(width)}  {_num(r['a']):>12}  {_num(r['b']):>12}  {pct:>8}"
                         + ("  worse" if r["worse"] else ""))
    for side, keys in (("A", result["only_a"]), ("B", result["only_b"])):
        if keys:
            lines.append(f"levels only in {side}: {', '.join(keys)}")
    lines.append(f"{result['regressions']} metric(s) worse by more than {100 * result['threshold']:.0f}%")
    return "\n".join(lines)


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m client.loadgen compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", help="baseline result JSON")
    p.add_argument("b", help="candidate result JSON")
    p.add_argument("--threshold", type=float, default=5.0, help="percent change that counts as worse")
    p.add_argument("--fail-above", type=float, default=None,
                   help="exit 1 if any metric is worse by more than this many percent")
    p.add_argument("--json", help="also write the comparison here")
    args = p.parse_args(argv)
    threshold = (args.fail_above if args.fail_above is not None else args.threshold) / 100
    result = compare(load(args.a), load(args.b), threshold)
    print(render(result, Path(args.a).stem, Path(args.b).stem))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 1 if args.fail_above is not None and result["regressions"] else 0
