"""The obstore client; one object read straight into a caller's buffers (``kvtier_get_into``).

The GET's answer names the object's size before its body is read: an object
of another size than the caller's buffers (short, long, foreign) is answered
with its size and its body is left unread, so the tier reads it whole with
``get`` and finds it damaged or of another size, a miss either way.  The body
arrives as obstore ``Bytes`` chunks, each copied once into the buffers: no
whole-object buffer is joined first, and the copy of a chunk overlaps the
network's delivery of the next (the chunk sizes are :data:`CHUNK`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import obstore
from obstore.store import S3Store

from kvtier.spec import ConfigError

from .faults import Bucket, first_line

if TYPE_CHECKING:
    from obstore.store import S3Config

__all__ = ["CHUNK", "Scatter", "check_bucket", "check_prefix", "read_into", "s3_store"]

#: Per key, the writable buffers a block is read across, in order.
Scatter = Sequence[Sequence[memoryview]]

#: Bytes obstore gathers before handing a chunk of the body to Python.
CHUNK = 1 << 20


def read_into(
    store: S3Store, path: str, scatter: Sequence[memoryview]
) -> tuple[int, datetime] | None:
    """GET ``path`` into ``scatter`` in order; its size and last-modified time, None if missing.

    The size differs from the scatter list's total where the object, or the
    body the server sent, is of another size: the buffers' content is then
    unspecified (the hook's contract).
    """
    try:
        got = obstore.get(store, path)
    except FileNotFoundError:
        return None
    size, modified = int(got.meta["size"]), got.meta["last_modified"]
    want = sum(v.nbytes for v in scatter)
    if size != want:
        return size, modified
    views = iter(scatter)
    view, at, filled = memoryview(b""), 0, 0
    for chunk in got.stream(min_chunk_size=CHUNK):
        data = memoryview(chunk)
        if filled + data.nbytes > want:  # more than announced: never past the buffers
            return filled + data.nbytes, modified
        filled += data.nbytes
        while data.nbytes:
            if at == view.nbytes:
                view, at = next(views), 0
            n = min(view.nbytes - at, data.nbytes)
            view[at : at + n] = data[:n]
            at, data = at + n, data[n:]
    return filled, modified


def check_bucket(value: Any) -> None:
    """The ``bucket`` option's check: a name, no slash, no surrounding space."""
    if not isinstance(value, str) or not value or "/" in value or value != value.strip():
        raise ValueError(f"expected a bucket name, got {value!r}")


def check_prefix(value: Any) -> None:
    """The ``prefix`` option's check: slash-separated names, none empty, ``.`` or ``..``."""
    parts = str(value).strip("/").split("/")
    if value and str(value).strip("/") and any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"expected a key prefix such as kv/cache, got {value!r}")


def s3_store(options: Mapping[str, Any], bucket: Bucket) -> S3Store:
    """The obstore client for ``options``; ConfigError if obstore rejects them."""
    endpoint = options["endpoint"]
    config: S3Config = {"region": options["region"]}
    if endpoint:
        config["endpoint"] = endpoint
    # explicit keys win; without them obstore reads AWS_* from the environment
    if options["access_key_id"]:
        config["access_key_id"] = options["access_key_id"]
    if options["secret_access_key"]:
        config["secret_access_key"] = options["secret_access_key"]
    allow_http = options["allow_http"]
    timeout = timedelta(seconds=options["request_timeout"])
    try:
        return S3Store(
            options["bucket"],
            config=config,
            client_options={
                "allow_http": bool(endpoint and endpoint.startswith("http://"))
                if allow_http is None
                else bool(allow_http),
                "timeout": timeout,
                "connect_timeout": timedelta(seconds=options["connect_timeout"]),
            },
            # object_store retries 10 times for up to 3 minutes by default;
            # a dead server must become a fault within about one request
            # timeout so that the chain skips the tier instead of hanging
            retry_config={
                "max_retries": 2,
                "retry_timeout": timeout,
                "backoff": {
                    "init_backoff": timedelta(milliseconds=50),
                    "max_backoff": timedelta(seconds=1),
                    "base": 2,
                },
            },
        )
    except Exception as exc:  # obstore checks the configuration here, without I/O
        detail = bucket.scrub(first_line(exc))
        raise ConfigError(f"{bucket.where}: {detail}") from None
