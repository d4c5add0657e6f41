# Everything a fresh machine needs, in two commands:
#   make serve                     # install into .venv, serve the shipped model (gRPC :50051, metrics :9090)
#   make test                      # install into .venv, run the test suite
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= train,export,serve,dev,bench
TEXT   ?= A man is riding a bike.

.PHONY: install serve test translate clean protos

install: $(VENV)/.installed

# torch is installed first and pinned exactly, so pip takes the local CPU wheel
# instead of resolving a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

serve: install
	$(PY) -m server

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest -q

translate: install
	$(PY) -m models.translate "$(TEXT)"

clean:
	rm -rf $(VENV) .pytest_cache

# Regenerate the gRPC code from protos/ (committed; tests check it is current).
protos: install
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. protos/nmt/v1/translator.proto
