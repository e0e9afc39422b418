"""The ``object`` tier on a replicated SeaweedFS cluster beside raw ``obstore`` on it.

    python bench/object_cluster.py [--block-size 2MiB] [--blocks 16] [--rounds 8]
        [--json bench/charts/object-cluster.json] [--no-mini]

Starts the cluster the tests use (``tests/support/seaweed_cluster.py``: master,
three volume servers, filer, S3 gateway, replication ``001``, all on
127.0.0.1), then runs ``kvtier bench --backend object --section tiers`` on a
bucket of it: kvtier's ``Chain.put``/``Chain.get`` and raw
``obstore.put``/``obstore.get`` timed in the same rounds on the same bytes.
Unless ``--no-mini``, the same command then runs on a single ``weed mini``
(what ``kvtier bench`` starts by itself), so the table shows what replication
and the extra hops cost, with kvtier and without.  Needs the test extras
(``weed``, ``obstore``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for folder in (REPO / "tests" / "support", REPO / "tests"):  # the cluster fixture
    sys.path.insert(0, str(folder))


def run_bench(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "kvtier.cli", "bench", "--backend", "object",
           "--section", "tiers", "--json", "--block-size", args.block_size,
           "--blocks", str(args.blocks), "--rounds", str(args.rounds)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False,
                          timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"kvtier bench failed ({done.returncode}):\n{done.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def on_cluster(args: argparse.Namespace) -> dict[str, Any]:
    from seaweed_cluster import SeaweedCluster

    with (tempfile.TemporaryDirectory(prefix="kvtier-bench-cluster-") as tmp,
          SeaweedCluster(tmp) as cluster):
        bucket = cluster.make_bucket(f"kvt-bench-{uuid.uuid4().hex[:10]}")
        env = dict(os.environ, KVTIER_BENCH_S3_ENDPOINT=cluster.endpoint,
                   KVTIER_BENCH_S3_BUCKET=bucket, AWS_ACCESS_KEY_ID=cluster.access_key,
                   AWS_SECRET_ACCESS_KEY=cluster.secret_key,
                   AWS_DEFAULT_REGION=cluster.region, AWS_REGION=cluster.region)
        return run_bench(args, env)


def rows(label: str, report: dict[str, Any]) -> list[str]:
    out = []
    for result in report["tiers"]["results"]:
        k = result["kvtier"]
        for raw in result["raw"]:
            out.append(f"| {label} | {result['op']} | {k['gbps']:.3f} | {k['p50_ms']:.1f} | "
                       f"{raw['name']} | {raw['gbps']:.3f} | {raw['p50_ms']:.1f} | "
                       f"{raw['ratio']:.2f}x | {raw['ratio_p50']:.2f}x | "
                       f"{'yes' if result['verified'] else 'NO'} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block-size", default="2MiB")
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write both reports here")
    parser.add_argument("--no-mini", action="store_true", help="skip the single weed mini run")
    args = parser.parse_args()
    reports = {"cluster": on_cluster(args)}
    if not args.no_mini:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_BENCH_S3_")}
        reports["weed mini"] = run_bench(args, env)
    print(f"block {args.block_size} x {args.blocks} per call, {args.rounds} rounds\n")
    print("| store | op | kvtier GB/s | kvtier p50 ms | raw | raw GB/s | raw p50 ms "
          "| kvtier/raw | median batches | verified |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, report in reports.items():
        print("\n".join(rows(label, report)))
    if args.json is not None:
        args.json.write_text(json.dumps(reports, indent=2) + "\n")


if __name__ == "__main__":
    main()
