"""Tables and the chart of ``bench/serving.py`` reports (one run or several side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MiB = 1 << 20


def _tier_name(label: str) -> str:
    """vLLM's tier label ("0:primary", "1:fs", "1:KvtierTier") as a short name."""
    kind = label.split(":", 1)[-1]
    return {"primary": "CPU", "fs": "vLLM fs", "KvtierTier": "kvtier"}.get(kind, kind)


def tier_rows(result: dict[str, Any], chunk_bytes: int) -> list[tuple[str, int, float]]:
    """(tier, hits, MiB served) of one configuration: vLLM's tiers, then kvtier's.

    vLLM counts no bytes for its CPU tier (the engine copies from shared
    memory): its MiB are its chunk hits times the chunk size.  Below it,
    vLLM's ``read_bytes`` and the chain's ``bytes_out`` are what was read.
    """
    rows = []
    for label, figures in sorted(result.get("vllm_tiers", {}).items()):
        if label == "all":
            continue
        hits = int(figures.get("chunk_hits", 0))
        read = figures.get("read_bytes", 0) if label != "0:primary" else hits * chunk_bytes
        rows.append((_tier_name(label), hits, read / MiB))
    for t in result.get("kvtier_tiers", []):
        if t["name"] != "adapter":
            rows.append((f"kvtier {t['name']} ({t['backend']})", int(t["hits"] or 0),
                         (t["bytes_out"] or 0) / MiB))
    return rows


def chunk_bytes(report: dict[str, Any]) -> int:
    """Bytes of one offloaded chunk: a 32-token engine block."""
    return 32 * int(report["shape"]["kv_bytes_per_token"])


def _hits(result: dict[str, Any], chunk: int) -> str:
    return ", ".join(f"{name} {hits} ({mib:.0f} MiB)" for name, hits, mib
                     in tier_rows(result, chunk) if hits or mib) or "-"


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_table(report: dict[str, Any]) -> str:
    chunk = chunk_bytes(report)
    lines = ["| configuration | completed | req/s | output tok/s | TTFT p50 s | TTFT p99 s "
             "| step mean ms | step p99 ms | decode step ms | prompt tokens from tiers "
             "| no room to promote | CPU s (tier threads) | hits by tier (chunks, served) |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|"]
    for r in report["configs"]:
        s = r["summary"]
        if not s.get("completed"):
            lines.append(f"| {r['config']} | 0/{s['requests']} | failed: {r.get('error')} "
                         "| | | | | | | | | | |")
            continue
        share = s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0
        lines.append(
            f"| {r['config']} | {s['completed']}/{s['requests']} | {s['requests_per_s']:.3f} "
            f"| {s['output_tokens_per_s']:.1f} | {s['ttft_p50_s']:.3f} | {s['ttft_p99_s']:.3f} "
            f"| {_fmt(s['step_mean_ms'], 1)} | {_fmt(s['step_p99_ms'], 1)} "
            f"| {_fmt(s['decode_step_mean_ms'], 1)} | {share:.0%} "
            f"| {s.get('promotion_allocation_failures', 0)} "
            f"| {_fmt(s.get('cpu_s'), 1)} ({_fmt(s.get('cpu_s_tier_threads'), 1)}) "
            f"| {_hits(r, chunk)} |")
    return "\n".join(lines)


def targets(report: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """The issue's targets, kvtier's configurations against vLLM's fs tier."""
    by = {r["config"]: r["summary"] for r in report["configs"]}
    ref = by.get("vllm-fs", {})
    out: list[tuple[str, str, bool | None]] = []
    for name in ("kvtier-fs", "kvtier-fs-object"):
        s = by.get(name, {})
        if not (ref.get("completed") and s.get("completed")):
            continue
        tput = s["requests_per_s"] / ref["requests_per_s"]
        p99 = s["ttft_p99_s"] / ref["ttft_p99_s"]
        step = s["step_mean_ms"] / ref["step_mean_ms"]
        out += [(f"{name} throughput / vllm-fs >= 1.2x", f"{tput:.2f}x", tput >= 1.2),
                (f"{name} TTFT p99 / vllm-fs <= 1.0x", f"{p99:.2f}x", p99 <= 1.0),
                (f"{name} step time / vllm-fs <= 1.1x", f"{step:.2f}x", step <= 1.1)]
        if s.get("decode_step_mean_ms") and ref.get("decode_step_mean_ms"):
            # decode-only steps do the same work in every configuration
            decode = s["decode_step_mean_ms"] / ref["decode_step_mean_ms"]
            out.append((f"{name} decode-only step time / vllm-fs <= 1.1x",
                        f"{decode:.2f}x", decode <= 1.1))
    return out


def _leader(policy: dict[str, Any]) -> str:
    """Which policy ``adaptive`` followed at the end, and how often it switched."""
    if "adaptive_leader" not in policy:
        return ""
    name = ("lru", "arc", "s3fifo")[policy["adaptive_leader"]]
    return f", following {name} after {policy['adaptive_switches']} switches"


def policy_table(report: dict[str, Any]) -> str:
    """vLLM's CPU tier under each policy: its hits and throughput against vLLM's lru."""
    by = {r["config"]: r for r in report["configs"] if r["summary"].get("completed")}
    ref = by.get("vllm-cpu", {}).get("summary")
    rows = ["| CPU tier policy | CPU-tier chunk hits | prompt tokens from the tier | req/s "
            "| req/s / vllm-cpu | output tok/s | TTFT p50 s | policy's own count |",
            "|---|--:|--:|--:|--:|--:|--:|---|"]
    for name, r in by.items():
        if not name.startswith("vllm-cpu"):
            continue
        s = r["summary"]
        hits = int(r.get("vllm_tiers", {}).get("0:primary", {}).get("chunk_hits", 0))
        share = s["cached_tokens"] / s["prompt_tokens"] if s["prompt_tokens"] else 0
        ratio = f"{s['requests_per_s'] / ref['requests_per_s']:.2f}x" if ref else "-"
        own = "; ".join(
            f"{p['eviction']}: {p['hits']} hits, {p['evictions']} evictions, "
            f"{p['deferred']} put off" + _leader(p)
            for p in r.get("kvtier_policies", [])) or "vLLM's lru"
        rows.append(f"| {name} | {hits} | {share:.0%} | {s['requests_per_s']:.3f} | {ratio} "
                    f"| {s['output_tokens_per_s']:.1f} | {s['ttft_p50_s']:.3f} | {own} |")
    return "\n".join(rows) if len(rows) > 3 else ""


def markdown(reports: list[dict[str, Any]], names: list[str]) -> str:
    parts = []
    for report, name in zip(reports, names):
        m, shape = report["machine"], report["shape"]
        parts.append(
            f"{name}: started {report['started']}, load average {m['load_average']}, "
            f"{m['cpus']} CPUs, vLLM {report['vllm']}; {shape['requests']} requests, "
            f"{shape['concurrency']} in flight, KV working set "
            f"{shape['working_set_bytes'] / MiB:.0f} MiB, CPU tier "
            f"{shape['cpu_tier_bytes'] / MiB:.0f} MiB; outputs identical: "
            f"{report['outputs']['identical']}\n\n" + run_table(report) + "\n")
        policies = policy_table(report)
        if policies:
            parts.append(policies + "\n")
        rows = targets(report)
        if rows:
            parts.append("| target | measured | met |\n|---|--:|---|\n" + "\n".join(
                f"| {t} | {v} | {'yes' if ok else 'no'} |" for t, v, ok in rows) + "\n")
    if len(reports) > 1:
        parts.append(compare_table(reports, names))
    return "\n".join(parts)


def compare_table(reports: list[dict[str, Any]], names: list[str]) -> str:
    """req/s, TTFT p50/p99 and step time of each configuration, run by run."""
    header = "| configuration | figure | " + " | ".join(names) + " |"
    lines = [header, "|---|---|" + "--:|" * len(names)]
    configs = [r["config"] for r in reports[0]["configs"]]
    for config in configs:
        for key, label, digits in (("requests_per_s", "req/s", 3),
                                   ("ttft_p50_s", "TTFT p50 s", 3),
                                   ("ttft_p99_s", "TTFT p99 s", 3),
                                   ("step_mean_ms", "step mean ms", 1)):
            cells = []
            for report in reports:
                s = next((r["summary"] for r in report["configs"] if r["config"] == config), {})
                cells.append(_fmt(s.get(key), digits))
            lines.append(f"| {config} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def chart(report: dict[str, Any], path: Path) -> None:
    """Four panels: requests/s, TTFT p50 and p99, engine step time, KV served by tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in report["configs"] if r["summary"].get("completed")]
    names = [r["config"] for r in done]
    s = [r["summary"] for r in done]
    x = range(len(done))
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.2))
    axes[0].bar(x, [v["requests_per_s"] for v in s], color="tab:blue")
    axes[0].set_title("throughput (requests/s)")
    axes[1].bar([i - 0.2 for i in x], [v["ttft_p50_s"] for v in s], 0.4, label="p50")
    axes[1].bar([i + 0.2 for i in x], [v["ttft_p99_s"] for v in s], 0.4, label="p99")
    axes[1].set_title("time to first token (s)")
    axes[1].legend()
    axes[2].bar(x, [v["step_mean_ms"] for v in s], color="tab:green")
    axes[2].set_title("engine step time, mean (ms)")
    tiers: dict[str, list[float]] = {}
    for i, r in enumerate(done):
        for tier, _, mib in tier_rows(r, chunk_bytes(report)):
            if tier == "kvtier":  # the chain's own tiers below say which one served
                continue
            tiers.setdefault(tier, [0.0] * len(done))[i] += mib
    bottom = [0.0] * len(done)
    for tier, hits in tiers.items():
        axes[3].bar(x, hits, bottom=bottom, label=tier)
        bottom = [b + h for b, h in zip(bottom, hits)]
    axes[3].set_title("KV served by tier (MiB)")
    if tiers:
        axes[3].legend(fontsize=8)
    shape = report["shape"]
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(names, rotation=30, ha="right", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"vLLM {report['vllm']} on the CPU, {shape['requests']} requests, "
                 f"{shape['concurrency']} in flight, random Llama {shape['layers']}x"
                 f"{shape['hidden']} ({report['started']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
