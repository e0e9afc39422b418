"""What a load costs, learned from each tier's own reads, and whether a hit is worth it.

:class:`LoadCost` fits, per tier, the time of a read batch as a latency part
plus a bandwidth part (``seconds = latency + bytes / bandwidth``) from the
tier's recent reads, by least squares over exponentially decaying sums: a
sample's weight halves every ``half_life`` seconds, so the fit follows a
link that saturates or a disk shared with a scrub within seconds.  The
weights are also capped (:data:`_CAP` samples' worth), so that however fast
reads come, a new read moves the fit by at least ``1/_CAP``.  The spread of
the residuals is kept too, and a tier is judged by a high quantile of its
predicted time (:data:`QUANTILE`), so an erratic tail counts.

A tier with no recent reads (their weight decayed below :data:`_MEASURED`)
is *unmeasured*.  Where loads are weighed, the chain measures such a tier
when a lookup finds blocks in it, by reading one of them, and a second where
the first says the tier is slower than recomputing (a *probe*,
:meth:`LoadDecision.probe`), so that a fresh process does not load a whole
prefix from a slow tier before it knows the tier is slow; where nothing measured it, it
is trusted: its hits are loaded, and that load measures it.  A tier that was
slow and declined is probed again once its measurements are old.

What a process measured of each tier is kept at close beside the learned
recompute model (:mod:`kvtier.chain.learned_cost`).  A later process that
finds the tier unmeasured takes that fit, once, as one read made then, where
it says the tier is slower than recomputing: it declines the tier without
probing it.  A kept fit that says the tier is fast is not taken: the tier
is probed, so one that turned slow since is not loaded blindly.

:class:`LoadDecision` answers an engine's "how much of this prefix do you
hold" with the prefix that saves the most time: ``load_margin`` times the
predicted time to recompute its tokens, less its predicted load time summed
over the tiers holding its blocks; and counts, per tier, the blocks declined.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist
from typing import Any

from kvtier.chain.learned_cost import RecomputeModel, open_model, tier_key
from kvtier.chain.probed import ProbedBlocks
from kvtier.chain.readback import ReadBack
from kvtier.config.load_policy import LoadConfig

__all__ = ["QUANTILE", "LoadCost", "LoadDecision"]

#: The clock of every fit (a test of a whole chain may set another).
_clock: Callable[[], float] = time.monotonic

#: The quantile of a tier's predicted load time that decisions use.
QUANTILE = 0.9
_Z = NormalDist().inv_cdf(QUANTILE)
#: The most a tier's fit weighs, in samples: a new sample moves it by at least 1/_CAP.
_CAP = 8.0
#: Below this weight (in samples) a tier counts as unmeasured: 3 half-lives
#: after its one read, 6 after reads that filled the cap.
_MEASURED = 1 / 8
#: Batch sizes spread less than this (relative standard deviation) cannot
#: separate latency from bandwidth: the fit is then proportional to bytes.
_SPREAD = 0.05


class LoadCost:
    """The online fit of one tier's read time.  Thread-safe."""

    def __init__(self, half_life: float = 2.0, clock: Callable[[], float] | None = None):
        self.half_life = half_life
        self._clock = clock or (lambda: _clock())
        self._lock = threading.Lock()
        self._at = 0.0
        # decayed sums: weight, bytes, seconds, bytes^2, bytes*seconds, seconds^2, bytes/block
        self._w = self._x = self._y = self._xx = self._xy = self._yy = self._b = 0.0
        self._last: dict[str, float] | None = None  # the fit after the latest read, undecayed
        #: what measured the tier last (``load``, ``probe``, ``read-back``, or ``kept`` and
        #: what measured it in the process that kept it), and how many samples this fit took
        self.source = "none"
        self.samples = 0

    def _decay(self, now: float) -> float:
        """Age the sums to ``now``; returns the weight left."""
        if self._w:
            factor = 0.5 ** (max(0.0, now - self._at) / self.half_life)
            self._scale(factor)
            if self._w < _MEASURED:  # stale: forget it, the tier is unmeasured again
                self._scale(0.0)
        self._at = now
        return self._w

    def _scale(self, f: float) -> None:
        self._w *= f
        self._x *= f
        self._y *= f
        self._xx *= f
        self._xy *= f
        self._yy *= f
        self._b *= f

    def observe(self, blocks: int, nbytes: int, seconds: float, source: str = "load") -> None:
        """Record a read of ``blocks`` blocks, ``nbytes`` payload bytes, that took ``seconds``
        (``source``: a ``load``, a ``probe`` or a ``read-back``)."""
        if blocks <= 0:
            return
        x, y = float(nbytes), max(0.0, seconds)
        with self._lock:
            self._decay(self._clock())
            self._w += 1.0
            self._x += x
            self._y += y
            self._xx += x * x
            self._xy += x * y
            self._yy += y * y
            self._b += x / blocks
            if self._w > _CAP:
                self._scale(_CAP / self._w)
            self._last = self._means()
            self.source, self.samples = source, self.samples + 1

    def _means(self) -> dict[str, float]:
        # the fit is the same for sums scaled by any factor: their means are the fit
        sums = ("x", self._x), ("y", self._y), ("xx", self._xx), ("xy", self._xy), \
            ("yy", self._yy), ("b", self._b)
        return {name: value / self._w for name, value in sums}

    def state(self) -> dict[str, Any] | None:
        """What this process last measured of the tier (the fit after its latest read,
        however old now, with its ``source`` and ``samples``), to keep; None where it
        read nothing from the tier."""
        with self._lock:
            if self._last is None:
                return None
            return {**self._last, "source": self.source, "samples": self.samples}

    def seed(self, state: Mapping[str, Any]) -> bool:
        """Take a kept :meth:`state` as one read's worth of measurements made now (it
        decays from here like a read); False, taking nothing, where it does not check out."""
        names = ("x", "y", "xx", "xy", "yy", "b")
        values = [v for v in (state.get(name) for name in names)
                  if isinstance(v, float) and math.isfinite(v) and v >= 0]
        if len(values) != len(names):
            return False
        source = state.get("source")
        with self._lock:
            self._decay(self._clock())
            if self._w:  # measured meanwhile: this process's reads win
                return False
            self._w = 1.0
            self._x, self._y, self._xx, self._xy, self._yy, self._b = values
            self.source = f"kept {source}" if isinstance(source, str) else "kept"
            self.samples += 1
        return self.fit() is not None

    def fit(self) -> tuple[float, float, float, float] | None:
        """``(latency s, seconds per byte, relative spread, bytes per block)``, or None
        where the tier is unmeasured."""
        with self._lock:
            w = self._decay(self._clock())
            if not w:
                return None
            mx, my = self._x / w, self._y / w
            var_x = max(0.0, self._xx / w - mx * mx)
            if var_x > (_SPREAD * mx) ** 2:
                slope = (self._xy / w - mx * my) / var_x
                intercept = my - slope * mx
                if slope < 0:
                    slope, intercept = 0.0, my
                elif intercept < 0:
                    slope, intercept = self._xy / self._xx, 0.0
            else:
                slope, intercept = (my / mx, 0.0) if mx else (0.0, my)
            a, b = intercept, slope
            sse = (self._yy - 2 * a * self._y - 2 * b * self._xy + a * a * w
                   + 2 * a * b * self._x + b * b * self._xx)
            spread = math.sqrt(max(0.0, sse) / w) / my if my > 0 else 0.0
            return a, b, spread, self._b / w

    def predict(self, blocks: int, block_bytes: int | None = None) -> float:
        """Seconds to read ``blocks`` blocks (of ``block_bytes``, default the tier's usual
        size), at :data:`QUANTILE`; 0.0 for an unmeasured tier (trusted)."""
        fit = self.fit()
        if fit is None or blocks <= 0:
            return 0.0
        return _seconds(fit, blocks, block_bytes)

    def summary(self) -> dict[str, Any]:
        """The fit as ``stats()`` shows it; ``block_s`` is a usual block's load time."""
        fit = self.fit()
        if fit is None:
            return {"measured": False, "block_s": 0.0}
        a, b, spread, per_block = fit
        return {
            "measured": True,
            "source": self.source,
            "samples": self.samples,
            "block_s": _seconds(fit, 1, None),
            "latency_s": a,
            "bandwidth_Bps": 1.0 / b if b > 0 else math.inf,
            "spread": spread,
            "block_bytes": int(per_block),
        }


def _seconds(fit: tuple[float, float, float, float], blocks: int, block_bytes: int | None) -> float:
    a, b, spread, per_block = fit
    size = per_block if block_bytes is None else block_bytes
    return (a + b * size * blocks) * (1.0 + _Z * spread)


class LoadDecision:
    """Per tier of a chain: its :class:`LoadCost`, and the loads declined as not worth it."""

    def __init__(self, config: LoadConfig, tiers: int, tokens_per_block: int,
                 clock: Callable[[], float] | None = None,
                 recompute: RecomputeModel | None = None,
                 tier_keys: Sequence[str] = (), readable: Sequence[Any] = ()) -> None:
        self.config = config
        #: the configured ``recompute``, else the one learned (:mod:`kvtier.chain.learned_cost`)
        self.recompute = recompute or RecomputeModel(config.recompute)
        self.tokens_per_block = tokens_per_block
        self.costs = [LoadCost(config.half_life, clock) for _ in range(tiers)]
        self._lock = threading.Lock()
        self._declined = [0] * tiers
        self._declined_tokens = [0] * tiers
        self._probes = [0] * tiers
        self._probing = [threading.Lock() for _ in range(tiers)]
        #: per tier, how the record names its load cost (none: not kept)
        self.tier_keys = list(tier_keys)
        self._kept = [0] * tiers  # kept fits taken instead of a probe
        #: what probes read, for the load that follows (:mod:`kvtier.chain.probed`)
        self.probed = ProbedBlocks()
        #: ``readable[i]`` (tier i) read back after stores (:mod:`kvtier.chain.readback`)
        self.readback = ReadBack(self, readable)

    @classmethod
    def for_chain(cls, config: LoadConfig, tiers: Sequence[Any], registry: Any) -> LoadDecision:
        """A chain's decision; where no recompute model is configured, it is learned and kept
        in the first persistent tier of ``tiers`` (:func:`.learned_cost.open_model`)."""
        tokens = tiers[0].namespace.tokens_per_block if tiers else 0
        return cls(config, len(tiers), tokens,
                   recompute=open_model(config.recompute, tiers, registry),
                   tier_keys=[tier_key(tier.config) for tier in tiers], readable=tiers)

    @property
    def weighs(self) -> bool:
        """Whether loads are weighed against recomputing (a ``recompute`` model is set,
        or one was learned)."""
        return self.config.policy == "cost" and self.recompute.current() is not None

    def describe(self) -> str:
        """``stats()["load_policy"]``: the configured policy, or the learned model in effect."""
        model = self.recompute.current()
        if self.config.policy != "cost" or self.config.recompute is not None or model is None:
            return self.config.describe()
        return (f"cost (recompute {model.describe()} learned from "
                f"{self.recompute.learner.samples} samples, margin {self.config.margin:g})")

    def policy_stats(self) -> dict[str, Any]:
        """``load_policy`` (:meth:`describe`) and ``recompute`` (where its model came from)."""
        return {"load_policy": self.describe(), "recompute": self.recompute.summary()}

    def block_recompute(self) -> tuple[float, str, int]:
        """Expected seconds to recompute a block's tokens (0.0: no model), the model's
        source, and the timed recomputes the learned model holds."""
        model = self.recompute.current()
        seconds = model.seconds(self.tokens_per_block) if model is not None else 0.0
        return seconds, self.recompute.source, self.recompute.learner.samples

    def close(self) -> None:
        """Keep what was learned (the chain closes): the recompute model, and what this
        process measured of each tier (read back first where due)."""
        self.readback.close()
        loads = {key: state for key, cost in zip(self.tier_keys, self.costs)
                 if (state := cost.state()) is not None}
        self.recompute.save(loads)

    def unmeasured(self, where: Sequence[int | None]) -> list[int]:
        """The tiers in ``where`` (a lookup's answer) with no recent reads, each once;
        a tier an earlier process found slower than recomputing is judged by that
        (:meth:`_take_kept`)."""
        tiers = {t for t in where if t is not None}
        return sorted(t for t in tiers if not self.measured(t) and not self._take_kept(t))

    def _take_kept(self, tier: int) -> bool:
        """Take the load cost an earlier process kept for ``tier`` (once a process), where
        it says the tier is slower than recomputing; whether it did."""
        key = self.tier_keys[tier] if tier < len(self.tier_keys) else None
        state = self.recompute.kept_loads.pop(key, None) if key is not None else None
        if state is None:
            return False
        trial = LoadCost(self.costs[tier].half_life, self.costs[tier]._clock)
        if not trial.seed(state) or not self.slower_than_recompute(trial.predict(1)):
            return False  # a fast tier is measured by a read: it may have turned slow
        if not self.costs[tier].seed(state):
            return False
        with self._lock:
            self._kept[tier] += 1
        return True

    def wants_read_back(self, tier: int) -> bool:
        """Whether tier ``tier`` is worth reading back after a store: loads are weighed by
        cost and nothing measured it lately (:mod:`kvtier.chain.readback`)."""
        return self.config.policy == "cost" and not self.measured(tier)

    def read_back(self, tier: int, nbytes: int, seconds: float) -> None:
        """A block of ``nbytes`` read back from tier ``tier`` in ``seconds``."""
        self.costs[tier].observe(1, nbytes, seconds, "read-back")

    def block_s(self, tier: int) -> float:
        """Expected seconds to load a usual block of tier ``tier`` (0.0: unmeasured)."""
        return self.costs[tier].predict(1)

    def block_load(self, tier: int) -> tuple[float, str]:
        """:meth:`block_s`, and what measured the tier (``none`` while unmeasured)."""
        cost = self.costs[tier]
        seconds = cost.predict(1)
        return seconds, cost.source if cost.fit() is not None else "none"

    def measured(self, tier: int) -> bool:
        """Whether tier ``tier`` has recent reads to judge it by."""
        return self.costs[tier].fit() is not None

    def probe(self, tier: int, held: Sequence[int],
              read: Callable[[int], tuple[Any, Any]],
              keys: Sequence[bytes] = ()) -> list[tuple[int, Any, Any]]:
        """Measure unmeasured tier ``tier`` by reading the first of ``held`` (positions
        of its blocks in a lookup) with ``read(i) -> (context, payload or None)``;
        answer the reads, ``(i, context, payload)``.  The blocks read are kept
        in :attr:`probed` by their ``keys[i]``, for the load that follows.

        One read is one sample, and the engine's own threads can delay it many
        times over (a 0.3 ms read of the fs tier took 15 ms beside vLLM's): where
        it says the tier is slower than recomputing (:meth:`slower_than_recompute`),
        a second block is read and the faster read counts.  Lookups that find the
        tier unmeasured at once wait for one probe instead of each reading.
        """
        reads: list[tuple[int, Any, Any]] = []
        with self._probing[tier]:
            if self.measured(tier):  # by a probe that ran meanwhile
                return reads
            fastest: tuple[float, int] | None = None
            for i in held[:2]:
                start = time.perf_counter()
                context, payload = read(i)
                seconds = time.perf_counter() - start
                with self._lock:
                    self._probes[tier] += 1
                reads.append((i, context, payload))
                if payload is None:
                    continue
                if keys:
                    self.probed.hold(keys[i], payload)
                if fastest is None or seconds < fastest[0]:
                    fastest = (seconds, len(payload))
                if not self.slower_than_recompute(seconds):
                    break
            if fastest is not None:
                self.costs[tier].observe(1, fastest[1], fastest[0], "probe")
        return reads

    def slower_than_recompute(self, seconds: float) -> bool:
        """Whether a read of one block in ``seconds`` costs more than the margin times
        recomputing a block's tokens (a probe that would have the tier declined)."""
        recompute = self.recompute.current()
        if recompute is None or not self.tokens_per_block:
            return False
        return seconds > self.config.margin * recompute.seconds(self.tokens_per_block)

    def observe(self, tier: int, found: Sequence[bool], sizes: Sequence[int],
                seconds: float) -> None:
        """A read of tier ``tier``: ``found`` and ``sizes`` per block asked, its time."""
        hits = sum(found)
        if hits:
            self.costs[tier].observe(hits, sum(s for s, f in zip(sizes, found) if f), seconds)

    def worth(self, where: Sequence[int | None], tokens_per_block: int | None = None,
              block_bytes: int | None = None) -> int:
        """How many leading blocks to load, given each block's tier (``None``: held nowhere).

        The held prefix that saves the most: the margin times its recompute time,
        less its predicted load time, at least 0; the longest of equals.  A prefix
        loads faster than it recomputes; and where a fast tier holds the start
        and a slow one the rest, the slow rest, which would cost more to load
        than to recompute, is left out even where the fast start's savings
        would pay for it.  Every held block is loaded where the policy does not
        weigh loads.  The held blocks beyond the answer are counted as declined.
        """
        held = len(where)
        for i, tier in enumerate(where):
            if tier is None:
                held = i
                break
        recompute = self.recompute.current()
        if not held or self.config.policy != "cost" or recompute is None:
            return held
        per_block = tokens_per_block or self.tokens_per_block
        if not per_block:  # tokens unknown: nothing to weigh a load against
            return held
        margin = self.config.margin
        # a tier's k-th block adds (a + b * size) * (1 + z * spread) once its
        # first has paid the latency: one multiply-add a block, not a fit
        first, then = [0.0] * len(self.costs), [0.0] * len(self.costs)
        for i, cost in enumerate(self.costs):
            fit = cost.fit()
            if fit is not None:  # an unmeasured tier costs nothing: trusted
                first[i] = _seconds(fit, 1, block_bytes)
                then[i] = _seconds(fit, 2, block_bytes) - first[i]
        points = recompute.points
        rate = points[0][1] / points[0][0] if len(points) == 1 else None
        seen = [False] * len(self.costs)
        total, best, most = 0.0, 0, 0.0
        for k in range(held):
            tier = where[k]
            assert tier is not None
            if seen[tier]:
                total += then[tier]
            else:
                seen[tier] = True
                total += first[tier]
            tokens = (k + 1) * per_block
            redo = rate * tokens if rate is not None else recompute.seconds(tokens)
            saved = margin * redo - total
            if saved >= most:
                best, most = k + 1, saved
        if best < held:
            declined = Counter(where[best:held])
            with self._lock:
                for tier, n in declined.items():
                    assert tier is not None
                    self._declined[tier] += n
                    self._declined_tokens[tier] += n * per_block
        return best

    def tier_stats(self, tier: int) -> dict[str, Any]:
        """``load_cost`` (the fit), ``declined`` blocks, ``declined_tokens``,
        ``probes`` (one-block reads that measured it), ``read_backs`` (blocks read back
        after stores to measure it), ``read_back_failures`` (read-backs a fault of the
        tier ended: no sample) and ``kept_costs`` (times an earlier process's fit
        judged it instead) of a tier."""
        with self._lock:
            declined, tokens = self._declined[tier], self._declined_tokens[tier]
            probes, kept = self._probes[tier], self._kept[tier]
        counts, failures = self.readback.counts, self.readback.failures
        return {"load_cost": self.costs[tier].summary(), "declined": declined,
                "declined_tokens": tokens, "probes": probes,
                "read_backs": counts[tier] if tier < len(counts) else 0,
                "read_back_failures": failures[tier] if tier < len(failures) else 0,
                "kept_costs": kept}
