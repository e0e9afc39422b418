"""A fleet of engines sharing a pool: hand-checked traces and a plain LRU simulation."""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import OrderedDict
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import cli
from kvtier.plan import Request, Trace, generate, read_trace, replay, write_mooncake
from kvtier.plan.below import replay_below
from kvtier.plan.fleet import EngineServed, replay_fleet


def trace_of(*requests: tuple[int, ...], sessions: tuple[str, ...] = ()) -> Trace:
    return Trace([Request(keys, (1,) * len(keys), sessions[i] if sessions else None)
                  for i, keys in enumerate(requests)])


# A plain simulation: OrderedDicts for LRU tiers, nothing of kvtier's policies or fleet.
class PlainLru:
    def __init__(self, capacity: int) -> None:
        self.capacity, self.blocks = capacity, OrderedDict[int, None]()

    def use(self, key: int) -> bool:
        if key in self.blocks:
            self.blocks.move_to_end(key)
            return True
        return False

    def add(self, key: int) -> list[int]:
        self.blocks[key] = None
        out = []
        while len(self.blocks) > self.capacity:
            out.append(self.blocks.popitem(last=False)[0])
        return out


def plain_fleet(trace: Trace, n: int, router: str, ram: int, local: int, pool: int,
                write: str, balance: float = 0) -> list[list[int]]:
    shared = PlainLru(pool)
    chains = [[PlainLru(ram), *([PlainLru(local)] if local else []), *([shared] if pool else [])]
              for _ in range(n)]
    kinds = ["ram", *(["local"] if local else []), *(["pool"] if pool else [])]
    counts = [dict.fromkeys(("requests", "refs", "ram", "local", "pool", "tokens",
                             "w_local", "w_pool"), 0) for _ in range(n)]

    def write_to(e: int, i: int, key: int, promoted: bool) -> None:
        chain = chains[e]
        if chain[i].use(key):
            return
        out = chain[i].add(key)
        if i:
            counts[e]["w_" + kinds[i]] += 1
        if i + 1 < len(chain):
            for k in out if write == "back" else ([] if promoted else [key]):
                write_to(e, i + 1, k, False)

    for r, req in enumerate(trace.requests):
        room = [x for x in range(n) if not balance or
                counts[x]["requests"] < math.ceil(balance * (r + 1) / n)]
        if router == "round-robin":
            e = r % n
        elif router == "sticky":
            e = zlib.crc32(str(req.session or req.keys[0]).encode()) % n
            while e not in room:
                e = (e + 1) % n
        else:
            def held(x: int, keys: tuple[int, ...]) -> int:
                own = [t for t, k in zip(chains[x], kinds, strict=True) if k != "pool"]
                m = 0
                while m < len(keys) and any(keys[m] in t.blocks for t in own):
                    m += 1
                return m
            e = min(room, key=lambda x: (-held(x, req.keys), counts[x]["requests"], x))
        c = counts[e]
        c["requests"] += 1
        c["refs"] += len(req.keys)
        prefix = 0
        for key, tokens in zip(req.keys, req.tokens, strict=True):
            found = next((i for i, t in enumerate(chains[e]) if t.use(key)), None)
            if found is None:
                break
            c[kinds[found]] += 1
            c["tokens"] += tokens
            for above in range(found):
                write_to(e, above, key, True)
            prefix += 1
        for key in req.keys[prefix:]:
            write_to(e, 0, key, False)
    return [list(c.values()) for c in counts]


def as_lists(served: tuple[EngineServed, ...]) -> list[list[int]]:
    return [[e.requests, e.references, e.from_ram, e.from_local, e.from_pool, e.prefix_tokens,
             e.written_local, e.written_pool] for e in served]


@pytest.mark.parametrize(("router", "balance"), [
    ("round-robin", 0), ("sticky", 0), ("prefix", 0), ("sticky", 1.25), ("prefix", 1.25),
])
@pytest.mark.parametrize("write", ["through", "back"])
@pytest.mark.parametrize(("kind", "ram", "local", "pool"), [
    ("sessions", 20, 80, 300), ("prompts", 10, 0, 100), ("scan", 15, 40, 0),
])
def test_the_fleet_equals_a_plain_lru_simulation(
    router: str, balance: float, write: str, kind: str, ram: int, local: int, pool: int
) -> None:
    trace = generate(kind, 400, seed=3)
    point = replay_fleet(trace, 3, router, "lru", ram, local, pool, write, balance)
    assert as_lists(point.per_engine) == plain_fleet(trace, 3, router, ram, local, pool, write,
                                                     balance)
    assert point.total.references == trace.references


@pytest.mark.parametrize("policy", ["lru", "arc", "s3fifo", "adaptive"])
def test_one_engine_without_tiers_below_is_plans_replay(policy: str) -> None:
    trace = generate("documents", 300, seed=1)
    total = replay_fleet(trace, 1, "prefix", policy, 40).total
    alone = replay(trace, policy, 40)
    assert (total.from_ram, total.prefix_tokens) == (alone.prefix_hits, alone.prefix_tokens)
    assert total.from_local == total.from_pool == total.written_pool == 0


@pytest.mark.parametrize("write", ["through", "back"])
def test_one_engine_over_a_local_tier_or_a_pool_is_plans_below(write: str) -> None:
    trace = generate("scan", 300, seed=4)
    below = replay_below(trace, "arc", 20, 150, write, 1)
    local = replay_fleet(trace, 1, "round-robin", "arc", 20, local=150, write=write).total
    pool = replay_fleet(trace, 1, "sticky", "arc", 20, pool=150, write=write).total
    assert (local.from_ram, local.from_local, local.written_local) == (
        below.from_ram, below.from_below, below.written_below)
    assert (pool.from_ram, pool.from_pool, pool.written_pool) == (
        below.from_ram, below.from_below, below.written_below)
    sessions = generate("sessions", 400, seed=4)  # some writes read back, most not
    below = replay_below(sessions, "lru", 20, 150, write, 1)
    local = replay_fleet(sessions, 1, "round-robin", "lru", 20, local=150, write=write).total
    pool = replay_fleet(sessions, 1, "sticky", "lru", 20, pool=150, write=write).total
    assert 0 < below.never_read < below.written_below
    assert local.never_read_local == pool.never_read_pool == below.never_read


def test_a_pool_write_read_by_another_engine_was_read() -> None:
    # engine 0 writes 1 and 3 to the pool, engine 1 writes 2; engine 1 then reads 1 there
    point = replay_fleet(trace_of((1,), (2,), (3,), (1,)), 2, "round-robin", "lru", 1,
                         pool=10, write="through")
    first, second = point.per_engine
    assert (first.written_pool, first.never_read_pool) == (2, 1)  # 1 was read, 3 not
    assert (second.from_pool, second.written_pool, second.never_read_pool) == (1, 1, 1)
    # a pool of one block: 2 pushes 1 out unread, 3 pushes 2 out; engine 1 misses 1 and
    # writes it again, pushing 3 out, and it is still unread at the end
    point = replay_fleet(trace_of((1,), (2,), (3,), (1,)), 2, "round-robin", "lru", 1,
                         pool=1, write="through")
    assert [(e.written_pool, e.never_read_pool) for e in point.per_engine] == [(2, 2), (2, 2)]


def test_round_robin_serves_a_second_engine_from_the_pool() -> None:
    point = replay_fleet(trace_of((1, 2, 3), (1, 2, 3)), 2, "round-robin", "lru", 10, 10, 10)
    first, second = point.per_engine
    assert (first.requests, first.prefix_hits, first.written_local, first.written_pool) == (
        1, 0, 3, 3)
    assert (second.from_ram, second.from_local, second.from_pool) == (0, 0, 3)
    assert second.written_local == 3 and second.written_pool == 0  # promoted, not written down


def test_write_back_reaches_the_pool_only_once_evicted() -> None:
    # engine 0 still holds block 1 when engine 1 asks: the pool has not got it
    point = replay_fleet(trace_of((1,), (1,)), 2, "round-robin", "lru", 1, pool=10, write="back")
    assert point.total.prefix_hits == 0 and point.total.written_pool == 0
    # engine 0 evicts 1 for 2, writing it back; engine 1 then finds it in the pool
    point = replay_fleet(trace_of((1,), (2,), (3,), (1,)), 2, "round-robin", "lru", 1, pool=10,
                         write="back")
    assert [e.from_pool for e in point.per_engine] == [0, 1]


def test_sticky_keeps_a_session_on_one_engine() -> None:
    # four requests of one session, each starting with another block, and one of another
    trace = trace_of((1, 2), (3, 4), (5,), (6,), (1, 2), sessions=("a", "a", "a", "b", "b"))
    point = replay_fleet(trace, 4, "sticky", "lru", 10)
    engine_a = zlib.crc32(b"a") % 4
    assert point.per_engine[engine_a].requests >= 3
    assert sorted(e.requests for e in point.per_engine if e.requests) in ([2, 3], [5])
    # without session ids the first block decides: the repeat of (1, 2) lands where it was
    repeat = replay_fleet(trace_of((1, 2), (7,), (8,), (9,), (1, 2)), 4, "sticky", "lru", 10)
    assert repeat.total.from_ram == 2


def test_prefix_router_sends_a_request_to_the_engine_holding_its_prefix() -> None:
    trace = trace_of((1, 2, 3), (9,), (20,), (1, 2, 3, 4))
    # (1, 2, 3) -> engine 0; (9,) -> engine 1 (fewer requests); (20,) -> engine 0 (a tie
    # of loads goes to the lowest index); (1, 2, 3, 4) -> engine 0, which holds 1, 2, 3
    routed = replay_fleet(trace, 2, "prefix", "lru", 10)
    assert [e.requests for e in routed.per_engine] == [3, 1]
    assert routed.per_engine[0].from_ram == 3
    assert replay_fleet(trace, 2, "round-robin", "lru", 10).total.prefix_hits == 0


@pytest.mark.parametrize("router", ["sticky", "prefix"])
def test_balance_bounds_what_affinity_sends_to_one_engine(router: str) -> None:
    # every request begins with block 1: affinity alone sends them all to one engine
    trace = trace_of((1, 2), (1, 3), (1, 4), (1, 5))
    alone = replay_fleet(trace, 2, router, "lru", 10)
    assert sorted(e.requests for e in alone.per_engine) == [0, 4]
    # balance 1: an engine that has had its share, ceil((r + 1) / 2), is skipped
    bounded = replay_fleet(trace, 2, router, "lru", 10, balance=1)
    assert [e.requests for e in bounded.per_engine] == [2, 2]
    assert bounded.total.from_ram == 2  # block 1, once on each engine, then found there


def test_mooncake_session_ids_are_read_and_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"hash_ids": [1], "session_id": 42}\n{"hash_ids": [2], '
                    '"conversation_id": "c7"}\n{"hash_ids": [3]}\n')
    trace = read_trace(path)
    assert [r.session for r in trace.requests] == ["42", "c7", None]
    write_mooncake(trace, tmp_path / "out.jsonl")
    assert [r.session for r in read_trace(tmp_path / "out.jsonl").requests] == ["42", "c7", None]


def test_plan_engines_json_and_table(tmp_path: Path) -> None:
    args = ["plan", "--generate", "sessions:300:2", "--engines", "3", "--router", "prefix",
            "--capacity", "20", "--below", "60", "--pool", "0", "--pool", "200"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    trace = generate("sessions", 300, seed=2)
    assert out["trace"]["references"] == trace.references
    assert [row["pool"] for row in out["fleet"]] == [0, 200]
    for row in out["fleet"]:
        point = replay_fleet(trace, 3, "prefix", "lru", 20, 60, row["pool"], "through")
        assert row["per_engine"] == [e.to_json() for e in point.per_engine]
        assert row["total"] == point.total.to_json() and row["write"] == "through"
    table = CliRunner().invoke(cli, args)
    assert table.exit_code == 0, table.output
    assert "by shared pool" in table.output and "per engine, pool 200 blocks" in table.output
    one_prompt = tmp_path / "one-prompt.jsonl"  # every request begins with block 0
    write_mooncake(trace_of(*((0, i) for i in range(1, 21))), one_prompt)
    prefix = ["plan", str(one_prompt), "--engines", "4", "--router", "prefix", "--capacity", "30"]
    crowded = CliRunner().invoke(cli, prefix)
    assert crowded.exit_code == 0 and "one engine served 20 of 20 requests" in crowded.output
    spread = CliRunner().invoke(cli, [*prefix, "--balance", "1.25"])
    assert spread.exit_code == 0 and "twice its share" not in spread.output
    refused = CliRunner().invoke(cli, [*args, "--chart", "x.png"])
    assert refused.exit_code == 2 and "no --chart or --admit" in refused.output


def test_the_guides_fleet_table_is_what_the_fleet_replays() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "sizing.md").read_text()
    section = text[text.index("## Fleets"):]
    rows = re.findall(r"^ +([\d,]+) +[\d.]+ GiB +([\d.]+)% +([\d,]+) +([\d,]+) +([\d,]+) +"
                      r"([\d,]+) +([\d,]+) \((\d+)%\) +([\d,]+)(?: \((\d+)%\))?$", section,
                      flags=re.M)
    assert len(rows) == 3
    trace = generate("sessions", 5000, seed=1)
    for row in rows:
        pool, ratio, *counts = (float(v.replace(",", "") or 0) for v in row)
        t = replay_fleet(trace, 4, "round-robin", "lru", 100, 1000, int(pool), "through").total
        assert f"{t.prefix_ratio:.1%}" == f"{ratio}%"
        unread_local = round(100 * t.never_read_local / t.written_local)
        unread_pool = round(100 * t.never_read_pool / t.written_pool) if t.written_pool else 0
        assert [t.from_ram, t.from_local, t.from_pool, t.prefix_tokens, t.written_local,
                unread_local, t.written_pool, unread_pool] == counts


@pytest.mark.parametrize("write", ["through", "back"])
@pytest.mark.parametrize("kind", ["scan", "documents"])
def test_one_engine_over_an_s3fifo_local_tier_or_pool_is_plans_below(write: str,
                                                                      kind: str) -> None:
    trace = generate(kind, 400, seed=6)
    below = replay_below(trace, "lru", 20, 150, write, 1, "s3fifo")
    local = replay_fleet(trace, 1, "prefix", "lru", 20, local=150, write=write,
                         below_eviction="s3fifo")
    pool = replay_fleet(trace, 1, "round-robin", "lru", 20, pool=150, write=write,
                        below_eviction="s3fifo")
    assert local.below_eviction == pool.below_eviction == "s3fifo"
    assert (local.total.from_ram, local.total.from_local, local.total.written_local) == (
        below.from_ram, below.from_below, below.written_below)
    assert (pool.total.from_ram, pool.total.from_pool, pool.total.written_pool) == (
        below.from_ram, below.from_below, below.written_below)
    lru = replay_fleet(trace, 1, "round-robin", "lru", 20, pool=150, write=write).total
    assert lru.from_pool != pool.total.from_pool  # the policy below made a difference


def test_plan_engines_below_eviction_names_the_policy_only_where_given() -> None:
    args = ["plan", "--generate", "scan:300:2", "--engines", "2", "--capacity", "20",
            "--below", "60", "--pool", "150"]
    plain = json.loads(CliRunner().invoke(cli, [*args, "--json"]).output)
    assert all("below_eviction" not in row for row in plain["fleet"])
    both = CliRunner().invoke(cli, [*args, "--json", "--below-eviction", "lru",
                                    "--below-eviction", "s3fifo"])
    assert both.exit_code == 0, both.output
    rows = json.loads(both.output)["fleet"]
    assert [row["below_eviction"] for row in rows] == ["lru", "s3fifo"]
    assert rows[0]["total"] == plain["fleet"][0]["total"]
    trace = generate("scan", 300, seed=2)
    point = replay_fleet(trace, 2, "round-robin", "lru", 20, 60, 150, "through",
                         below_eviction="s3fifo")
    assert rows[1]["per_engine"] == [e.to_json() for e in point.per_engine]
    table = CliRunner().invoke(cli, [*args, "--below-eviction", "s3fifo"])
    assert table.exit_code == 0 and "local 60 (s3fifo); by shared pool (s3fifo)" in table.output
