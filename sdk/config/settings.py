"""The keys of a chain file that are not a backend's, declared once as :class:`~kvtier.spec.Option`.

:data:`TIER_OPTIONS` are the keys every tier entry takes, whatever its
backend; :data:`CHAIN_OPTIONS` the chain's own (its load policy, its
recording, its metrics), by dotted key path: ``record: FILE`` is short for
``record: {path: FILE}``.  The loader parses both as it parses a backend's
options (:mod:`kvtier.plugins.options`): one mechanism, one wording of every
error, and old keys read for a release with a warning naming the new one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from kvtier.block.crypt import check_key_sources
from kvtier.block.framing import CODECS, SHUFFLE_WIDTHS, ZSTD_LEVELS
from kvtier.config.load_policy import LOAD_POLICIES, parse_recompute
from kvtier.plugins.options import describe_value
from kvtier.spec import Option, Renamed

__all__ = ["CHAIN_OPTIONS", "TIER_OPTIONS", "Codec", "parse_codec"]

#: What ``shuffle=`` takes besides ``auto``: 0 and 1 turn it off.
_SHUFFLE_SETTINGS = (0, 1, *SHUFFLE_WIDTHS)


class Codec(NamedTuple):
    """A tier's ``codec`` parsed: the codec, the zstd level and the shuffle width."""

    name: str = "none"
    level: int = 1
    #: ``"auto"`` (from the namespace's dtype) or an element width; 0 and 1: off.
    shuffle: str | int = "auto"


def parse_codec(value: Any) -> Codec:
    """``none``, ``zstd``, ``zstd:3``, ``zstd:shuffle=2``, ``zstd:3:shuffle=0``: one key."""
    if not isinstance(value, str):
        raise ValueError(f"expected a codec such as none, zstd or zstd:3, got {value!r}")
    name, *parts = [p.strip() for p in value.strip().split(":")]
    if name not in CODECS:
        raise ValueError(f"expected one of {', '.join(map(repr, CODECS))}, got {name!r}")
    level: int | None = None
    shuffle: str | int | None = None
    for part in parts:
        if part.startswith("shuffle=") and shuffle is None:
            width = part.removeprefix("shuffle=")
            shuffle = "auto" if width == "auto" else int(width) if width.isdigit() else -1
            if shuffle not in ("auto", *_SHUFFLE_SETTINGS):
                raise ValueError(f"shuffle= takes auto or an element size "
                                 f"{', '.join(map(str, _SHUFFLE_SETTINGS))} (0 and 1 turn "
                                 f"shuffling off), got {width!r}")
        elif part.lstrip("-").isdigit() and level is None and shuffle is None:
            level = int(part)
            if level not in ZSTD_LEVELS:
                raise ValueError(f"zstd levels run from {ZSTD_LEVELS[0]} to {ZSTD_LEVELS[-1]}, "
                                 f"got {level}")
        else:
            raise ValueError(f"expected {name}[:LEVEL][:shuffle=WIDTH], got {value!r}")
    return Codec(name, 1 if level is None else level, "auto" if shuffle is None else shuffle)


def _with_level(level: int, codec: Any) -> str:
    """The old ``codec_level: N`` folded into ``codec``."""
    if level not in ZSTD_LEVELS:
        raise ValueError(f"zstd levels run from {ZSTD_LEVELS[0]} to {ZSTD_LEVELS[-1]}, "
                         f"got {level}")
    text = "none" if codec is None else str(codec)
    if any(p.strip().lstrip("-").isdigit() for p in text.split(":")[1:]):
        raise ValueError(f"the level is given twice: write it once, in codec: {text}")
    name, _, rest = text.partition(":")
    return f"{name}:{level}" + (f":{rest}" if rest else "")


def _with_shuffle(shuffle: Any, codec: Any) -> str:
    """The old ``shuffle: N`` (``auto`` or an element width) folded into ``codec``."""
    if isinstance(shuffle, str) and shuffle.strip().isdigit():
        shuffle = int(shuffle)  # from ${VAR}
    if not (shuffle == "auto" or (type(shuffle) is int and shuffle in _SHUFFLE_SETTINGS)):
        *most, last = _SHUFFLE_SETTINGS
        raise ValueError(f"expected 'auto' or an element size {', '.join(map(str, most))} or "
                         f"{last} (0 and 1 turn shuffling off), got {describe_value(shuffle)}")
    text = "none" if codec is None else str(codec)
    if "shuffle=" in text:
        raise ValueError(f"the shuffle is given twice: write it once, in codec: {text}")
    return f"{text}:shuffle={shuffle}"


def _within(low: float, high: float, what: str) -> Any:
    def check(value: float) -> None:
        if not low <= value <= high:
            raise ValueError(f"expected {what}, got {value}")
    return check


def _positive(what: str) -> Any:
    def check(value: float) -> None:
        if value <= 0:
            raise ValueError(f"must be {what} than 0s" if what else f"must be above 0, got {value}")
    return check


def _not_blank(value: str) -> None:
    if not value.strip():
        raise ValueError("expected an address such as 127.0.0.1 or 0.0.0.0 (every "
                         "interface), got an empty string")


def _recompute(value: Any) -> Any:
    def fail(reason: str) -> Any:
        raise ValueError(reason)
    return parse_recompute(value, fail)


#: Keys every tier entry takes, whatever its backend (its options are the backend's).
TIER_OPTIONS: Mapping[str, Option] = {
    "name": Option("str", "the tier's name: letters, digits, '_', '.' and '-'", required=True),
    "backend": Option("str", "the backend that stores this tier (kvtier backends)",
                      required=True),
    "codec": Option(
        "str", "what this tier stores: none, or zstd with an optional :LEVEL (-7 to 22, "
        "default 1) and :shuffle=WIDTH (byte-shuffle before zstd: auto, from the namespace's "
        "dtype, or 0, 1, 2, 4, 8)", default="none", parse=parse_codec,
        was=(Renamed("codec_level", "int", _with_level), Renamed("shuffle", None, _with_shuffle))),
    "write": Option("str", "how this tier is written from the tier above: through (at once) "
                    "or back (when the tier above evicts)", default="through",
                    choices=("through", "back")),
    "promote": Option("bool", "copy a block found here into the tiers above", default=True),
    "verify": Option("bool", "check each block's checksum when it is read", default=True),
    "workers": Option("int", "threads for this tier's asynchronous writes", default=2,
                      check=_within(1, 64, "1 to 64 threads")),
    "admit": Option("int", "calls that must have named a key before traffic writes its "
                    "block here (1: every block)", default=1,
                    check=_within(1, 2**31, "1 (write every block) or more calls")),
    "admit_sample": Option("float", "besides, the share of prompt lineages written here at "
                           "first sight (with admit: 2 or more)", default=0.0,
                           check=_within(0.0, 1.0, "a share from 0 to 1")),
    "required": Option("bool", "the chain fails to open where this tier cannot; otherwise "
                       "the tier starts failed and is retried", default=False),
    "encrypt": Option("str", "seal this tier's blocks with AES-256-GCM under the master keys "
                      "in file:PATH or env:VAR, the writing key first, older ones after commas "
                      "(docs/tenants.md); none: plaintext", default="none",
                      check=check_key_sources),
}

#: The chain's own keys, by key path.
CHAIN_OPTIONS: Mapping[str, Option] = {
    "load_policy": Option("str", "cost: load a hit only where that beats recomputing it; "
                          "always: load every hit", default="cost", choices=LOAD_POLICIES),
    "recompute": Option("str", "the time to recompute a prompt: 0.5ms/token, or by prompt "
                        "length {512 tokens: 40ms, 2048 tokens: 180ms}", parse=_recompute),
    "load_margin": Option("float", "load a prefix where loading takes at most this share of "
                          "recomputing it", default=0.8, check=_positive("")),
    "cost_half_life": Option("duration", "how fast a tier's measured cost forgets the past",
                             default="2s", check=_positive("longer")),
    "record.path": Option("str", "append a trace of the chain's traffic (key hashes only) "
                          "to this file, for kvtier plan"),
    "record.sample": Option("float", "the share of calls the trace keeps (0 < sample <= 1)",
                            check=_within(1e-300, 1.0, "a share above 0 and at most 1")),
    "metrics.prometheus_port": Option("int", "serve Prometheus metrics on this port",
                                      check=_within(1, 65535, "a port 1..65535")),
    "metrics.prometheus_host": Option("str", "the address the metrics endpoint listens on",
                                      default="127.0.0.1", check=_not_blank),
    "metrics.log_interval": Option("duration", "log the chain's stats this often",
                                   check=_positive("longer")),
    "metrics.tenants_top": Option("int", "tenants with Prometheus series of their own, those "
                                  "holding the most bytes; the rest are summed as 'other'",
                                  default=20, check=_within(0, 10_000, "0 to 10000 tenants")),
    "metrics.tenants_interval": Option("duration", "how often the tenants with series of "
                                       "their own are ranked again", default="60s",
                                       check=_positive("longer")),
}
