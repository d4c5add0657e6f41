# Everything a fresh machine needs, in two commands:
#   make serve                     # install the serving runtime only (no torch) into .venv, serve the
#                                  # shipped model (gRPC :50051, metrics :9090); SERVE_ARGS="--port 6000"
#   make test                      # install everything into .venv, run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= train,export,serve,dev,bench
SERVE_EXTRAS ?= serve
SERVE_ARGS ?=
TEXT   ?= A man is riding a bike.

.PHONY: install serve test test-fast translate clean protos

install: $(VENV)/.installed

# torch is installed first and pinned exactly, so pip takes the local CPU wheel
# instead of resolving a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

# Serving needs neither torch nor the training, export and test tools: the `serve` extra alone.
# (After `make test` the same .venv has everything; this then installs nothing new.)
$(VENV)/.serve-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(SERVE_EXTRAS)]"
	touch $@

serve: $(VENV)/.serve-installed
	$(PY) -m server $(SERVE_ARGS)

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q

# The fast layer alone (token choice, metrics, tokenizers, attention, documents and markup, the relay): seconds.
test-fast: install
	$(PY) -m pytest -q -m unit

translate: install
	$(PY) -m models.translate "$(TEXT)"

clean:
	rm -rf $(VENV) .pytest_cache

# Regenerate the gRPC code from protos/ (committed; tests check it is current).
protos: install
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/nmt/v1/translator.proto
