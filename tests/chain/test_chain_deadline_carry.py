"""A deadline moves with its block (``kvtier.chain.carry``): a copy the chain makes after
``Chain.expire`` (a demotion, a promotion) gets the block's deadline where it lands, so it
is a miss there once the deadline passed; a deadline another process set in the shared fs
pool goes along with a promotion too.  Real tiers: host over fs on real files, and a second
process for the pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from deadline_chains import HOST_OF_FOUR, wait_until
from deadline_chains import host_over_fs as config

from kvtier import open_chain
from kvtier.chain import Chain
from kvtier.chain.carry import DeadlineRecord

BLOCK = 1000


def block(i: int) -> bytes:
    return bytes((i * 11 + j) % 251 for j in range(BLOCK))


def key(i: int) -> bytes:
    return b"carry-%04d" % i


def held(chain: Chain, tier: int, ids: list[int]) -> list[bool]:
    return chain.tiers[tier].lookup([key(i) for i in ids])


def test_a_demoted_block_takes_its_deadline_down(tmp_path: Path) -> None:
    # a host tier of four blocks, written back: what it evicts is demoted to fs
    with open_chain(config(tmp_path, "back", host=HOST_OF_FOUR), {"model": "carry"}) as chain:
        chain.put([key(0), key(1)], [block(0), block(1)])
        assert chain.expire([key(0)], after=0.8) == [True]
        start = time.monotonic()  # the deadline is no later than start + after
        assert held(chain, 1, [0, 1]) == [False, False]  # at the host tier alone
        for i in range(2, 8):  # pushes 0 and 1 out of the host tier, down to fs
            chain.put([key(i)], [block(i)])
        chain.flush()
        assert held(chain, 0, [0, 1]) == [False, False]
        if time.monotonic() - start < 0.6:  # demoted before the deadline
            assert held(chain, 1, [0, 1]) == [True, True]
        wait_until(start, 0.85)
        # a get sweeps the fs tier (its lookups answer from the index until then)
        assert chain.get_bytes([key(0), key(1)]) == [None, block(1)]
        assert held(chain, 1, [0]) == [False], "the demoted copy outlived its deadline"


def test_a_promoted_block_takes_its_deadline_up(tmp_path: Path) -> None:
    with open_chain(config(tmp_path, "through"), {"model": "carry"}) as chain:
        chain.put([key(0), key(1)], [block(0), block(1)])
        chain.flush()
        assert chain.tiers[0].evict([key(0), key(1)]) == [True, True]  # at fs alone
        assert chain.expire([key(0)], after=0.8) == [True]
        start = time.monotonic()  # the deadline is no later than start + after
        assert chain.get_bytes([key(0), key(1)]) == [block(0), block(1)]  # promoted
        chain.flush()
        assert held(chain, 0, [0, 1]) == [True, True]
        wait_until(start, 0.85)
        assert held(chain, 0, [0]) == [False], "the promoted copy outlived its deadline"
        assert chain.get_bytes([key(0), key(1)]) == [None, block(1)]


def test_a_copy_whose_deadline_passed_on_its_way_is_a_miss_where_it_lands(
        tmp_path: Path) -> None:
    with open_chain(config(tmp_path, "back", host=HOST_OF_FOUR), {"model": "carry"}) as chain:
        chain.put([key(0)], [block(0)])
        assert chain.expire([key(0)], after=0.3) == [True]
        start = time.monotonic()
        fs = chain.tiers[1]
        real_put = fs.put_blobs

        def slow_put(*args: Any, **kwargs: Any) -> Any:  # the copy lands past the deadline
            wait_until(start, 0.35)
            return real_put(*args, **kwargs)

        fs.put_blobs = slow_put  # type: ignore[method-assign]
        for i in range(1, 6):  # 0 leaves the host tier before its deadline
            chain.put([key(i)], [block(i)])
        chain.flush()
        assert held(chain, 1, [0]) == [False]
        assert chain.get_bytes([key(0)]) == [None]


def test_the_record_is_bounded_and_forgets_what_passed() -> None:
    record = DeadlineRecord(limit=4)
    assert record.known([key(0)]) is None
    now = time.monotonic()
    record.remember([key(i) for i in range(3)], now + 10)
    record.remember([key(0)], now + 20)  # later: the earlier stays
    record.remember([key(1)], now + 5)  # earlier: taken
    assert record.known([key(0), key(1), key(9)]) == [now + 10, now + 5, None]
    record.remember([key(i) for i in range(3, 6)], now + 30)  # 6 > 4: the soonest go
    assert len(record) == 4 and record.forgot
    assert record.known([key(1), key(0), key(2)]) == [None, None, now + 10]  # ties: by key
    record.forget([key(3), key(4)], now + 1)  # not their deadline: kept
    record.forget([key(3)], now + 30)
    assert record.known([key(3), key(4)]) == [None, now + 30]
    record.remember([key(7)], now - 120)  # long past: pruned at the next look
    assert record.known([key(7)]) is None


_EXPIRE_ELSEWHERE = """
import json, sys
from kvtier import open_chain
spec = json.loads(sys.argv[1])
with open_chain(spec["config"], {"model": "carry"}) as chain:
    keys = [k.encode() for k in spec["keys"]]
    chain.put(keys, [bytes.fromhex(b) for b in spec["blocks"]])
    print(json.dumps(chain.expire(keys[:1], after=spec["after"])))
"""


def test_a_deadline_another_process_set_goes_up_with_a_promotion(tmp_path: Path) -> None:
    pool = {"capacity_scope": "pool"}
    disk = config(tmp_path, "through", **pool)["chain"][1]
    fs_alone = {"chain": [{k: v for k, v in disk.items() if k != "write"}]}
    with open_chain(config(tmp_path, "through", **pool), {"model": "carry"}) as chain:
        spec = {"config": fs_alone, "keys": [key(0).decode(), key(1).decode()],
                "blocks": [block(0).hex(), block(1).hex()], "after": 1.5}
        done = subprocess.run([sys.executable, "-c", _EXPIRE_ELSEWHERE, json.dumps(spec)],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert done.returncode == 0, done.stderr
        start = time.monotonic()  # the deadline is no later than start + 1.5 s
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [True]
        assert chain.get_bytes([key(0), key(1)]) == [block(0), block(1)]  # from fs: promoted
        chain.flush()
        assert held(chain, 0, [0, 1]) == [True, True]
        wait_until(start, 1.55)
        assert held(chain, 0, [0]) == [False], "the promoted copy outlived the deadline"
        assert held(chain, 0, [1]) == [True]
