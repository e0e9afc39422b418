"""Crash safety of the fs tier: a writer killed with SIGKILL leaves every key absent or exact.

Each round starts a writer process (crash_writer.py), kills it at a random
moment (half the rounds aim at the middle of a large write), reopens the
directory in a new chain and reads every key the writer may have touched.
A key whose put returned must be there and exact (SIGKILL loses no page
cache); a key whose put was in flight may be absent; nothing may be wrong,
and nothing may be rejected as corrupt: a torn file that the checksum
catches is still a crash-safety bug, which the ``corrupt`` count shows.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crash_writer import NAMESPACE, chain_config, size_of
from faultkit import Report, read_exact

import kvtier
from kvtier.testing.data import block_for, crash_key

WRITER = Path(__file__).with_name("crash_writer.py")


def run_and_kill(directory: Path, prefix: str, rng: random.Random, aim: bool) -> tuple[int, int]:
    """Start a writer, SIGKILL it; answer (last index begun, last index done)."""
    proc = subprocess.Popen([sys.executable, str(WRITER), str(directory), prefix],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    begun, done = [-1], [-1]
    first = threading.Event()
    large = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            word, *nums = line.split()
            if word == "begin":
                begun[0] = int(nums[1])
                first.set()
                if any(size_of(i) >= 256 * 1024 for i in range(int(nums[0]), int(nums[1]) + 1)):
                    large.set()
            elif word == "done":
                done[0] = int(nums[0])
        first.set()
        large.set()

    reader = threading.Thread(target=pump)
    reader.start()
    try:
        first.wait(60)
        time.sleep(rng.uniform(0.0, 0.15))
        if aim:  # strike inside the next large write, where a torn file would show
            large.clear()
            large.wait(30)
            time.sleep(rng.uniform(0.0, 0.002))
        ended_early = proc.poll()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        reader.join()
    assert proc.stderr is not None
    errors = proc.stderr.read()
    proc.stderr.close()
    assert ended_early is None, f"the writer ended by itself ({ended_early}):\n{errors[-2000:]}"
    assert begun[0] >= 0, f"the writer never began a put:\n{errors[-2000:]}"
    return begun[0], done[0]


@pytest.mark.parametrize("rounds", [pytest.param(20, id="ci"),
                                    pytest.param(200, id="long", marks=pytest.mark.slow)])
def test_sigkill_leaves_every_key_absent_or_exact(
    tmp_path: Path, fault_report: Report, rounds: int
) -> None:
    rng = random.Random(20261203)
    directory = tmp_path / "disk"
    kills = checked = present = in_flight_absent = 0
    wrong: list[str] = []
    for number in range(rounds):
        prefix = f"r{number}"
        top, done = run_and_kill(directory, prefix, rng, aim=number % 2 == 1)
        kills += 1
        with kvtier.open_chain(chain_config(str(directory)), namespace=NAMESPACE) as chain:
            keys = [crash_key(prefix, i) for i in range(top + 3)]
            sizes = [size_of(i) for i in range(top + 3)]
            for start in range(0, len(keys), 16):
                got = read_exact(chain, keys[start:start + 16], sizes[start:start + 16])
                for index, have in enumerate(got, start):
                    checked += 1
                    want = block_for(keys[index], sizes[index])
                    if have is None:
                        if index <= done:
                            wrong.append(f"round {number}: {keys[index]!r} lost after its put "
                                         "returned")
                        elif index <= top:
                            in_flight_absent += 1
                        continue
                    present += 1
                    if index > top or have != want:
                        wrong.append(f"round {number}: {keys[index]!r} is not the block written")
            tier = chain.stats()["tiers"][0]
            assert tier["corrupt"] == 0 and tier["errors"] == 0, (number, tier)
            # the directory keeps working after a crash, and removes what it is told to
            probe = crash_key("probe", number)
            assert chain.put([probe], [block_for(probe, 5000)]) == [True]
            assert read_exact(chain, [probe], [5000]) == [block_for(probe, 5000)]
            chain.evict([*keys, probe])
            assert chain.lookup(keys) == [None] * len(keys)
        assert not wrong, wrong[:10]
    variant = "long" if rounds >= 200 else "ci"
    fault_report.record(
        f"crash_{variant}", variant, kills=kills, keys_checked=checked,
        keys_present_exact=present, in_flight_absent=in_flight_absent, wrong=len(wrong),
        corrupt=0,
    )
