"""`python -m server --help`: what each setting does and what it accepts (server/config.py adds its NMT_*
variable and its default). A setting without its line here fails at once: the parser reads every field's."""

HELP = {
    "host": "address to bind the gRPC port (and the metrics port) to",
    "port": "gRPC port; 0 picks a free one",
    "metrics_port": "Prometheus /metrics port; 0 picks a free one, -1 turns the endpoint off",
    "http_port": "HTTP/JSON port: the native API (/v1/...), DeepL- (/v2/...) and LibreTranslate-compatible "
                 "endpoints, /healthz and /readyz (docs/http.md); 0 picks a free one, -1 turns HTTP off",
    "http_host": "address to bind the HTTP port to; empty = --host",
    "http_keepalive_s": "HTTP: close a keep-alive connection idle this many seconds; >= 1",
    "http_max_connections": "HTTP: connections (and requests) at once; beyond, new ones get 503; >= 1",
    "http_max_header_bytes": "HTTP: largest request line plus headers; larger ones get 431 unread (Connection: close); >= 1024",
    "http_body_timeout_s": "HTTP: a request body must arrive within this many seconds (slow senders get 408); > 0",
    "memory_limit": "the server's memory budget, all its processes together: while their resident memory is at 90%% "
                    "of it, new Translate and Embed calls are refused with RESOURCE_EXHAUSTED (HTTP 429, Retry-After); "
                    "running calls and health go on; an HTTP body of 256 KiB or more is admitted by its size before "
                    "it is read; with --engine-replicas 0 only the replicas it holds at work start, and the "
                    "background replica only when it fits (docs/memory.md). auto: the cgroup's limit when there is "
                    "one, else none; 0: none; or a size: 500M, 2G",
    "web_ui": "HTTP: the translator page at / and the status page at /status (docs/web.md), calling only the "
              "API's own endpoints with the caller's key; false: those paths answer 404 like any unknown one",
    "model_repository": "folder of <model>/<version>/ bundles to serve (all of them); default: the checkout's "
                        "model_repository, else ./model_repository, else the bundle installed with the package",
    "model": "a Hugging Face translation model to serve (a local directory or a hub id), imported once into "
             "--cache-dir with every check of `python -m export --from-huggingface` and reused on later starts; "
             "repeat the flag for several (the env variable takes them comma-separated); given, it replaces "
             "--model-repository",
    "cache_dir": "where --model imports are kept; empty = $NMT_CACHE_DIR, else $XDG_CACHE_HOME/nmt-serve, "
                 "else ~/.cache/nmt-serve",
    "default_model": "model for requests that name none; empty = the first by name",
    "variant": "bundle graphs to run: fp32, int8 or fp16 (fp16 is for --provider cuda)",
    "int8_weights": "with --variant int8 on the CPU and the row-wise graphs (see --int8-activations): auto (the "
                    "bundle's 8-bit weights, int8-vnni, on a CPU with VNNI or AMX, exact there and one bit closer to "
                    "fp32; its 7-bit weights elsewhere), 7 (7-bit everywhere: the same tokens on every x86 CPU of a "
                    "mixed fleet) or 8 (which also chooses the row-wise graphs)",
    "int8_activations": "with --variant int8 on the CPU: auto (the bundle's int8-static graphs, activation ranges "
                        "calibrated at export, where it has them and --int8-weights is not 8; the row-wise graphs "
                        "otherwise), static (those, or refuse to start) or row (activations quantised per row "
                        "while serving, as before)",
    "calibration_text": "with --model and --variant int8: a file of source-language sentences, one per line, that "
                        "the import decodes to calibrate the int8-static graphs (export --calibration-text); "
                        "without it an imported model serves the row-wise int8",
    "provider": "ONNX Runtime execution provider: auto (CUDA when available), cpu or cuda",
    "device": "CUDA devices for the engine replicas, one replica each: e.g. cuda:0 or cuda:0,cuda:1; empty = "
              "every visible device with --engine-core process (CuPy counts them; one without it), device 0 "
              "otherwise. Ignored on the CPU",
    "decoder": "decoder graph: auto (the in-place slot-cache step where the bundle has it and the provider "
               "runs it: GroupQueryAttention on the CPU and for fp16 on CUDA, the standard-op graph for fp32 on "
               "CUDA, with the cache on the device), inplace (GQA), standard (opset-24 TensorScatter and "
               "Attention), or copy (decoder_step.onnx over gathered copies of the cache)",
    "cuda_graphs": "on CUDA, replay the fp32 in-place decode step as CUDA graphs, one per bucket of running rows "
                   "(an H200: the step alone 1.6-4.3x faster, served +15%% through gRPC at 8 streams and +6%% at "
                   "256, the same tokens). Ignored on the CPU and for fp16 (GQA's graph cannot be replayed)",
    "intra_op_threads": "ONNX Runtime intra-op threads shared by every session; 0 = one per physical core, "
                        "less one per frontend process with --engine-core process (at least 1)",
    "inter_op_threads": "ONNX Runtime inter-op threads (graphs run sequentially; 1 is right)",
    "ort_spinning": "ONNX Runtime's intra-op workers spin-wait between kernels (auto/true/false). true: one pool "
                    "shared by every session, fastest when the engine has the cores; false: a pool per session "
                    "whose workers sleep, leaving idle cycles to the gRPC threads and to other processes; auto: "
                    "true with --engine-core thread, false with --engine-core process (spinning workers there "
                    "take the cores the frontend process needs: docs/serving_speed.md)",
    "max_batch_size": "decode rows (KV cache slots) per model: the continuous batch's width; >= 1",
    "max_batch_tokens": "source tokens per encoder pass; >= --max-source-tokens",
    "max_encode_padding": "admitted texts are encoded in length groups padded at most this share; in [0, 1)",
    "max_queue_delay_ms": "with nothing running, wait this long for company before encoding a lone arrival; >= 0",
    "max_queue_size": "sentences waiting per model; a request that does not fit gets RESOURCE_EXHAUSTED; "
                      ">= --max-sentences-per-request",
    "stream_interval": "streams: the first token at once, then messages of at least N tokens (a visit of several "
                       "steps, --visit-steps, may send more at once); >= 1",
    "visit_steps": "most decode steps per visit of the engine's host work when every running row is plain greedy: "
                   "the steps run back to back, each step's ids fed to the next as an array, and the rows' "
                   "bookkeeping, events and stream messages happen once per visit (a message then carries up to "
                   "N tokens). As many steps as take about 5 ms (a step that long is a visit of its own: the "
                   "shipped model on a CPU at a full batch), and one in the iteration that admits new rows (their "
                   "first token goes out at once) or while work waits for a free slot; a visit ends at the step "
                   "any row ends (its answer is not held). 1 = a visit per step; >= 1",
    "max_texts_per_request": "texts in one Translate or Embed call; >= 1",
    "max_text_chars": "characters per text (a text may be a whole document), checked before splitting; >= 1",
    "max_sentences_per_request": "sentences (decoded sequences) in one Translate/TranslateStream call, all its "
                                 "texts together; >= --max-texts-per-request",
    "runaway_guard": "stop a decode whose output loops or outgrows its source, finish reason RUNAWAY (true/false)",
    "runaway_min_span": "runaway guard: a loop is one n-gram (1-6 tokens) repeated back to back over at least "
                        "this many tokens (and at least 3 times); >= 2",
    "runaway_length_ratio": "runaway guard: stop past this many output tokens per source token (+16); > 0",
    "max_request_bytes": "largest request message accepted (bigger ones get RESOURCE_EXHAUSTED unparsed; HTTP "
                         "bodies 413); TranslateFile's carry a file and may reach the file limit, 10 MiB + 64 KiB, "
                         "instead; >= 1",
    "max_source_tokens": "source tokens per text (capped by the model's positions); >= 1",
    "max_output_tokens": "generated tokens per text (capped by the model's positions); >= 1",
    "max_beam_size": "largest beam_size a request may ask for; >= 1",
    "max_hypotheses": "largest num_hypotheses a request may ask for; >= 1",
    "grace_period_s": "on SIGTERM: seconds in-flight work may take to finish before it is failed; >= 0",
    "lame_duck_s": "on SIGTERM, first: seconds of health NOT_SERVING while new and in-flight requests are still "
                   "served, so balancers and clients move away; then the --grace-period-s drain; >= 0",
    "max_connection_age_ms": "send GOAWAY to a connection this old (gRPC adds +-10%% jitter) so clients reconnect "
                             "and re-resolve: traffic spreads to replicas added later; 0 = never",
    "max_connection_age_grace_ms": "after that GOAWAY, calls still running on the connection get this long before "
                                   "it is closed; 0 = no limit",
    "keepalive_time_ms": "ping a connection after this long without traffic, to find dead peers; 0 = never",
    "keepalive_timeout_ms": "close a connection whose keepalive ping is not answered within this; >= 1",
    "keepalive_min_ping_interval_ms": "clients may ping (without data) at most this often; a client pinging faster "
                                      "is sent GOAWAY (too_many_pings); >= 0",
    "keepalive_permit_without_calls": "accept keepalive pings on connections with no call running (true/false)",
    "workers": "threads that validate and tokenise large requests (over 2,000 characters) off the event loop; >= 1",
    "engine_core": "where the engine (ONNX Runtime, slot cache, scheduler, decode loop) runs: process (the "
                   "default: --engine-replicas core processes of their own; a crash or a stuck loop there fails "
                   "that replica's calls UNAVAILABLE and it restarts while the ports stay up; measured faster "
                   "on streams and unary batches, docs/serving_speed.md) or thread (in this process, beside the "
                   "gRPC/HTTP frontend: one process, in-process tests; docs/architecture.md)",
    "glossary_db": "SQLite file of the DeepL glossaries (server/glossary/, docs/glossaries.md), created if missing; "
                   "empty = $XDG_CACHE_HOME/nmt-serve/glossaries.sqlite3 (~/.cache when unset)",
    "document_dir": "directory of the document jobs' records and results (/v2/document, /translate_file, "
                    "/v1/files, TranslateFile), shared by the --frontends processes; a job's result is kept there "
                    "until downloaded or an hour old; empty = a temporary directory removed at exit",
    "background_replica": "with --engine-core process on CPU: an engine core process at the lowest CPU "
                          "priority (nice 19) for PRIORITY_BACKGROUND work (every document file's texts), started "
                          "at its first such request and stopped after a minute without one, so a big document "
                          "decodes on CPU time interactive calls leave idle (docs/benchmarks/document_load.md); "
                          "false: background work shares the replicas, after interactive work in their queues",
    "engine_replicas": "engine core processes (--engine-core process), each with every model, its own ONNX Runtime "
                       "sessions, slot cache, scheduler and loop; a call goes to the replica with the least "
                       "outstanding work, a replica that dies costs only its own calls and restarts while the "
                       "others serve (server/frontend/cores/replicas.py); 0 = one per physical core (less one per "
                       "extra frontend) with --engine-core process, fewer under --memory-limit (as many as it "
                       "holds at work, measured on the first one), else 1",
    "spread_row_cost_ms": "with engine replicas: streams of a model whose decode rows each cost more than this "
                          "per step (measured by every engine core once warm) go to the replica with the least "
                          "outstanding work, as every other call does; cheaper models' streams fill one "
                          "replica's batch before the next (server/frontend/cores/placement.py: spreading pays "
                          "when a row costs more than the rest of a token's CPU, a message per token for a "
                          "stream); 0 = spread every stream; >= 0",
    "frontends": "gRPC/HTTP frontend processes sharing the ports over one engine core (needs --engine-core "
                 "process; > 1 spreads connections with SO_REUSEPORT); 0 = one per 4 cores with --engine-core process, "
                 "else 1",
    "watchdog_s": "no engine progress for this long with work waiting: NOT_SERVING, requests fail with "
                  "UNAVAILABLE, exit status 3; > 0",
    "warmup": "translate once per model before reporting SERVING (true/false)",
    # Security (server/security/, docs/security.md).
    "metrics_host": "address to bind the metrics endpoint to; empty = --host (e.g. 127.0.0.1 or an internal "
                    "interface: /metrics has no auth)",
    "tls_cert_file": "PEM certificate chain of the gRPC port; with --tls-key-file the port speaks only TLS",
    "tls_key_file": "PEM private key (unencrypted) of --tls-cert-file",
    "tls_client_ca_file": "PEM CA certificate(s): mutual TLS, every client must present a certificate they signed",
    "api_keys_file": "API keys: lines 'KEY_ID SHA256_HEX [models=a,b] [rpm=N] [tpm=N] [input_tpm=N] "
                     "[output_tpm=N] [characters=N]'; clients send 'authorization: Bearer KEY'; reloaded on SIGHUP; empty = no auth",
    "auth_health_and_reflection": "require an API key for grpc.health.v1 and reflection too (true/false)",
    "auth_metrics_max_keys": "distinct key ids labelled in nmt_auth_requests_total; later ones count as 'other'; "
                             ">= 0",
    # Observability (server/observability/, docs/observability.md).
    "log_format": "log lines on stderr: auto (text on a terminal, else json), json (one object per line) or text",
    "log_level": "lowest level logged: debug, info (with the access log: one line per RPC), warning, error",
    "otlp_endpoint": "OpenTelemetry traces over OTLP/gRPC to this collector (http://host:4317 for plaintext); "
                     "empty = OTEL_EXPORTER_OTLP_ENDPOINT, unset too = no tracing; needs the otel extra",
}
