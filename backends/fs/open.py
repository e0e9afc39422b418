"""Which store an ``fs`` tier's URL gets: fsspec resolves it, a local directory gets
:class:`~kvtier.backends.fs.local.LocalStore`, anything else
:class:`~kvtier.backends.fs.remote.RemoteStore`.

:func:`check_url` is the ``url`` option's check: what can be told of a URL
without opening it (an unknown protocol, a missing fsspec package, ``~``, a
relative or file path), so that ``kvtier config validate`` refuses what
opening would refuse.
"""

from __future__ import annotations

import importlib.util
import os
import re
from typing import Any

from kvtier.spec import ConfigError

from .layout import Store
from .local import LocalStore
from .remote import RemoteStore

__all__ = ["check_url", "open_store", "redact"]

_USERINFO_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@]*@")
_LOCAL = (None, "file", "local")


def redact(url: str) -> str:
    """The URL without any ``user:password@`` part, for messages."""
    return _USERINFO_RE.sub(r"\1***@", url)


def check_url(url: str) -> None:
    """Raise ``ValueError`` for a URL that opening would refuse, found without I/O.

    A local path is looked at with one ``stat``: an existing file is no root.
    """
    import fsspec.core
    from fsspec.registry import known_implementations, registry

    if not url.strip():
        raise ValueError("expected a URL such as file:///var/cache/kv or s3://bucket/prefix")
    parts = url.split("::")  # fsspec's chained URLs: simplecache::s3://...
    for part in parts:
        protocol = fsspec.core.split_protocol(part)[0]
        if protocol in _LOCAL or protocol in registry:
            continue
        known = known_implementations.get(protocol)
        if known is None:
            raise ValueError(f"{redact(url)}: unknown protocol {protocol!r} "
                             "(fsspec knows none by that name)")
        package = known["class"].split(".", 1)[0]
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"{redact(url)}: {known.get('err') or f'install {package}'}")
    protocol, path = fsspec.core.split_protocol(url)
    if len(parts) > 1 or protocol not in _LOCAL:
        return
    if path.startswith("~"):
        raise ValueError("'~' is not expanded: give an absolute path, or ${HOME}/...")
    if not path.startswith("/"):
        # a cache that moves with the working directory is a bug waiting to happen
        raise ValueError(f"a local path must be absolute, got {path!r}")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{path} is a file, not a directory")


def open_store(url: str, storage_options: dict[str, Any], namespace: str, shown: str,
               create: bool = True) -> Store:
    """The store for ``url``; ``shown`` is the URL as messages may print it.

    Without ``create``, a local root directory that does not exist is a
    :class:`~kvtier.spec.ConfigError` and nothing is made.
    """
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
    top = root.rstrip("/") or "/"
    if not create and not os.path.isdir(top):
        raise ConfigError(f"{shown}: the directory {top} does not exist (create: false, so "
                          "it is not made)", key="url")
    return LocalStore(nsroot)
