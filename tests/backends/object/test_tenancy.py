"""The ``object`` tier's tenant bound and expiry, against a real S3 server (SeaweedFS).

The bound of a tenant's namespace is min(capacity, its quota); a block over it
is refused and counted.  ``expire`` (once ``max_age``) makes an object a miss
once it has expired.  Every claim is read back from the bucket, byte for byte.
"""

from __future__ import annotations

import time

import pytest
from object_blocks import Blocks, Opener, blob

from kvtier.plugins.options import DeprecatedKey
from kvtier.spec import ConfigError

NS_ACME = "a" * 32
NS_OTHER = "b" * 32
BLOCKS = Blocks(b"ten")
key, exact = BLOCKS.key, BLOCKS.exact


def test_a_tenant_is_bounded_by_its_quota_and_another_by_the_capacity(
        open_object: Opener) -> None:
    rules = {"acme": {"quota": 3000}}
    acme = open_object(NS_ACME, capacity=10_000, tenants=rules, tenant="acme")
    other = open_object(NS_OTHER, capacity=10_000, tenants=rules, tenant="other")
    assert acme.capabilities().capacity == 3000 and other.capabilities().capacity == 10_000
    for i in range(5):
        assert acme.put([key(i)], [blob(i)], []) == [True]
        assert other.put([key(i)], [blob(i)], []) == [True]
    # acme's oldest two deleted for its quota; the other tenant keeps all five
    assert exact(acme, list(range(5))) == [2, 3, 4]
    assert exact(other, list(range(5))) == [0, 1, 2, 3, 4]
    assert acme.put([key(9)], [blob(9, 4000)], []) == [False]  # over the quota: refused
    stats = dict(acme.stats())
    assert (stats["used_bytes"], stats["blocks"], stats["tenant_bytes.acme"]) == (3000, 3, 3000)
    assert (stats["tenant_evicted.acme"], stats["tenant_refused.acme"]) == (2, 1)
    assert dict(other.stats())["tenant_evicted.other"] == 0


def test_an_expired_object_is_a_miss_and_a_new_put_stores_it_again(open_object: Opener) -> None:
    store = open_object(NS_ACME, expire="2s")
    assert store.put([key(1), key(2)], [blob(1), blob(2)], []) == [True, True]
    assert exact(store, [1, 2]) == [1, 2]  # unexpired: exact bytes
    time.sleep(3.2)  # last-modified times have a resolution of one second
    assert store.get([key(1)]) == [None] and store.lookup([key(2)]) == [False]
    stats = dict(store.stats())
    assert stats["expired"] == stats["tenant_expired.default"] == 1  # the get's; lookup: no
    assert store.put([key(1)], [blob(1)], []) == [True]
    assert exact(store, [1, 2]) == [1]


def test_max_age_is_the_old_name_of_expire(open_object: Opener) -> None:
    with pytest.warns(DeprecatedKey, match="'max_age' is deprecated.*write 'expire'"):
        store = open_object(NS_ACME, max_age="2s")
    store.put([key(1)], [blob(1)], [])
    time.sleep(3.2)
    assert store.get([key(1)]) == [None]


def test_expire_unused_is_refused_saying_why(open_object: Opener) -> None:
    with pytest.raises(ConfigError, match="no time of a block's last read"):
        open_object(NS_ACME, expire={"unused": "1h"})
