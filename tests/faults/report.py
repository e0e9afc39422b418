"""Render the fault suite's figures as the markdown table of docs/reliability.md.

    python tests/faults/report.py FAULT-REPORT.json

FAULT-REPORT.json is what the fault tests wrote (``$KVTIER_FAULT_REPORT``).
Sections missing from it are left out of the table.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

Row = tuple[str, str]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):+.1f} MiB"


def _crash(f: dict[str, Any]) -> Row:
    return (f"{f['kills']} SIGKILLs of a writer on `fs`; {f['keys_checked']} keys checked after "
            f"reopen: {f['keys_present_exact']} present and exact, {f['in_flight_absent']} "
            "in-flight puts absent",
            f"{f['wrong']} wrong, {f['corrupt']} torn")


def _bitrot(f: dict[str, Any]) -> Row:
    extra = f", {f['harmless']} changes that decode to the same bytes" if "harmless" in f else ""
    return (f"{f['flipped']} corrupted blocks{extra}",
            f"{f['detected']}/{f['flipped'] - f.get('harmless', 0)} detected, "
            f"{f['served_wrong']} served")


def _foreign(f: dict[str, Any]) -> Row:
    return (f"{f['attempts']} reads of blocks from {f['namespaces']} other namespaces",
            f"{f['returned']} returned")


def _loss(f: dict[str, Any]) -> Row:
    if "ops_during_outage" in f:
        what = (f"{f['ops_during_outage']} chain calls while SeaweedFS was dead "
                f"(tier faults counted: {f['errors_counted']})")
    else:
        what = (f"{f['in_flight_keys']} keys in flight when the peer was killed, "
                f"{f['in_flight_served']} of them served")
    return (what, f"{f['raised']} raised; recovered by itself after a restart "
                  f"(in {f['recovery_s']} s)" if f["recovered"] else "not recovered")


def _diskfull(f: dict[str, Any]) -> Row:
    return (f"{f['attempted']} stores against the limit, {f['failed']} failed",
            f"{f['counted']} counted, {f['partial_files']} partial files, "
            f"{f['existing_reads_exact']}/6 existing blocks readable from the backend "
            f"({f['chain_reads_right_after']}/6 through the chain during the back-off)")


def _soak(f: dict[str, Any]) -> Row:
    return (f"{f['threads']} threads for {f['seconds']} s on host -> fs -> fs: {f['ops']} ops, "
            f"{f['hits_checked']} hits checked byte for byte, {f['final_keys_checked']} "
            f"keys checked at the end",
            f"{f['lost']} lost, {f['wrong']} wrong, {f['transient_misses']} transient misses, "
            f"capacity exceeded {f['capacity_exceeded']} times (peak use: RAM "
            f"{f['peak_ram_bytes']} of {f['ram_capacity_bytes']} bytes, fs "
            f"{f['peak_disk_bytes']} of {f['disk_capacity_bytes']}), "
            f"RSS growth {_mib(f['rss_growth_bytes'])}")


def _fuzz(f: dict[str, Any]) -> Row:
    return (f"{f['examples']} examples", f"{f['untyped_errors']} untyped errors")


def _scan(f: dict[str, Any]) -> Row:
    return (f"{f['files']} package modules scanned", f"{f['findings']} findings")


FORMATS: list[tuple[str, str, Callable[[dict[str, Any]], Row]]] = [
    ("crash_", "Crash safety", _crash),
    ("bitrot_fs_none", "Bit rot: fs, uncompressed", _bitrot),
    ("bitrot_fs_zstd", "Bit rot: fs, zstd + shuffle", _bitrot),
    ("bitrot_object", "Bit rot: object on SeaweedFS", _bitrot),
    ("bitrot_chain", "Bit rot: host -> fs -> object", _bitrot),
    ("bitrot_header_exhaustive", "Bit rot: every value at every header byte", _bitrot),
    ("foreign_", "Foreign namespace", _foreign),
    ("loss_seaweedfs", "Server loss: SeaweedFS killed", _loss),
    ("loss_peer", "Server loss: peer killed mid-transfer", _loss),
    ("diskfull_", "Disk full", _diskfull),
    ("soak_", "Soak", _soak),
    ("fuzz_decoder_mutated", "Fuzz: block decoder, mutated blocks", _fuzz),
    ("fuzz_decoder_random", "Fuzz: block decoder, random bytes", _fuzz),
    ("fuzz_config", "Fuzz: YAML config loader", _fuzz),
    ("security_scan", "No pickle/eval/exec/unsafe YAML", _scan),
]


def render(data: dict[str, dict[str, Any]]) -> str:
    lines = ["| fault | run | what was done | result |", "|---|---|---|---|"]
    for prefix, title, fmt in FORMATS:
        for name in sorted(n for n in data if n.startswith(prefix)):
            figures = data[name]
            suffix = name[len(prefix):] if prefix.endswith("_") else ""
            label = f"{title} ({suffix})" if suffix not in ("", "ci", "long") else title
            done, result = fmt(figures)
            lines.append(f"| {label} | {figures['variant']} | {done} | {result} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        data = json.load(f)
    sys.stdout.write(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
