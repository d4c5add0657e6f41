"""Load generator for any nmt.v1 Translator endpoint: closed or open loop, mixes, SLOs, reports.

    python -m client.loadgen --target HOST:PORT --src-file test.en --concurrency 1,8,32 --requests 200
    python -m client.loadgen --target HOST:PORT --src-file test.en --rate 5,10,20 --duration 60 \\
        --warmup 5s --slo-ttft-ms 200 --metrics-url HOST:9090 --json run.json --report run/
    python -m client.loadgen compare before.json after.json

docs/loadgen.md has the walkthrough. Modules: __main__ (CLI), workload (mix, plan, arrival
schedules), calls (channels, TLS, API key, one request), runner (closed and open loop),
measure (statistics), server_metrics (/metrics sampling), session (a run of levels),
report (terminal, JSON), plots (PNG + HTML), compare.

Result JSON: {"tool", "schema", "started", "config", "levels": [...], "saturation": {"knee", "rule"}}.
Latencies are in milliseconds, rates per second, durations in seconds. Statistics cover the
measured phase only (the warm-up is a separate, drained phase before it). Counts include
every request sent; latency statistics only requests that finished OK.

Level fields:
    mode: "closed" (a fixed number of requests in flight) or "open" (sends on a schedule)
    concurrency: requests in flight in a closed loop (null in an open loop)
    offered_rps: the open loop's scheduled rate, requests/s (null in a closed loop)
    arrival: open loop inter-arrival law: poisson, gamma or constant (null in a closed loop)
    burstiness: gamma shape; 1 = Poisson, < 1 burstier, > 1 more regular (null in a closed loop)
    seed: seed of the request plan and the arrival schedule
    schedule_digest: fingerprint of the requests sent (mix entry, texts, sampling seed) and, in an
        open loop, their send offsets: equal digests mean two runs offered the same work
    warmup_requests: requests sent in the warm-up phase before this level (not in any statistic)
    started_s: when the measured phase began, seconds after the run started
    duration_s: first send to last completion of the measured phase
    sent: requests sent (= requests + errors)
    requests: requests that finished with status OK
    errors: requests that did not (any other status, a client-side failure, or cancelled at the hard stop)
    unsent: open loop sends skipped because the level's hard stop came first (normally 0)
    codes: status name -> count (gRPC names; CLIENT_ERROR for a request the client could not send)
    calls: RPC name -> status name -> count, the shape of the server's nmt_requests_total
    targets: target -> requests sent there (several targets are used round-robin)
    late_sends: open loop sends that left more than 10 ms after their scheduled time (a
        saturated client: the offered load was not really offered)
    max_send_lag_ms: the largest of those delays
    client_loop_lag_ms: how late the load generator's own event loop ran a timer due every 50 ms
        ({n, mean, std, p50, p90, p99}): a response that has arrived waits about that long before
        it is read, so large values mean the latencies include the client's own wait (it shares
        CPU with the server, or needs more client processes); the report says so above 20 ms p99
    output_tokens: output tokens of the OK requests, as the server reported them
    texts: texts translated by the OK requests (a unary call may carry several)
    achieved_rps: OK requests per second of duration_s
    output_tokens_per_s: output_tokens per second of duration_s
    goodput_rps: requests that finished OK and met every given SLO, per second of duration_s
    slo: {ttft_ms, tpot_ms, e2e_ms (the limits given, null if not), met (count), met_ratio (of sent)}
    ttft_ms: time to first token of streams: send until the first message carrying tokens
    itl_ms: inter-token latency: gaps between consecutive token-carrying stream messages
    tpot_ms: time per output token of streams: (e2e - ttft) / (output tokens - 1), for > 1 token
    e2e_ms: send until the call's status arrived, streams and unary calls alike
        (each of the four: {n, mean, std, p50, p90, p99}; values null when n = 0)
    quantiles_ms: {ttft, tpot, e2e}: the 0th..100th percentiles (101 values) for CDF plots
    window_s: the width of the windows below (about a tenth of the level, at least 1 s)
    windows: per window of completions: {start_s, end_s, full, requests, rps, output_tokens_per_s,
        ttft_p90_ms, e2e_p90_ms}
    stability: null when the last 3 full windows of the sending phase agree within 10% on
        throughput and p90 e2e; otherwise a note saying how they disagree
    server: null without --metrics-url; otherwise the server fields below
    tokens, tokens_per_s, seconds: output_tokens, output_tokens_per_s and duration_s under the
        pre-package tool's names (benchmarks/serving_load.py reads them)

Server fields:
    urls: the /metrics endpoints scraped (counters are summed over them)
    scrapes: successful scrapes: one at the start, one a second, one at the end
    scrape_errors: scrapes that failed (the run goes on without them)
    requests: RPC -> status -> count, the delta of nmt_requests_total over the level
    matches_client: whether requests equals the level's calls (false: other clients, a proxy, retries)
    output_tokens: delta of nmt_output_tokens_total
    queue_ms_mean: mean queue time, delta of nmt_queue_duration_seconds _sum / _count
    decode_batch_mean: mean rows per decode step, delta of nmt_decode_batch_size _sum / _count
    kv_cache_usage: {mean, max} of the nmt_kv_cache_usage_ratio samples (0..1)
    waiting_max: the most texts seen waiting for a slot (nmt_waiting_requests)
    series: per scrape {t_s, kv_usage, waiting, running}, for the time-series plot
    note: only when fewer than two scrapes succeeded: why the figures above are missing
"""
from client.loadgen.calls import StreamFn, grpc_stream
from client.loadgen.measure import Sample
from client.loadgen.runner import LevelResult, run_level

__all__ = ["LevelResult", "Sample", "StreamFn", "grpc_stream", "run_level"]
