"""Which replica takes a call: pack one replica's batch or spread over them, by the call's kind and the
model's measured cost per row.

Measured problem (issue 35, 2026-11-28, 2-core AMD EPYC with AVX2): the replicas filled one batch before
opening the next (server/frontend/cores/replicas.py), which is right for the shipped model, whose decode step
is mostly fixed cost (ONNX Runtime's per-node overhead, the engine's Python, the hop to the frontend): two
half-full replicas pay it twice per token. An OPUS-MT-sized Marian (d_model 512, 6+6 layers, a 58k
vocabulary) is the opposite: its step is nearly all per-row work, so 32 streams packed into one replica
kept one core decoding while the other had little to do. The same server with the rows split 16 + 16
(`--max-batch-size 16`) served 701-722 tokens/s against 476-483 packed, TTFT p50 100 against 141 ms
(two alternating rounds of 25 s each; docs/serving_speed.md has these runs and the rule's own).

The rule. One replica per core; a decode step of b rows costs F + m * b (F fixed, m per row), and the rest
of the pipeline (the frontend's handlers and gRPC writes, and callers on the same host) costs P of CPU per
output token. Packed, the replica's core limits at 1 / (F/b + m) tokens per second and the machine at
2 / (P + F/b + m); spread over two replicas, the machine at 2 / (P + 2F/b + m). Spreading wins exactly when
m > P, whatever b: when a row's own decoding costs more than everything else a token needs, the replica's
core is the bottleneck and a second core is worth one more fixed cost per step. So each engine core
measures m per model once warm (`measure_row_cost`, below) and says it in its Ready; the frontend spreads
a model's streams by least outstanding work when m is above --spread-row-cost-ms, and packs them otherwise.
P was 0.15-0.45 ms per streamed token in the frontends measured (docs/serving_speed.md); the line's default,
0.5 ms, packs the shipped models' streams (0.07-0.22 ms per row) and spreads an OPUS-MT-sized one's (~2 ms).
Near the line the two layouts cost about the same, so a noisy measurement there costs little either way.

A call without a stream (Translate, documents, the HTTP APIs, Embed) writes no message per token, so its P
is a few tens of µs (the frontend's whole share of a 32-text call: 28 µs per token, docs/benchmarks/
frontend_profile.md), below the row cost of every model measured: it always goes to the least outstanding work. Measured
with the shipped en-de (alternating, two rounds of 15 s, AVX2 AMD EPYC, 2026-11-28): two callers of 32-text
calls 12,584-12,806 tokens/s spread against 7,648-7,914 packed into one replica's batch of 64; 64 callers
of 1-text calls 7,870-7,945 against 6,875-7,315; while 64 streams served 4,158-4,277 spread against
4,452-4,577 packed (TTFT p50 154-166 against 90-112 ms), as the rule says. Ties go to the first replica
rather than rotating: one caller's calls, one after another, found a cold replica every other time that
way (7,429-7,445 tokens/s on one replica against 6,875-6,950 alternating).
"""
from __future__ import annotations

from server.core.request import DecodingParams

ROWS = 16  # rows of the wide measurement (or the batch's width, if narrower)
STEPS = 8  # decode steps per measurement: every row decodes exactly this many tokens
TRIES = 2  # each measurement this many times; the fastest counts (the first may still meet cold caches)


def measure_row_cost(model, rows: int = ROWS, steps: int = STEPS, tries: int = TRIES) -> float:
    """Seconds per row per decode step of `model` (a ModelEngine with its engine loop running, idle), from
    whole loop iterations at 1 row and at `rows` rows: (T(rows) - T(1)) / (rows - 1), at least 0. 0.0 when
    the batch holds a single row (nothing to spread)."""
    rows = min(rows, model.capacity)
    if rows < 2:
        return 0.0
    one = min(_step_seconds(model, 1, steps) for _ in range(tries))
    wide = min(_step_seconds(model, rows, steps) for _ in range(tries))
    return max(0.0, (wide - one) / (rows - 1))


def _step_seconds(model, rows: int, steps: int) -> float:
    """Wall seconds per decode step with `rows` rows: as many probe calls, each forced to decode exactly
    `steps` tokens, submitted together (one encoder pass, then every step with all of them)."""
    params = DecodingParams(min_output_tokens=steps, max_output_tokens=steps)
    jobs = model.run_probes(params, rows, "measuring the decode step", 120.0)
    first = min(job.timing.first_token for job in jobs)
    last = max(job.timing.finished for job in jobs)
    return (last - first) / max(1, steps - 1)


def choose(links: list, rows: int, stream: bool, row_cost_s: float, line_ms: float, pack_rows: int):
    """The replica (one of `links`: live, in order of preference; each with `jobs`, `source_tokens` and
    `background_jobs`) for an interactive call of `rows` decode rows. A stream of a model whose rows cost at
    most `line_ms` each goes to the first whose outstanding rows leave room for it within `pack_rows`; every
    other call, and a stream that finds no room, to the least outstanding work among those holding no
    background work if any does not (ties: the first)."""
    if stream and not spreads(row_cost_s, line_ms):
        for link in links:
            if len(link.jobs) + rows <= pack_rows:
                return link
    return min(links, key=lambda link: (link.background_jobs > 0, link.source_tokens))


def spreads(row_cost_s: float, line_ms: float) -> bool:
    """True when a model whose rows cost `row_cost_s` each per step should be spread over the replicas."""
    return row_cost_s * 1000.0 > line_ms
