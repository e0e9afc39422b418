"""Which store an ``fs`` tier's URL gets: fsspec resolves it, a local directory gets
:class:`~kvtier.backends.fs.local.LocalStore`, anything else
:class:`~kvtier.backends.fs.remote.RemoteStore`."""

from __future__ import annotations

from typing import Any

from kvtier.spec import ConfigError

from .layout import Store
from .local import LocalStore
from .remote import RemoteStore

__all__ = ["open_store"]


def open_store(url: str, storage_options: dict[str, Any], namespace: str, shown: str) -> Store:
    """The store for ``url``; ``shown`` is the URL as messages may print it."""
    import fsspec.core
    from fsspec.implementations.local import LocalFileSystem

    try:
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
    except ImportError as exc:
        raise ConfigError(
            f"{shown}: this protocol needs a package that is not installed ({exc})", key="url"
        ) from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{shown}: unsupported URL or storage_options ({exc}); other protocols "
            "need their fsspec package (s3fs, gcsfs, adlfs, ...)",
            key="url",
        ) from None
    nsroot = f"{root.rstrip('/')}/{namespace}"
    if not isinstance(fs, LocalFileSystem):
        return RemoteStore(fs, nsroot)
    if not (url.split("://", 1)[1] if "://" in url else url).startswith("/"):
        # a cache that moves with the working directory is a bug waiting to happen
        raise ConfigError(f"{shown}: a local path must be absolute", key="url")
    return LocalStore(nsroot)
