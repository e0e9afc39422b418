"""Smoke test of `kvtier bench`: it runs, its JSON has the documented shape, data round-trips.

Benchmarks are not tests: nothing here looks at how fast anything was.
"""

from __future__ import annotations

import json
import subprocess
import sys

from kvtier.tierbench import Progress


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvtier.cli", "bench", "--quick", "--json", *args],
        capture_output=True, text=True, timeout=600, check=False)


def test_bench_quick_json_host_and_fs() -> None:
    done = _bench("--backend", "host", "--backend", "fs", "--block-size", "64KiB",
                  "--blocks", "4", "--section", "tiers", "--section", "dispatch")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["sections"] == ["tiers", "dispatch"]
    assert report["settings"]["block_size"] == 64 * 1024
    assert report["machine"]["cpus"] >= 1
    rows = report["tiers"]["results"]
    ops = {"host": ("put", "get", "put-first", "get-first"),
           "fs": ("put", "get", "get-uncached")}
    assert {(r["backend"], r["op"]) for r in rows} == {
        (b, op) for b in ("host", "fs") for op in ops[b]}
    for row in rows:
        assert row["verified"] is True, row
        assert set(row["mismatches"].values()) == {0}
        assert row["blocks_per_call"] == 4 and row["block_size"] == 64 * 1024
        kv = row["kvtier"]
        assert kv["batches"] == report["settings"]["rounds"] and kv["gbps"] > 0
        assert kv["p99_ms"] >= kv["p50_ms"] > 0
        assert row["raw"], "host and fs on a local directory have raw ceilings"
        for raw in row["raw"]:
            assert raw["name"] in ("memcpy", "file I/O", "file I/O O_DIRECT")
            assert raw["gbps"] > 0 and raw["ratio"] > 0
    dispatch = report["dispatch"]
    assert dispatch["lookup_hook_us"] > 0 and dispatch["lookup_direct_us"] > 0
    assert dispatch["overhead_per_call_us"] >= 0
    assert "/" in done.stderr  # the progress bar went to stderr, not into the JSON


def test_bench_encrypt_sets_each_encrypted_tier_beside_its_plaintext_twin() -> None:
    done = _bench("--backend", "fs", "--encrypt", "--aligned", "--block-size", "512KiB",
                  "--blocks", "4", "--section", "tiers")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["settings"]["encrypt"] is True and report["settings"]["aligned"] is True
    rows = {(r["tier"], r["op"]): r for r in report["tiers"]["results"]}
    for op in ("put", "get", "get-uncached"):
        row = rows[("fs-encrypted", op)]
        assert row["verified"] is True and set(row["mismatches"].values()) == {0}, row
        twin = [raw for raw in row["raw"] if raw["name"] == "kvtier plaintext"]
        assert len(twin) == 1 and twin[0]["gbps"] > 0 and twin[0]["ratio_p50"] > 0
        assert twin[0]["cost_paired_pct"] > -100  # a cost in percent: time is never negative
        assert row["mismatches"]["kvtier plaintext"] == 0  # its reads were compared too
        # the plaintext tiers have no twin
        assert all(raw["name"] != "kvtier plaintext" for raw in rows[("fs", op)]["raw"])


def test_bench_lookup_and_codec_sections() -> None:
    done = _bench("--backend", "host", "--block-size", "64KiB", "--section", "lookup",
                  "--section", "codec")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "tiers" not in report
    assert [r["keys"] for r in report["lookup"]] == [1000, 8000]
    codecs = report["codec"]
    assert {r["shuffle"] for r in codecs} == {0, 2}
    assert all(r["raw_bytes"] == 64 * 1024 and r["ratio"] > 0 for r in codecs)


def test_bench_table_output() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kvtier.cli", "bench", "--quick", "--backend", "host",
         "--block-size", "16KiB", "--blocks", "2", "--section", "tiers"],
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr
    assert "memcpy" in done.stdout and "kvtier/raw" in done.stdout


def test_progress_bar_counts_steps() -> None:
    import io

    stream = io.StringIO()
    progress = Progress(0, stream=stream, width=10)
    progress.add(4)
    progress.step("a")
    progress.step("b", 3)
    progress.close()
    assert "[##########] 4/4" in stream.getvalue()
