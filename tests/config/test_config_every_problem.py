"""One validation reports every problem of a file, sorted by line, each naming its tier."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from config_fakes import EXAMPLE, write

from kvtier.cli import cli
from kvtier.config import load_config
from kvtier.config.chain_config import validate_config
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError

# found in this order (top-level keys first, a tier's own keys before its backend's
# options), reported in the order of the file's lines
FOUR_PROBLEMS = (
    EXAMPLE.replace("eviction: arc", "eviction: fifo")  # line 5
    .replace("capacity: 500GiB", "capacity: 5 bananas")  # line 9
    .replace("write: back", "write: around")  # line 11
    + "metric:\n  prometheus_port: 1\n"  # line 12
)


def expected(path: str) -> list[str]:
    return [
        f"{path}:5: chain[0].eviction: expected one of 'lru', 'arc', got 'fifo' (tier 'ram')",
        f"{path}:9: chain[1].capacity: expected a size such as 8GiB, 500MB or 4096 (bytes), "
        "got '5 bananas' (tier 'nvme')",
        f"{path}:11: chain[1].write: expected one of 'through', 'back', got 'around' "
        "(tier 'nvme')",
        f"{path}:12: metric: unknown key 'metric'; did you mean 'metrics'? "
        "Accepted: chain, metrics, version, load_policy, recompute, load_margin, cost_half_life, "
        "record",
    ]


def test_every_problem_sorted_by_line(tmp_path: Path, registry: BackendRegistry) -> None:
    path = write(tmp_path, FOUR_PROBLEMS)
    with pytest.raises(ConfigError) as info:
        load_config(path, registry=registry)
    err = info.value
    assert (err.where, err.key) == (f"{path}:5", "chain[0].eviction")
    assert str(err).splitlines() == expected(path)
    config, problems = validate_config(path, registry=registry)
    assert config is None
    assert [str(p) for p in problems] == expected(path)


def test_problems_beside_a_duplicate_key_and_in_two_tiers(tmp_path: Path,
                                                         registry: BackendRegistry) -> None:
    text = (EXAMPLE.replace("    capacity: 500GiB\n", "    capacity: 500GiB\n    capacity: 1\n")
            .replace("  - name: ram\n", "  - name: ram\n    workers: 0\n")
            .replace("url: file:///var/cache/kvtier", "url: s3://bucket"))
    path = write(tmp_path, text)
    _, problems = validate_config(path, registry=registry)
    assert [(p.where, p.key) for p in problems] == [
        (f"{path}:3", "chain[0].workers"),
        (f"{path}:9", "chain[1].url"),
        (f"{path}:11", "chain[1].capacity"),
    ]
    assert problems[2].reason == "duplicate key 'capacity' (first given on line 10)"


def test_a_dict_keeps_the_order_problems_were_found(registry: BackendRegistry) -> None:
    config = {"chain": [{"name": "a", "backend": "host", "capacity": "x", "codec": "lz4"},
                        {"name": "a", "backend": "nope"}]}
    with pytest.raises(ConfigError) as info:
        load_config(config, registry=registry)
    lines = str(info.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "chain[0].codec", "chain[0].capacity", "chain[1].name", "chain[1].backend"]
    assert lines[1].endswith("got 'x' (tier 'a')")
    assert "duplicate tier name 'a'" in lines[2]


def test_validate_command_prints_every_problem(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        chain:
          - name: ram
            backend: host
            capacity: 0x
          - name: disk
            backend: fs
            url: file:///tmp/kvtier-validate
            io_threads: 0
            codec: lz4
        """)
    result = CliRunner().invoke(cli, ["config", "validate", path])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}:4: chain[0].capacity: expected a size such as 8GiB, 500MB or 4096 "
        "(bytes), got '0x' (tier 'ram')",
        f"error: {path}:8: chain[1].io_threads: expected 1 or more, got 0 (tier 'disk')",
        f"error: {path}:9: chain[1].codec: expected one of 'none', 'zstd', got 'lz4' "
        "(tier 'disk')",
        f"{path}: 3 problem(s)",
    ]

