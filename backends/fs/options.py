"""The ``fs`` backend's options: what a tier entry may say, and their checks."""

from __future__ import annotations

from collections.abc import Mapping

from kvtier.policies.sizing import SIZING_OPTION
from kvtier.policies.tenancy import EXPIRE_OPTION, TENANT_OPTION, TENANTS_OPTION
from kvtier.spec import Option
from kvtier.spec.shared import CAPACITY, CONCURRENCY, but, eviction

from .open import check_url
from .pool import POOL_OPTIONS
from .pool_policy import POLICIES

__all__ = ["OPTIONS"]


# The checks see values already parsed as the option's type (an int, a str).
def _check_capacity(value: int) -> None:
    if value < 1:  # 0 would refuse every put, silently
        raise ValueError(f"expected at least 1 byte, got {value}; leave it unset for no bound")


def _check_threads(value: int) -> None:
    if value < 1:
        raise ValueError(f"expected a whole number of threads >= 1, got {value!r}")


OPTIONS: Mapping[str, Option] = {
    "url": Option(
        "str",
        "where blocks live: file:///abs/path, /abs/path, memory://name, or any "
        "fsspec URL such as s3://bucket/prefix",
        required=True,
        check=check_url,
    ),
    "capacity": CAPACITY,
    "eviction": eviction(POLICIES),
    "create": Option(
        "bool",
        "make a local root directory that does not exist; false: it must exist already (a "
        "mount point; kvtier inspect, scrub and purge open with false, so a mistyped path "
        "is an error and nothing is created)",
        default=True,
        internal=True,
    ),
    "read_only": Option(
        "bool",
        "open without writing anything under the root (no directory, temp file, index "
        "file or pool index; a read-only mount is fine): puts answer false and nothing is "
        "evicted. kvtier inspect, and kvtier scrub without --repair, open with true",
        default=False,
    ),
    "fsync": Option(
        "bool",
        "fsync each block file and its directory on publish (survives power loss, slower)",
        default=False,
    ),
    "io_threads": but(CONCURRENCY, default=4),
    "direct_io": Option(
        "bool",
        "write blocks of 256 KiB and more with O_DIRECT on local paths, and read those "
        "not in the page cache with it: less CPU per block, cold reads come faster and "
        "KV is not cached a second time; blocks still cached are read from the cache; "
        "filesystems that refuse O_DIRECT (tmpfs) go through the page cache",
        default=True,
    ),
    "storage_options": Option(
        "map",
        "passed to fsspec as keyword arguments (endpoint, credentials, ...)",
        default={},
        secret=True,
    ),
    "sizing_sample": SIZING_OPTION,
    # quotas and fair share: held across processes by the shared pool (.pool_tenants), per
    # process elsewhere (min(capacity, quota), .room)
    "tenants": TENANTS_OPTION,
    "tenant": TENANT_OPTION,
    "expire": EXPIRE_OPTION,  # blocks expire after their write, or unused (.expiry)
    **POOL_OPTIONS,
}
