"""Fixtures shared by the contrib test modules.

The LMCache fixtures import :mod:`lmcache_driver` (and so lmcache) when a test
asks for them: only ``test_lmcache_*.py`` do, after skipping without lmcache.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
from redis_server import RedisServer


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the module's own (a module picks its databases)."""
    with RedisServer(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The vLLM tests' tiny random Llama, built once per module; skips without vLLM."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    from shared_pool import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "tiny-llama")


@pytest.fixture
def l1() -> Iterator[Any]:
    """LMCache's L1 memory manager on the CPU; what the test allocated is freed after."""
    from lmcache_driver import l1_manager

    yield from l1_manager()


@pytest.fixture
def adapter_of() -> Iterator[Any]:
    """Builds adapters from a chain YAML as LMCache's server does; closes them after."""
    from lmcache_driver import adapter_factory

    yield from adapter_factory()
