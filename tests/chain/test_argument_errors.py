"""Arguments of the wrong type raise a TypeError that names the mistake, at the call
(an asynchronous call's too), never a bare one from deep inside or a misleading one."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kvtier
from kvtier import Namespace, open_chain

NS = Namespace("mistakes-test", dtype="bfloat16", tokens_per_block=32)
RAM = {"name": "ram", "backend": "host", "capacity": "16MiB"}


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


CASES: list[tuple[str, Callable[[kvtier.Chain], Any], str]] = [
    ("put, one bytes for the keys", lambda c: c.put(b"abc", [b"1", b"2", b"3"]),
     "keys must be a sequence of bytes, got bytes"),
    ("put, a str key", lambda c: c.put(["abc"], [b"1"]),
     "keys[0] must be bytes, got str"),
    ("put, a str block", lambda c: c.put([b"k"], ["text"]),
     "blocks[0] must be a bytes-like object, got str"),
    ("put, an int block", lambda c: c.put([b"k", b"l"], [b"1", 7]),
     "blocks[1] must be a bytes-like object, got int"),
    ("put, one bytes for the blocks", lambda c: c.put([b"k", b"l", b"m"], b"abc"),
     "blocks must be a sequence of bytes-like objects, got bytes"),
    ("put, a strided array", lambda c: c.put([b"k"], [np.arange(8, dtype=np.uint8)[::2]]),
     "blocks[0] must be contiguous in memory"),
    ("put_blobs, a str block", lambda c: c.put_blobs([b"k"], ["text"]),
     "blocks[0] must be a bytes-like object, got str"),
    ("get, one bytes for the keys", lambda c: c.get(b"ab", [bytearray(1), bytearray(1)]),
     "keys must be a sequence of bytes, got bytes"),
    ("get, a str buffer", lambda c: c.get([b"k"], ["text"]),
     "out[0] must be a bytes-like object, got str"),
    ("lookup, one str for the keys", lambda c: c.lookup("abc"),
     "keys must be a sequence of bytes, got str"),
    ("lookup, None", lambda c: c.lookup(None),
     "keys must be a sequence of bytes, got NoneType"),
    ("submit_put, one bytes for the keys", lambda c: c.submit_put(b"abc", [b"1"] * 3),
     "keys must be a sequence of bytes, got bytes"),
    ("submit_put, a str block", lambda c: c.submit_put([b"k"], ["text"]),
     "blocks[0] must be a bytes-like object, got str"),
    ("submit_get, a str buffer", lambda c: c.submit_get([b"k"], ["text"]),
     "out[0] must be a bytes-like object, got str"),
    ("submit_lookup, one bytes for the keys", lambda c: c.submit_lookup(b"abc"),
     "keys must be a sequence of bytes, got bytes"),
]


@pytest.mark.parametrize(("call", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_type_raises_a_type_error_naming_the_mistake(
    call: Callable[[kvtier.Chain], Any], message: str
) -> None:
    """Asynchronous calls raise at once, not in a job reported later."""
    with open_chain({"chain": [RAM]}, namespace=NS) as chain:
        with pytest.raises(TypeError, match=exactly(message)):
            call(chain)
        assert chain.wait(timeout=30) and chain.poll() == []
        assert chain.stats()["tiers"][0]["puts"] == 0
