"""The chain's load policy keys: load_policy, recompute, load_margin, cost_half_life."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.config.chain_config import load_config, validate_config
from kvtier.config.load_policy import LoadConfig

CHAIN = {"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]}


def test_by_default_costs_are_weighed_but_nothing_to_weigh_them_against() -> None:
    load = load_config(CHAIN).load
    assert load == LoadConfig(policy="cost", recompute=None, margin=0.8, half_life=2.0)
    assert not load.weighs
    assert load.describe() == "always (no recompute model configured)"


def test_a_rate_per_token(tmp_path: Path) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text(
        "chain:\n  - name: ram\n    backend: host\n    capacity: 1MiB\n"
        "load_policy: cost\nrecompute: 0.5ms/token\nload_margin: 0.7\ncost_half_life: 500ms\n"
    )
    load = load_config(path).load
    assert load.weighs and (load.margin, load.half_life) == (0.7, 0.5)
    assert load.recompute is not None
    assert load.recompute.seconds(2048) == pytest.approx(1.024)
    assert load.describe() == "cost (recompute 0.5ms/token, margin 0.7)"


def test_a_table_by_prompt_length_is_interpolated(tmp_path: Path) -> None:
    path = tmp_path / "chain.yaml"
    path.write_text(
        "chain:\n  - name: ram\n    backend: host\n    capacity: 1MiB\n"
        "recompute: {512 tokens: 40ms, 2048 tokens: 200ms}\n"
    )
    recompute = load_config(path).load.recompute
    assert recompute is not None
    assert recompute.seconds(256) == pytest.approx(0.020)  # from the origin to the first point
    assert recompute.seconds(1280) == pytest.approx(0.120)
    assert recompute.seconds(3584) == pytest.approx(0.360)  # the last slope goes on
    assert load_config({**CHAIN, "recompute": {512: "40ms"}}).load.recompute == recompute.__class__(
        ((512, 0.040),))


def test_always_turns_the_decision_off() -> None:
    load = load_config({**CHAIN, "load_policy": "always", "recompute": "1ms/token"}).load
    assert not load.weighs and load.describe() == "always"


@pytest.mark.parametrize(
    ("extra", "key", "reason"),
    [
        ({"load_policy": "sometimes"}, "load_policy", "expected one of 'cost', 'always'"),
        ({"recompute": "fast"}, "recompute", "expected a duration per token such as 0.5ms/token"),
        ({"recompute": "0ms/token"}, "recompute", "must be longer than 0ms/token"),
        ({"recompute": {"512": "40ms", "1024": "30ms"}}, "recompute", "must grow"),
        ({"load_margin": 0}, "load_margin", "must be above 0"),
        ({"cost_half_life": "0s"}, "cost_half_life", "must be longer than 0s"),
    ],
)
def test_mistakes_are_reported_with_their_key(extra: dict[str, object], key: str,
                                              reason: str) -> None:
    config, problems = validate_config({**CHAIN, **extra})
    assert config is None and [p.key for p in problems] == [key]
    assert reason in problems[0].reason
