"""Fuzzing the block decoder and the YAML config loader.

Whatever the input, only the typed errors come out (CorruptBlockError from
the decoder, ConfigError from the loader), and decoding allocates a bounded
amount of memory, measured with tracemalloc.
"""

from __future__ import annotations

import contextlib
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import msgpack
import pytest
import yaml
from faultkit import Report
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvtier
from kvtier.block import framing
from kvtier.config import load_config
from kvtier.spec import ConfigError, CorruptBlockError

NS = kvtier.Namespace("fuzz-model", dtype="bfloat16").fingerprint
KEY = b"fuzz-key"
CI, LONG = 400, 5000
#: What decoding one block may allocate beyond its output: header objects and zstd state.
DECODE_BOUND = 4 << 20
LOAD_BOUND = 64 << 20
counts: dict[str, int] = {}

runs = pytest.mark.parametrize("examples", [pytest.param(CI, id="ci"),
                                            pytest.param(LONG, id="long",
                                                         marks=pytest.mark.slow)])


def fuzz_settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])


weird = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1),
                  st.floats(), st.binary(max_size=40), st.text(max_size=20),
                  st.lists(st.integers(0, 3), max_size=4))


@st.composite
def mutated_blocks(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid block broken one way; answers the block and its true raw size."""
    size = draw(st.integers(0, 5000))
    payload = draw(st.binary(min_size=min(size, 64), max_size=64)) * (size // 64 + 1)
    payload = payload[:size]
    codec = draw(st.sampled_from([framing.Codec("none"), framing.Codec("zstd", 1, 0),
                                  framing.Codec("zstd", 3, 2)]))
    blob = bytearray(framing.encode(NS, KEY, payload, codec))
    how = draw(st.sampled_from(["flip", "truncate", "extend", "field", "hlen", "splice"]))
    head = 6 + struct.unpack_from("<H", blob, 4)[0]
    if how == "flip":
        for _ in range(draw(st.integers(1, 4))):
            blob[draw(st.integers(0, len(blob) - 1))] ^= draw(st.integers(1, 255))
    elif how == "truncate":
        del blob[draw(st.integers(0, len(blob) - 1)):]
    elif how == "extend":
        blob += draw(st.binary(min_size=1, max_size=100))
    elif how == "field":
        fields = msgpack.unpackb(bytes(blob[6:head]), raw=True)
        fields[draw(st.integers(0, len(fields) - 1))] = draw(weird)
        body = msgpack.packb(fields, use_bin_type=True)
        blob = bytearray(struct.pack("<4sH", b"KVTB", len(body)) + body + blob[head:])
    elif how == "hlen":
        struct.pack_into("<H", blob, 4, draw(st.integers(0, 65535)))
    else:
        blob[6:head] = draw(st.binary(max_size=600))
    return bytes(blob), size


def decode_all_ways(blob: bytes, size: int) -> None:
    """Every entry point of the decoder; only CorruptBlockError may escape."""
    for call in (
        lambda: framing.decode_into(blob, NS, KEY, memoryview(bytearray(size))),
        lambda: framing.parse_header(blob, NS, KEY),
        lambda: framing.decode(blob, NS, KEY),
        lambda: framing.recode(blob, NS, KEY, framing.Codec("zstd", 1, 4), verify=True),
        lambda: framing.recode(blob, NS, KEY, framing.Codec("none"), verify=False),
    ):
        with contextlib.suppress(CorruptBlockError):
            call()


def bounded(fn: Any, bound: int) -> None:
    tracemalloc.start()
    try:
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < bound, f"peak {peak} bytes"


@runs
def test_decoder_on_mutated_blocks(examples: int, fault_report: Report) -> None:
    counts["decoder_mutated"] = 0

    @fuzz_settings(examples)
    @given(mutated_blocks())
    def run(case: tuple[bytes, int]) -> None:
        counts["decoder_mutated"] += 1
        blob, size = case
        bounded(lambda: decode_all_ways(blob, size), DECODE_BOUND + 4 * size)

    run()
    fault_report.record(f"fuzz_decoder_mutated_{examples}", "long" if examples == LONG else "ci",
                        examples=counts["decoder_mutated"], untyped_errors=0)


@runs
def test_decoder_on_random_bytes(examples: int, fault_report: Report) -> None:
    counts["decoder_random"] = 0

    @fuzz_settings(examples)
    @given(st.one_of(st.binary(max_size=700),
                     st.binary(max_size=600).map(lambda b: b"KVTB" + struct.pack("<H", len(b))
                                                  + b)),
           st.integers(0, 1 << 16))
    def run(blob: bytes, size: int) -> None:
        counts["decoder_random"] += 1
        bounded(lambda: decode_all_ways(blob, size), DECODE_BOUND + 4 * size)

    run()
    fault_report.record(f"fuzz_decoder_random_{examples}", "long" if examples == LONG else "ci",
                        examples=counts["decoder_random"], untyped_errors=0)


VALID = """\
version: 1
metrics: {log_interval: 10s}
chain:
  - name: ram
    backend: host
    capacity: 64MiB
    eviction: arc
  - name: disk
    backend: fs
    url: memory://fuzz
    codec: zstd
    write: back
    storage_options: {a: [1, 2]}
"""

yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=20)
tier_keys = st.sampled_from(["name", "backend", "capacity", "eviction", "url", "codec", "write",
                             "workers", "shuffle", "verify", "promote", "codec_level",
                             "storage_options", "fsync", "bogus"])


@st.composite
def yaml_texts(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["mutated", "structured", "text"]))
    if kind == "text":
        return draw(st.text(max_size=300))
    if kind == "structured":
        tiers = draw(st.lists(st.dictionaries(tier_keys, yaml_values, max_size=6), max_size=3))
        doc: Any = {"chain": tiers, **draw(st.dictionaries(
            st.sampled_from(["version", "metrics", "extra"]), yaml_values, max_size=2))}
        return yaml.safe_dump(doc)
    text = list(VALID)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()) and at < len(text):
            del text[at:at + draw(st.integers(1, 8))]
        else:
            text[at:at] = draw(st.sampled_from(["[", "]", "{", "&a ", "*a", "!!python/object ",
                                                "- ", ":", "\n  ", "${X}", "'", "\t", "0x_",
                                                "9" * 5000, "<<: *a\n", "!!binary "]))
    return "".join(text)


@runs
def test_config_loader_on_fuzzed_yaml(examples: int, tmp_path: Path,
                                      fault_report: Report) -> None:
    counts["config"] = 0
    path = tmp_path / "tiers.yaml"

    @fuzz_settings(examples)
    @given(yaml_texts())
    def run(text: str) -> None:
        counts["config"] += 1
        path.write_text(text, encoding="utf-8", errors="surrogatepass")

        def load() -> None:
            with contextlib.suppress(ConfigError):
                load_config(path)

        bounded(load, LOAD_BOUND)

    run()
    fault_report.record(f"fuzz_config_{examples}", "long" if examples == LONG else "ci",
                        examples=counts["config"], untyped_errors=0)


@pytest.mark.parametrize("text", ["chain: " + "[" * 5000 + "]" * 5000,
                                  "chain:\n" + "".join(" " * i + "-\n" for i in range(1, 400)),
                                  "version: " + "9" * 5000, "version: 0x_"])
def test_config_loader_regressions(text: str, tmp_path: Path) -> None:
    """Inputs that once escaped as RecursionError or ValueError."""
    path = tmp_path / "tiers.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_flipped_shuffle_width_is_caught(dtype: str) -> None:
    """Regression: the shuffle field is outside the payload but must not escape the checksum."""
    payload = bytes(range(256)) * 64
    width = 2 if dtype == "bfloat16" else 4
    blob = framing.encode(NS, KEY, payload, framing.Codec("zstd", 1, width))
    head = 6 + struct.unpack_from("<H", blob, 4)[0]
    fields = msgpack.unpackb(blob[6:head], raw=True)
    for other in {0, 2, 4, 8} - {width}:
        fields[7] = other
        body = msgpack.packb(fields, use_bin_type=True)
        forged = struct.pack("<4sH", b"KVTB", len(body)) + body + blob[head:]
        with pytest.raises(CorruptBlockError):
            framing.decode_into(forged, NS, KEY, memoryview(bytearray(len(payload))))
