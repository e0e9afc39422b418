"""Tier chains: the read walk, promotion, demotion and write policies.

May import :mod:`kvtier.block`, :mod:`kvtier.config`, :mod:`kvtier.plugins`,
:mod:`kvtier.observe`, :mod:`kvtier.policies` (the admission sketch) and
:mod:`kvtier.spec`; nothing imports it but the surfaces built on a chain
(cli, peer server, bench, contrib).
"""

from __future__ import annotations

from kvtier.chain.chain import Chain, JobResult, open_chain
from kvtier.chain.listeners import ChainEvent, ChainListener
from kvtier.chain.tier import Tier

__all__ = ["Chain", "ChainEvent", "ChainListener", "JobResult", "Tier", "open_chain"]
