"""What the per-tenant figures tests of a shared ``fs`` pool check against: the framed
size of a tenant's block (the block format, apart from the backend), and a free port
for the Prometheus endpoint."""

from __future__ import annotations

import socket

from kvtier.block import framing
from kvtier.block.framing import Codec
from kvtier.block.namespace import Namespace

MODEL = Namespace(model="llama-test")


def framed(tenant: str, key: bytes, payload: bytes) -> int:
    ns = MODEL.for_tenant(tenant)
    return len(framing.encode(ns.fingerprint, key, payload, Codec(tenant=tenant.encode())))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
