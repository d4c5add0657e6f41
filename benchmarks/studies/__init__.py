"""One-off studies: each answered one question, and its answer is recorded in docs/ (the table in
README.md beside this file). They stay runnable (`python -m benchmarks.studies.<name>`) so that the
answer can be checked again, but nothing in CI or in a release runs them. The tools that are run
again and again (harness, serving_load, serving_compare, decode_throughput, the soak, rate_sweep,
the GPU suite, the frontend profile) stay in benchmarks/ itself."""
