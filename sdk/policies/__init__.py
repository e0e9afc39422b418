"""Eviction policies, over keys and sizes: what a tier drops, and when.

A policy (:class:`Policy`, the protocol every one follows, documented as a
hook specification in :mod:`kvtier.policies.base`) counts bytes and orders
keys; it holds no payloads.  A tier keeps its blocks where they live (a dict
in RAM, files, objects) and asks its policy which keys to let go.  The
registry (:mod:`kvtier.policies.registry`) names every policy once and
builds one by name (:func:`new_policy`); a backend declares which of them it
offers with :func:`supported`.  One module per policy: :mod:`.lru`,
:mod:`.arc`, :mod:`.s3fifo` and :mod:`.adaptive` (which follows whichever of
the other three hits most).  Beside them are the miniature simulations of
online sizing (:mod:`.sizing`), the chain's admission sketch to the tiers
below the first (:mod:`.admission`), and :class:`Partitioned`
(:mod:`.partitions`), several partitions with quotas in one capacity, each
with a policy of its own, the tenants' rules of a tier (:mod:`.tenancy`:
quotas, weights, retention budgets, expiry, and the fair shares they give),
and the victims a tier spares because they are kept (:mod:`.sparing`).

The host tier, the fs and object tiers (and the fs pool's SQL S3-FIFO,
checked against :class:`S3Fifo`), ``kvtier plan``, vLLM's ``CachePolicy``
classes and third-party backends all use these objects.

May import :mod:`kvtier.spec` (the sizing option's declaration) and
:mod:`kvtier.plugins` (sizes and durations of the ``tenants`` and ``expire``
options, :mod:`.tenancy`); nothing else of kvtier.  Backends, the chain, plan and contrib import it.
"""

from __future__ import annotations

from .adaptive import Adaptive
from .arc import Arc
from .base import Accounting, Policy
from .lru import Lru
from .partitions import Partitioned
from .registry import NAMES, POLICIES, new_policy, supported
from .s3fifo import S3Fifo

__all__ = ["NAMES", "POLICIES", "Accounting", "Adaptive", "Arc", "Lru", "Partitioned", "Policy",
           "S3Fifo", "new_policy", "supported"]
