"""What ``kvtier config validate`` knows of an fs tier without opening it, with the real
fs backend: what ``open_chain`` would refuse, and a capacity that would refuse every put."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner
from config_fakes import write

import kvtier
from kvtier.cli import cli
from kvtier.config import load_config
from kvtier.spec import ConfigError


def fs_tier(name: str, line: str) -> str:
    return f"  - name: {name}\n    backend: fs\n    {line}\n"


def test_validate_reports_what_open_would_refuse(tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-directory"
    a_file.write_bytes(b"x")
    text = ("chain:\n" + fs_tier("proto", "url: nosuchproto://bucket/kv")  # url: line 4
            + fs_tier("home", "url: ~/kv")  # line 7
            + fs_tier("file", f"url: file://{a_file}")  # line 10
            + fs_tier("zero", "url: memory://kv\n    capacity: 0")  # capacity: line 14
            + fs_tier("relative", "url: kv/cache"))  # line 17
    path = write(tmp_path, text)
    result = CliRunner().invoke(cli, ["config", "validate", path])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {path}:4: chain[0].url: nosuchproto://bucket/kv: unknown protocol "
        "'nosuchproto' (fsspec knows none by that name) (tier 'proto')",
        f"error: {path}:7: chain[1].url: '~' is not expanded: give an absolute path, or "
        "${HOME}/... (tier 'home')",
        f"error: {path}:10: chain[2].url: {a_file} is a file, not a directory (tier 'file')",
        f"error: {path}:14: chain[3].capacity: expected at least 1 byte, got 0; leave it "
        "unset for no bound (tier 'zero')",
        f"error: {path}:17: chain[4].url: a local path must be absolute, got 'kv/cache' "
        "(tier 'relative')",
        f"{path}: 5 problem(s)",
    ]


@pytest.mark.parametrize("url", ["s3fs-is-not://b/k", "~root/kv"])
def test_open_chain_refuses_them_before_opening(tmp_path: Path, url: str) -> None:
    config = {"chain": [{"name": "disk", "backend": "fs", "url": url}]}
    with pytest.raises(ConfigError) as info:
        kvtier.open_chain(config, namespace="m")
    assert info.value.key == "chain[0].url"


def test_a_known_protocol_whose_package_is_missing_says_what_to_install(tmp_path: Path) -> None:
    if importlib.util.find_spec("gcsfs") is not None:
        pytest.skip("gcsfs is installed here")
    path = write(tmp_path, "chain:\n" + fs_tier("gcs", "url: gs://bucket/kv"))
    with pytest.raises(ConfigError, match="Please install gcsfs"):
        load_config(path)


def test_what_open_takes_still_validates(tmp_path: Path) -> None:
    urls = [f"file://{tmp_path}/kv", f"{tmp_path}/new/kv", "memory://x"]
    if importlib.util.find_spec("s3fs") is not None:
        urls.append("s3://bucket/p")
    for url in urls:
        config = load_config({"chain": [{"name": "d", "backend": "fs", "url": url,
                                         "capacity": "1MiB"}]})
        assert config.tiers[0].options["url"] == url
