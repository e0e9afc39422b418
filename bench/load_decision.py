"""What the load decision costs an engine's lookup: ``Chain.prefix_hits`` with and without it.

    python bench/load_decision.py [ROUNDS]

A chain of two host tiers holds a 1000-block prefix, the first 500 blocks in
the upper tier; reads have measured both.  Prints the median time of
``prefix_hits`` over the prefix with ``load_policy: always`` and with
``load_policy: cost`` (``recompute: 0.5ms/token``), and of the decision alone
(``worth_loading`` on the lookup's answer).  The modes alternate.
"""

from __future__ import annotations

import statistics
import sys
import time

import kvtier

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 50
ns = kvtier.Namespace("decision-bench", dtype="bfloat16", tokens_per_block=16)
keys = [b"block-%d" % i for i in range(1000)]
chains = {}
for policy in ("always", "cost"):
    cfg = {"chain": [{"name": "ram", "backend": "host", "capacity": "256MiB",
                      "promote": False},
                     {"name": "low", "backend": "host", "capacity": "256MiB"}],
           "load_policy": policy, "recompute": "0.5ms/token"}
    chain = kvtier.open_chain(cfg, namespace=ns)
    chain.put(keys, [bytes(4096)] * len(keys))
    chain.flush()
    chain.tiers[0].evict(keys[500:])
    chain.get(keys, [bytearray(4096) for _ in keys])  # measures both tiers
    chains[policy] = chain
times: dict[str, list[float]] = {"always": [], "cost": [], "decision alone": []}
where = chains["cost"].lookup(keys)
for _ in range(ROUNDS):
    for policy, chain in chains.items():
        start = time.perf_counter()
        assert chain.prefix_hits(keys) == 1000
        times[policy].append(time.perf_counter() - start)
    start = time.perf_counter()
    chains["cost"].worth_loading(where)
    times["decision alone"].append(time.perf_counter() - start)
for name, values in times.items():
    print(f"{name:>15}: {statistics.median(values) * 1e3:.2f} ms (median of {ROUNDS})")
for chain in chains.values():
    chain.close()
