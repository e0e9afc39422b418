"""The plaintext twin ``kvtier bench`` sets beside an encrypted tier."""

from __future__ import annotations

import secrets
import warnings
from pathlib import Path

import numpy as np

from kvtier.block.namespace import Namespace
from kvtier.config.chain_config import load_config
from kvtier.plugins.options import DeprecatedKey
from kvtier.tierbench.twin import PlaintextTwin


def test_twin_of_an_encrypted_fs_tier_opens_without_a_deprecated_key(tmp_path: Path) -> None:
    # the file writes no old key: the twin, made from the tier's checked options,
    # must not warn of one (it did: its options went back through the file's keys)
    key = tmp_path / "master.key"
    key.write_text(secrets.token_hex(32))
    store = tmp_path / "store"
    config = load_config({"chain": [{"name": "nvme", "backend": "fs", "url": str(store),
                                     "fsync": False, "encrypt": f"file:{key}"}]})
    tier = config.tiers[0]
    namespace = Namespace("twin-test", dtype="bfloat16", tokens_per_block=16)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecatedKey)
        twin = PlaintextTwin(tier, namespace, store)
    try:
        assert twin.files == tmp_path / "store-bench-plaintext"
        block = np.random.default_rng(7).integers(0, 256, 300 << 10, dtype=np.uint8)
        name = secrets.token_hex(16)
        twin.put([name], [block.data])
        out = bytearray(block.nbytes)
        twin.get([name], [memoryview(out)])
        assert out == block.tobytes()
        # the twin is the same tier without encryption: its file holds the payload as it is
        payload = block.tobytes()
        assert any(payload in path.read_bytes() for path in twin.files.rglob("*.kvb"))
        assert not store.exists() or not any(store.rglob("*.kvb"))
    finally:
        twin.close()
