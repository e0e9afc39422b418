"""The recompute model learned from an engine's timings (kvtier.chain.learned_cost).

The learner is fed recorded timings: the per-token rates of one engine's
recomputes with the noise a shared machine adds, some taken while other
requests queued.  The record is written to and read from real tiers: an fs
root, and a bucket of a real SeaweedFS.
"""

from __future__ import annotations

import json
import random
import socket
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sample_plugin import sample_plugin

import kvtier
from kvtier.chain import catalog, learned_cost
from kvtier.chain.learned_cost import RecomputeLearner, machine_key
from kvtier.config.chain_config import load_config
from kvtier.plugins.registry import BackendRegistry, default_registry

__all__ = ["sample_plugin"]

NS = kvtier.Namespace("learned-model", dtype="bfloat16", tokens_per_block=16)
RATE = 0.9e-3  # the engine's own recompute time a token, in these recordings


def recorded(n: int, seed: int = 1, rate: float = RATE) -> list[tuple[int, float]]:
    """``(tokens, seconds)`` of ``n`` recomputes alone: the rate, and up to 40% more
    (the engine's own threads, a busy neighbour), never less than 0.95 of it."""
    rng = random.Random(seed)
    return [(tokens, tokens * rate * rng.uniform(0.95, 1.4))
            for tokens in (rng.choice((512, 1024, 2048)) for _ in range(n))]


def test_the_learner_converges_to_the_engines_own_rate() -> None:
    learner = RecomputeLearner()
    assert learner.rate is None
    for tokens, seconds in recorded(40):
        assert learner.observe(tokens, seconds)
    assert learner.samples == 40 and len(learner.rates) == learned_cost.WINDOW
    assert learner.rate is not None and RATE * 0.95 <= learner.rate <= RATE * 1.15


def test_queueing_moves_the_estimate_little() -> None:
    learner = RecomputeLearner()
    for tokens, seconds in recorded(10):
        learner.observe(tokens, seconds)
    settled = learner.rate
    assert settled is not None
    # recomputes that overlapped another timed one (batched) are not counted ...
    assert not learner.observe(2048, 2048 * RATE * 2.5, overlapped=True)
    # ... and one that waited behind other requests (5x) is dropped
    assert not learner.observe(2048, 2048 * RATE * 5)
    # a quarter of the samples inflated by 2-2.9x (queued, not caught): the low
    # quantile stays within 15% of the engine's own rate
    rng = random.Random(7)
    for i, (tokens, seconds) in enumerate(recorded(40, seed=3)):
        learner.observe(tokens, seconds * (rng.uniform(2.0, 2.9) if i % 4 == 0 else 1.0))
    assert learner.rate is not None and learner.rate <= RATE * 1.15
    assert learner.dropped >= 2


def test_a_machine_that_turns_slower_for_good_is_relearned() -> None:
    learner = RecomputeLearner()
    for tokens, seconds in recorded(20):
        learner.observe(tokens, seconds)
    slower = recorded(learned_cost.CHANGED + 10, seed=5, rate=RATE * 6)
    for tokens, seconds in slower[: learned_cost.CHANGED - 1]:
        assert not learner.observe(tokens, seconds)  # outliers, for now
    for tokens, seconds in slower[learned_cost.CHANGED - 1:]:
        assert learner.observe(tokens, seconds)
    assert learner.rate is not None and RATE * 6 * 0.95 <= learner.rate <= RATE * 6 * 1.2


def test_the_record_is_per_namespace_and_machine_on_a_real_fs_tier(tmp_path: Path) -> None:
    config = {"chain": [{"name": "disk", "backend": "fs", "url": str(tmp_path / "kv")}]}
    with kvtier.open_chain(config, NS) as chain:
        assert chain.stats()["recompute"]["source"] == "none"
        assert chain.stats()["load_policy"] == "always (no recompute model configured)"
        chain.recompute.identify({"device": "cpu", "threads": 2})
        for tokens, seconds in recorded(5):
            chain.recompute.observe(tokens, seconds)
        learned = chain.stats()["recompute"]
        assert (learned["source"], learned["samples"], learned["kept_in"]) == ("learned", 5, "disk")
        rate = learned["per_token_s"]
        assert chain.stats()["load_policy"].startswith("cost (recompute ")
        assert "learned from 5 samples" in chain.stats()["load_policy"]
        tier_config = chain.tiers[0].config
    # a fresh process on the same machine starts informed
    with kvtier.open_chain(config, NS) as chain:
        chain.recompute.identify({"device": "cpu", "threads": 2})
        again = chain.stats()["recompute"]
        assert (again["source"], again["samples"], again["per_token_s"]) == ("learned", 5, rate)
        assert chain._load.weighs
        # another thread count is another machine: nothing learned there yet
        chain.recompute.identify({"device": "cpu", "threads": 8})
        assert chain.stats()["recompute"]["source"] == "none" and not chain._load.weighs
    # another model (namespace) starts fresh on the same root
    other = kvtier.Namespace("another-model", dtype="bfloat16", tokens_per_block=16)
    with kvtier.open_chain(config, other) as chain:
        chain.recompute.identify({"device": "cpu", "threads": 2})
        assert chain.stats()["recompute"]["source"] == "none"
    # the descriptor's readers still read it: the learned section rides along
    tier = catalog.open_catalog(tier_config, default_registry())
    try:
        assert catalog.read_descriptors(tier, [NS.hex])[NS.hex]["model"] == "learned-model"
    finally:
        tier.close()


def test_a_configured_recompute_wins_over_a_learned_one(tmp_path: Path) -> None:
    config: dict[str, Any] = {"chain": [{"name": "disk", "backend": "fs",
                                         "url": str(tmp_path / "kv")}]}
    with kvtier.open_chain(config, NS) as chain:
        for tokens, seconds in recorded(3):
            chain.recompute.observe(tokens, seconds)
    with kvtier.open_chain({**config, "recompute": "2ms/token"}, NS) as chain:
        stats = chain.stats()["recompute"]
        assert (stats["source"], stats["model"], stats["per_token_s"]) == (
            "configured", "2ms/token", pytest.approx(0.002))
        assert stats["samples"] == 0  # the stored record is not even read


def _stored_document(chain: kvtier.Chain) -> tuple[Any, Any]:
    """The catalog tier of the chain's first tier, and the namespace's stored document."""
    tier = catalog.open_catalog(chain.tiers[0].config, default_registry())
    return tier, tier.get_payloads([NS.fingerprint])[0]


def _replace_document(tier: Any, document: bytes) -> None:
    tier.evict([NS.fingerprint])
    tier.put_payloads([NS.fingerprint], [document])


@pytest.mark.parametrize("damage", ["checksum", "schema", "foreign", "not json", "bad rates"])
def test_a_damaged_or_foreign_record_is_ignored_and_rewritten(
    tmp_path: Path, damage: str
) -> None:
    config = {"chain": [{"name": "disk", "backend": "fs", "url": str(tmp_path / "kv")}]}
    with kvtier.open_chain(config, NS) as chain:
        for tokens, seconds in recorded(4):
            chain.recompute.observe(tokens, seconds)
        machine = machine_key(learned_cost.default_machine())
    with kvtier.open_chain(config, NS) as chain:
        tier, payload = _stored_document(chain)
        try:
            doc = json.loads(payload)
            assert doc["learned"]["machines"][machine]["samples"] == 4
            entry = doc["learned"]["machines"][machine]
            if damage == "checksum":  # a rate changed, the checksum not
                entry["rates"][0] = 1e-9
            elif damage == "schema":
                doc["learned"]["schema"] = 99
            elif damage == "foreign":  # another namespace's descriptor under this key
                doc["model"] = "someone-else"
            elif damage == "bad rates":  # checks out, but is not a model
                entry["rates"] = ["0.001", -1.0]
                doc["learned"]["xxh3"] = learned_cost._digest(doc["learned"]["machines"])
            document = b"{not json" if damage == "not json" else json.dumps(doc).encode()
            _replace_document(tier, document)
        finally:
            tier.close()
    with kvtier.open_chain(config, NS) as chain:
        assert chain.stats()["recompute"]["source"] == "none"  # ignored
        chain.recompute.observe(1024, 1024 * RATE)
    with kvtier.open_chain(config, NS) as chain:
        stats = chain.stats()["recompute"]
        assert (stats["source"], stats["samples"]) == ("learned", 1)  # rewritten
        assert stats["per_token_s"] == pytest.approx(RATE)
        tier, payload = _stored_document(chain)
        tier.close()
        assert json.loads(payload)["model"] == NS.model


def test_a_chain_without_a_persistent_tier_learns_in_its_process() -> None:
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}
    with kvtier.open_chain(config, NS) as chain:
        chain.recompute.observe(1024, 1024 * RATE)
        stats = chain.stats()["recompute"]
        assert (stats["source"], stats["samples"], stats["kept_in"]) == ("learned", 1, None)
    with kvtier.open_chain(config, NS) as chain:
        assert chain.stats()["recompute"]["source"] == "none"


def test_the_record_round_trips_through_a_real_seaweedfs_bucket(
    s3_server: Any, bucket: str
) -> None:
    tier = {"name": "s3", "backend": "object", "bucket": bucket, "endpoint": s3_server.endpoint,
            "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key,
            "region": s3_server.region}
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}, tier]}
    with kvtier.open_chain(config, NS) as chain:
        for tokens, seconds in recorded(6):
            chain.recompute.observe(tokens, seconds)
        rate = chain.stats()["recompute"]["per_token_s"]
    with kvtier.open_chain(config, NS) as chain:
        stats = chain.stats()["recompute"]
        assert (stats["source"], stats["samples"], stats["kept_in"]) == ("learned", 6, "s3")
        assert stats["per_token_s"] == rate


def test_a_learned_model_declines_a_slow_tier_and_shows_where_it_came_from(
    sample_plugin: str
) -> None:
    """No ``recompute`` in the YAML: the chain loads blindly until the engine's timings
    teach it one (1 ms a token); then the slow tier (62.5 ms a 64 KiB block, 16 ms to
    recompute its 16 tokens) is declined, and stats, events and Prometheus say why."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = {"chain": [{"name": "ram", "backend": "host", "capacity": "64MiB",
                         "promote": False},
                        {"name": "slow", "backend": "sample-slow", "delay_per_mib": 1.0}],
              "metrics": {"prometheus_port": port}}
    ns = kvtier.Namespace("learned-slow", dtype="bfloat16", tokens_per_block=16)
    block = 64 * 1024
    keys = [b"key-%d" % i for i in range(8)]
    with kvtier.open_chain(config, ns, registry=BackendRegistry()) as chain:
        events: list[Any] = []
        chain.add_listener(events.append)
        assert chain.put(keys, [bytes([i]) * block for i in range(8)]) == [True] * 8
        assert chain.flush(30)
        assert events and {(e.recompute_s, e.recompute_source, e.recompute_samples)
                           for e in events} == {(0.0, "none", 0)}  # no model yet
        chain.tiers[0].evict(keys)
        assert chain.prefix_hits(keys) == 8  # nothing to weigh a load against: loaded
        assert chain.stats()["tiers"][1]["probes"] == 0
        for tokens in (512, 1024, 2048):  # what the integration times
            assert chain.recompute.observe(tokens, tokens * 1e-3)
        assert chain.prefix_hits(keys) == 0  # probed, found slow, declined
        stats = chain.stats()
        assert stats["load_policy"] == "cost (recompute 1ms/token learned from 3 samples, " \
                                       "margin 0.8)"
        assert {k: stats["recompute"][k] for k in ("source", "model", "samples")} == {
            "source": "learned", "model": "1ms/token", "samples": 3}
        slow = stats["tiers"][1]
        assert (slow["probes"], slow["declined"], slow["declined_tokens"]) == (2, 8, 128)
        events.clear()
        assert chain.evict(keys[:1]) == 1
        assert [(e.tier, e.recompute_s, e.recompute_source, e.recompute_samples)
                for e in events] == [("slow", pytest.approx(0.016), "learned", 3)]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
        labels = f'namespace="{ns.hex}",source="learned"'
        assert f"kvtier_recompute_seconds_per_token{{{labels}}} 0.001" in text
        assert f"kvtier_recompute_samples{{{labels}}} 3.0" in text


def _slow_chain(root: Path, delay: float) -> dict[str, Any]:
    """A chain of one persistent ``sample-slow`` tier in ``root`` (gets held ``delay`` s a MiB)."""
    return {"chain": [{"name": "slow", "backend": "sample-slow", "root": str(root),
                       "delay_per_mib": delay, "persistent": True}]}


SLOW_NS = kvtier.Namespace("kept-load-cost", dtype="bfloat16", tokens_per_block=16)
BLOCKS = [bytes([i]) * (64 * 1024) for i in range(8)]
KEYS = [b"kept-%d" % i for i in range(8)]


def _first_process(config: dict[str, Any]) -> dict[str, Any]:
    """A chain that learns 1 ms a token, stores the blocks and weighs a hit of them (a
    probe measures the tier); its tier's stats.  It keeps both at close."""
    with kvtier.open_chain(config, SLOW_NS, registry=BackendRegistry()) as chain:
        for tokens in (512, 1024, 2048):
            chain.recompute.observe(tokens, tokens * 1e-3)
        assert chain.put(KEYS, BLOCKS) == [True] * 8
        chain.prefix_hits(KEYS)
        return dict(chain.stats()["tiers"][0])


def test_a_fresh_process_declines_a_tier_known_slow_without_reading_it(
    tmp_path: Path, sample_plugin: str
) -> None:
    """62.5 ms to read a 64 KiB block against 16 ms to recompute its 16 tokens: the first
    process probes the tier (two reads) and declines it; the next one declines it by
    what the first kept, reading nothing."""
    config = _slow_chain(tmp_path / "slow", 1.0)
    first = _first_process(config)
    assert (first["probes"], first["hits"], first["declined"]) == (2, 2, 8)
    with kvtier.open_chain(config, SLOW_NS, registry=BackendRegistry()) as chain:
        assert chain.prefix_hits(KEYS) == 0
        slow = chain.stats()["tiers"][0]
        assert (slow["probes"], slow["hits"], slow["kept_costs"], slow["declined"]) == (
            0, 0, 1, 8)
        assert slow["load_cost"]["block_s"] > 0.016 * 0.8  # slower than recomputing
        tier = catalog.open_catalog(chain.tiers[0].config, BackendRegistry())
        try:
            doc = json.loads(tier.get_payloads([SLOW_NS.fingerprint])[0])
        finally:
            tier.close()
    (key,) = doc["learned"]["loads"]["tiers"]
    assert key == learned_cost.tier_key(chain.tiers[0].config) and key.startswith("slow ")
    # a process that read nothing leaves the kept fit as it was: the next one takes it
    # too, once (when it is old in its turn, the tier is probed again)
    with kvtier.open_chain(config, SLOW_NS, registry=BackendRegistry()) as chain:
        assert chain.prefix_hits(KEYS) == 0
        assert chain.stats()["tiers"][0]["kept_costs"] == 1
        assert chain._load._take_kept(0) is False


@pytest.mark.parametrize("change", ["fast tier", "another root", "damaged", "bad values"])
def test_a_kept_load_cost_is_not_taken_where_it_may_mislead(
    tmp_path: Path, sample_plugin: str, change: str
) -> None:
    """A kept fit that says the tier is fast is not trusted (the tier may have turned
    slow: it is probed); another tier's fit (another root) is not this one's; a damaged
    section, or one that checks out but holds no fit, is ignored, and the next close
    writes it again."""
    root = tmp_path / "slow"
    config = _slow_chain(root, 0.0 if change == "fast tier" else 1.0)
    _first_process(config)
    if change == "another root":
        # the same folder's store, named by another path: another tier as configured
        (tmp_path / "link").symlink_to(root)
        config = _slow_chain(tmp_path / "link", 1.0)
    if change in ("damaged", "bad values"):
        tier = catalog.open_catalog(load_config(config, registry=BackendRegistry()).tiers[0],
                                    BackendRegistry())
        try:
            doc = json.loads(tier.get_payloads([SLOW_NS.fingerprint])[0])
            (entry,) = doc["learned"]["loads"]["tiers"].values()
            entry["y"] = 1e-9 if change == "damaged" else "0.1"  # the checksum unchanged ...
            if change == "bad values":  # ... or made again: it checks out, but is no fit
                loads = doc["learned"]["loads"]
                loads["xxh3"] = learned_cost._digest(loads["tiers"])
            _replace_document_of(tier, SLOW_NS, json.dumps(doc).encode())
        finally:
            tier.close()
    with kvtier.open_chain(config, SLOW_NS, registry=BackendRegistry()) as chain:
        weighed = chain.prefix_hits(KEYS)
        slow = chain.stats()["tiers"][0]
        assert slow["kept_costs"] == 0 and slow["probes"] >= 1
        assert weighed == (8 if change == "fast tier" else 0)
    if change in ("damaged", "bad values"):  # rewritten at that close: the next process takes it
        with kvtier.open_chain(config, SLOW_NS, registry=BackendRegistry()) as chain:
            assert chain.prefix_hits(KEYS) == 0
            assert chain.stats()["tiers"][0]["kept_costs"] == 1


def _replace_document_of(tier: Any, ns: kvtier.Namespace, document: bytes) -> None:
    tier.evict([ns.fingerprint])
    tier.put_payloads([ns.fingerprint], [document])
