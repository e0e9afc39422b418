"""The engine side of ``bench/serving.py``: one vLLM process per configuration.

:func:`engines_main` imports vLLM once, then forks one process per plan, one
after the other (importing vLLM costs 15-20 s of the 2 cores; each fork is
still a process of its own, with a fresh engine, nothing shared but the
imported modules: no thread exists yet when it forks).  In each,
:func:`child_main` starts ``LLMEngine``, runs the trace in a closed loop and
writes ``result.json`` beside its plan: per request its ids, token counts,
times and greedy output; per engine step its wall time and what vLLM
scheduled in it; vLLM's offloading counters; and, for a kvtier tier, the
chain's ``stats()``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# vLLM's tiering counters kept in the report (per tier label "0:primary", "1:fs", ...)
_TIERING = ("chunk_queries", "chunk_hits", "read_bytes", "write_bytes",
            "promotion_job_failures", "cascade_job_failures",
            "promotion_allocation_failures", "backpressure_stores_dropped")


def _step_logger(sink: list[dict[str, Any]]) -> Any:
    """A vLLM stat logger class that appends every real iteration's details to ``sink``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class IterationRecorder(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            details = getattr(scheduler_stats, "iteration_details", None)
            if details is not None and not details.is_dummy:
                sink.append({"ms": round(details.elapsed_ms, 3),
                             "ctx_tokens": details.num_ctx_tokens,
                             "gen_tokens": details.num_generation_tokens})

        def log_engine_initialized(self) -> None:
            pass

    return IterationRecorder


def offload_metrics(engine: Any) -> dict[str, float]:
    """vLLM's ``vllm:kv_offload_*`` counters, ``name{tier}`` -> cumulative value."""
    out: dict[str, float] = {}
    for metric in engine.get_metrics():
        if not metric.name.startswith("vllm:kv_offload"):
            continue
        value = getattr(metric, "value", None)
        if not isinstance(value, (int, float)):
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(metric.labels.items())
                          if k not in ("engine", "model_name"))
        name = metric.name.removeprefix("vllm:kv_offload_")
        key = f"{name}{{{labels}}}" if labels else name
        out[key] = out.get(key, 0) + value
    return out


def tiering_by_tier(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{"0:primary": {"chunk_hits": ..}, "1:fs": {..}}`` from :func:`offload_metrics`."""
    tiers: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        name, _, labels = key.partition("{")
        field = name.removeprefix("tiering_")
        if not name.startswith("tiering_") or field not in _TIERING:
            continue
        label = dict(part.split("=", 1) for part in labels.rstrip("}").split(",") if "=" in part)
        tier = next((v for k, v in label.items() if "tier" in k), "all")
        tiers.setdefault(tier, {})[field] = tiers.get(tier, {}).get(field, 0) + value
    return tiers


def chain_tiers() -> list[dict[str, Any]]:
    """Per-tier figures of the kvtier chains in this process (none without kvtier)."""
    from kvtier.contrib.vllm import live_tiers

    out = []
    for tier in live_tiers():
        for t in tier.chain_stats()["tiers"]:
            get = t.get("latency", {}).get("get", {})
            out.append({k: t.get(k) for k in ("name", "backend", "hits", "misses", "puts",
                                              "bytes_in", "bytes_out", "corrupt", "errors")}
                       | {"get_p50_ms": round(get.get("p50_s", 0) * 1000, 2),
                          "get_p99_ms": round(get.get("p99_s", 0) * 1000, 2)})
        out.append({"name": "adapter", "backend": "vllm", **tier.adapter_stats()})
    return out


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every thread of this process, by OS thread id.

    Python threads carry their name ("kvtier-fs_3" as "kvtier-fs_N"); threads
    Python did not start (torch's OpenMP workers) are "native".  Call it on
    the engine's (main) thread.
    """
    names = {t.native_id: re.sub(r"\d+", "N", t.name) for t in threading.enumerate()}
    # after a fork the main thread's recorded native_id is the parent's
    names[threading.get_native_id()] = threading.current_thread().name
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        tid = int(task)
        out[tid] = (names.get(tid, "native"), (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_thread(before: dict[int, tuple[str, float]],
                  after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each kind of thread spent between two :func:`thread_cpu` readings."""
    out: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        spent = cpu - before.get(tid, (name, 0.0))[1]
        out[name] = round(out.get(name, 0.0) + spent, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def run_trace(engine: Any, trace: dict[str, Any], concurrency: int, params: Any,
              iterations: list[dict[str, Any]]) -> dict[str, Any]:
    """The closed loop: keep ``concurrency`` requests in flight, in the trace's order.

    Every ``engine.step()`` is timed (schedule, connector, forward pass and
    output processing: vLLM's own ``iteration_details.elapsed_ms`` only
    covers the wait for a forward pass that the CPU build has already run).
    A step in which vLLM scheduled nothing (requests waiting for loads) is
    counted apart as idle.
    """
    from vllm.inputs import TokensPrompt

    systems, sessions, order = trace["systems"], trace["sessions"], trace["order"]
    history: dict[int, list[int]] = {}  # a session's prompt and answers so far
    records: dict[str, dict[str, Any]] = {}
    inflight: set[str] = set()
    finished: set[tuple[int, int]] = set()
    position = 0
    steps: list[dict[str, Any]] = []
    idle_steps, idle_s = 0, 0.0
    start = time.monotonic()
    while position < len(order) or inflight:
        while position < len(order) and len(inflight) < concurrency:
            session, turn = order[position]
            if turn and (session, turn - 1) not in finished:
                break  # the user has not read the previous answer yet
            spec = sessions[session]
            before = systems[spec["system"]] if turn == 0 else history[session]
            prompt = before + spec["users"][turn]
            rid = f"s{session}t{turn}"
            records[rid] = {"id": rid, "session": session, "turn": turn,
                            "prompt_tokens": len(prompt), "added": time.monotonic(),
                            "finished": False, "prompt": prompt}
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)
            inflight.add(rid)
            position += 1
        seen = len(iterations)
        before = time.perf_counter()
        outputs = engine.step()
        took = time.perf_counter() - before
        if len(iterations) > seen:
            steps.append(dict(iterations[-1], ms=round(took * 1000, 3),
                              vllm_ms=iterations[-1]["ms"]))
        else:
            idle_steps, idle_s = idle_steps + 1, idle_s + took
        now = time.monotonic()
        for out in outputs:
            rec = records[out.request_id]
            if "first" not in rec and out.outputs and out.outputs[0].token_ids:
                rec["first"] = now
            if out.finished:
                ids = list(out.outputs[0].token_ids)
                rec.update(finished=True, done=now, output_ids=ids,
                           cached_tokens=out.num_cached_tokens or 0)
                history[rec["session"]] = rec.pop("prompt") + ids
                finished.add((rec["session"], rec["turn"]))
                inflight.discard(out.request_id)
    makespan = time.monotonic() - start
    rows = []
    for rec in records.values():
        rec.pop("prompt", None)
        added = rec.pop("added")
        first, done = rec.pop("first", None), rec.pop("done", None)
        rec["start_s"] = round(added - start, 4)
        rec["ttft_s"] = round(first - added, 4) if first is not None else None
        rec["e2e_s"] = round(done - added, 4) if done is not None else None
        rows.append(rec)
    return {"makespan_s": makespan, "requests": rows, "steps": steps,
            "idle_steps": idle_steps, "idle_step_s": round(idle_s, 3)}


def settle(engine: Any, seconds: float) -> None:
    """Idle iterations, so finished stores are reported and counters reach the metrics."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    idle = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        engine.add_request(f"settle-{n}", TokensPrompt(prompt_token_ids=[5, 6, 7]), idle)
        while engine.has_unfinished_requests():
            engine.step()
        n += 1
        time.sleep(0.05)


def child_main(plan_path: Path) -> dict[str, Any]:
    """One configuration's run, in this (fresh) process."""
    from vllm import SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.llm_engine import LLMEngine

    plan = json.loads(plan_path.read_text())
    trace = json.loads(Path(plan["trace"]).read_text())
    transfer = plan["kv_transfer"]
    iterations: list[dict[str, Any]] = []
    started = time.monotonic()
    engine = LLMEngine.from_engine_args(
        EngineArgs(model=plan["model"], skip_tokenizer_init=True, dtype="float32",
                   max_model_len=plan["max_model_len"], enforce_eager=True, seed=0,
                   block_size=32, enable_prefix_caching=False,
                   kv_transfer_config=KVTransferConfig(**transfer) if transfer else None,
                   disable_log_stats=False, enable_logging_iteration_details=True),
        stat_loggers=[_step_logger(iterations)],
    )
    engine_s = time.monotonic() - started
    params = SamplingParams(temperature=0.0, max_tokens=plan["output_tokens"],
                            ignore_eos=True, detokenize=False)
    # one-time start-up work (kernels, allocations) is not part of the trace;
    # a prompt shorter than a block offloads nothing
    engine.add_request("warm-up", TokensPrompt(prompt_token_ids=[7] * 24), params)
    while engine.has_unfinished_requests():
        engine.step()
    before = offload_metrics(engine) if transfer else {}
    threads, times = thread_cpu(), os.times()
    result = run_trace(engine, trace, plan["concurrency"], params, iterations)
    done = os.times()
    result["cpu_s"] = round(done.user + done.system - times.user - times.system, 2)
    result["cpu_s_by_thread"] = cpu_by_thread(threads, thread_cpu())
    tiers: list[dict[str, Any]] = []
    metrics: dict[str, float] = {}
    if transfer:
        settle(engine, 1.0)
        after = offload_metrics(engine)
        metrics = {k: v - before.get(k, 0) for k, v in after.items()}
        tiers = chain_tiers()
    policies = cache_policies() if transfer else []
    engine.engine_core.shutdown()
    return {"config": plan["config"], "engine_start_s": round(engine_s, 1), **result,
            "vllm_tiers": tiering_by_tier(metrics), "vllm_offload_metrics": metrics,
            "kvtier_tiers": tiers, "kvtier_policies": policies}


def cache_policies() -> list[dict[str, Any]]:
    """``stats()`` of kvtier's cache policies in vLLM's CPU tier, if one was loaded."""
    if "kvtier.contrib.vllm.cache_policy" not in sys.modules:
        return []
    from kvtier.contrib.vllm.cache_policy import live_policies

    return [dict(p.stats(), cls=type(p).__name__) for p in live_policies()]


def engines_main(plan_paths: list[Path]) -> None:
    """Import vLLM once, then run each plan in a forked process of its own, in turn."""
    # what every fork would otherwise import again
    import vllm.engine.arg_utils
    import vllm.v1.engine.llm_engine  # noqa: F401

    import kvtier.contrib.vllm.spec
    import kvtier.contrib.vllm.tier  # noqa: F401

    for plan_path in plan_paths:
        plan = json.loads(plan_path.read_text())
        result_path, log_path = plan_path.with_name("result.json"), plan_path.with_name("log")
        result_path.unlink(missing_ok=True)
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                result = child_main(plan_path)
                result_path.write_text(json.dumps(result))
                code = 0
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        status = _wait(pid, plan["timeout_s"])
        print(f"serving: {plan['config']}: engine process ended ({status}) after "
              f"{time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def _wait(pid: int, timeout: float) -> str:
    """Wait for a forked engine; kill it past ``timeout`` seconds (a stuck run fails alone)."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return f"exit {os.waitstatus_to_exitcode(status)}"
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return f"killed after {timeout:.0f} s"
        time.sleep(0.2)
