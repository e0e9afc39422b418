"""The chain's record of its deadlines (``kvtier.chain.carry``) follows the blocks: a block
stored again after it left has no deadline, in any copy the chain makes of it later, while a
put of a key still held is no change to its deadline.  Real tiers: host over fs on real
files, and a second process on the fs pool."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from deadline_chains import HOST_OF_FOUR, host_over_fs, wait_until

from kvtier import open_chain
from kvtier.chain import Chain
from kvtier.spec import earliest_deadlines

BLOCK = 1000
NAMESPACE = {"model": "record"}


def block(i: int, fill: int = 0) -> bytes:
    return bytes((i * 11 + fill * 7 + j) % 251 for j in range(BLOCK))


def key(i: int) -> bytes:
    return b"record-%04d" % i


# four blocks in the host tier, so a few more puts push a block down to fs
config = functools.partial(host_over_fs, host=HOST_OF_FOUR)


def held(chain: Chain, tier: int, ids: list[int]) -> list[bool]:
    return chain.tiers[tier].lookup([key(i) for i in ids])


def push_down(chain: Chain, ids: range) -> None:
    """Puts that push the blocks before them out of the host tier, down to fs."""
    for i in ids:
        chain.put([key(i)], [block(i)])
    chain.flush()


def test_a_block_put_again_after_its_deadline_passed_has_none(tmp_path: Path) -> None:
    with open_chain(config(tmp_path, "back"), NAMESPACE) as chain:
        chain.put([key(0)], [block(0)])
        assert chain.expire([key(0)], after=0.2) == [True]
        time.sleep(0.3)
        assert chain.get_bytes([key(0)]) == [None]  # expired
        assert chain.put([key(0)], [block(0, fill=1)]) == [True]  # a new block
        push_down(chain, range(10, 16))
        assert held(chain, 0, [0]) == [False]
        assert held(chain, 1, [0]) == [True], "the demoted copy took the passed deadline"
        assert chain.get_bytes([key(0)]) == [block(0, fill=1)]


def test_put_blobs_after_the_deadline_passed_stores_a_block_without_one(
        tmp_path: Path) -> None:
    with open_chain({"chain": [{"name": "ram", "backend": "host", "capacity": "1MiB"}]},
                    NAMESPACE) as maker:
        maker.put([key(0)], [block(0, fill=2)])
        blob = maker.get_blobs([key(0)])[0]
    assert blob is not None
    with open_chain(config(tmp_path, "back"), NAMESPACE) as chain:
        chain.put([key(0)], [block(0)])
        assert chain.expire([key(0)], after=0.2) == [True]
        time.sleep(0.3)
        assert chain.put_blobs([key(0)], [blob]) == [True]
        push_down(chain, range(10, 16))
        assert held(chain, 1, [0]) == [True], "the demoted copy took the passed deadline"
        assert chain.get_bytes([key(0)]) == [block(0, fill=2)]


def test_a_block_that_left_every_tier_is_put_again_without_its_deadline(
        tmp_path: Path) -> None:
    with open_chain(config(tmp_path, "back"), NAMESPACE) as chain:
        chain.put([key(0), key(1)], [block(0), block(1)])
        assert chain.expire([key(0), key(1)], after=1.0) == [True, True]
        start = time.monotonic()  # the deadline is no later than start + 1.0
        # 0 leaves the only tier holding it behind the chain's back (as the tier's
        # own expiry or its capacity would); 1 stays
        assert chain.tiers[0].evict([key(0)]) == [True]
        assert chain.put([key(0), key(1)], [block(0, fill=1), block(1)]) == [True, True]
        push_down(chain, range(10, 16))
        if time.monotonic() - start < 0.9:  # demoted before the deadline
            assert held(chain, 1, [0, 1]) == [True, True]
        wait_until(start, 1.1)
        # 0 is a new block; the put of 1, still held, was no change to its deadline
        assert chain.get_bytes([key(0), key(1)]) == [block(0, fill=1), None]
        assert held(chain, 1, [1]) == [False], "the demoted copy of 1 outlived its deadline"


_PUT_ELSEWHERE = """
import json, sys
from kvtier import open_chain
spec = json.loads(sys.argv[1])
with open_chain(spec["config"], spec["namespace"]) as chain:
    print(json.dumps(chain.put([spec["key"].encode()], [bytes.fromhex(spec["block"])])))
"""


def test_a_caller_evict_forgets_the_deadline(tmp_path: Path) -> None:
    # the block comes back by another process's put into the shared fs pool: no put
    # of this chain sees it, so the evict alone must have forgotten the deadline
    pool = {"capacity_scope": "pool"}
    disk = config(tmp_path, "through", **pool)["chain"][1]
    fs_alone = {"chain": [{k: v for k, v in disk.items() if k != "write"}]}
    with open_chain(config(tmp_path, "through", **pool), NAMESPACE) as chain:
        chain.put([key(0)], [block(0)])
        chain.flush()
        assert chain.expire([key(0)], after=1.5) == [True]
        start = time.monotonic()  # the deadline is no later than start + 1.5
        assert chain.evict([key(0)]) == 1
        spec = {"config": fs_alone, "namespace": NAMESPACE, "key": key(0).decode(),
                "block": block(0, fill=3).hex()}
        done = subprocess.run([sys.executable, "-c", _PUT_ELSEWHERE, json.dumps(spec)],
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [True]
        assert held(chain, 0, [0]) == [False]
        assert chain.get_bytes([key(0)]) == [block(0, fill=3)]  # from fs: promoted
        chain.flush()
        wait_until(start, 1.6)
        assert held(chain, 0, [0]) == [True], "the promoted copy took the evicted block's deadline"
        assert chain.tiers[0].get_payloads([key(0)])[0] == block(0, fill=3)


def test_earliest_deadlines_joins_answers_per_key() -> None:
    known: list[float | None] = [None, 5.0, 2.0, None]
    earliest_deadlines(known, [3.0, None, 4.0, None])
    assert known == [3.0, 5.0, 2.0, None]
    earliest_deadlines(known, [1.0, 6.0], at=[1, 3])  # an answer about part of the batch
    assert known == [3.0, 1.0, 2.0, 6.0]


def test_a_put_of_a_block_held_below_gives_the_new_copy_its_deadline(tmp_path: Path) -> None:
    # the put is no change to the block: its copy in the host tier expires with the one in fs
    with open_chain(config(tmp_path, "back"), NAMESPACE) as chain:
        chain.put([key(0)], [block(0)])
        assert chain.expire([key(0)], after=1.0) == [True]
        start = time.monotonic()  # the deadline is no later than start + 1.0
        push_down(chain, range(10, 16))
        assert held(chain, 0, [0]) == [False]
        assert chain.put([key(0)], [block(0)]) == [True]  # into the host tier
        assert held(chain, 0, [0]) == [True] or time.monotonic() - start > 1.0
        wait_until(start, 1.1)
        assert held(chain, 0, [0]) == [False], "the put's copy outlived the block's deadline"
        assert chain.get_bytes([key(0)]) == [None]
