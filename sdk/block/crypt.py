"""Encryption at rest: block payloads sealed with AES-256-GCM.

A tier with ``encrypt`` set seals every block it writes
(:func:`~kvtier.block.framing.encode_parts`) with the AES-GCM of the
``cryptography`` package, never crypto of our own:

* each tenant has its own key, derived with HKDF-SHA256 from a master key
  and the tenant's name, so one tenant's key opens nothing of another's;
* a master key is read from a file or an environment variable
  (:func:`read_master`), never from the configuration itself;
* each write draws a random 96-bit nonce (blocks are rewritten under the
  same key and name, so a nonce derived from them would repeat);
* the block's header, with the namespace, key, tenant, key id and nonce,
  is the cipher's associated data: a block moved to another namespace,
  tenant, key or name fails its tag, and the tag stands in for the xxh3
  checksum (one integrity pass, not two);
* the header names the key id (the first 8 bytes of an HKDF of the master
  key), so after a rotation blocks written under an older master key, still
  listed, stay readable while new writes use the new one.

A block that fails to open is a :class:`~kvtier.spec.CorruptBlockError`,
which tiers answer as a miss counted in ``corrupt``.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from kvtier.spec import BytesLike, ConfigError, CorruptBlockError

try:
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
except ImportError:  # the ``encrypt`` extra is not installed: no tier may encrypt
    AESGCM = None  # type: ignore[assignment,misc]

__all__ = [
    "KEY_ID_LEN", "NONCE_LEN", "TAG_LEN", "Keyring", "check_key_sources", "keyring_from",
    "read_master", "take_aligned",
]

KEY_ID_LEN = 8
NONCE_LEN = 12
TAG_LEN = 16
#: A master key has at least this many bytes (256 bits, the AES key's size).
MASTER_MIN = 32
_KEY_ID_INFO = b"kvtier key id v1"
_TENANT_INFO = b"kvtier tenant key v1\x00"


def _hkdf(master: bytes, length: int, info: bytes) -> bytes:
    derived: bytes = HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                          info=info).derive(master)
    return derived


_INLINE = ("expected file:PATH or env:VAR naming where a master key is kept; a key written "
           "in the configuration is refused (it would be in every copy of the file)")


def check_key_sources(setting: str) -> None:
    """Refuse a tier's ``encrypt`` that is not ``none`` or a list of ``file:PATH`` and
    ``env:VAR`` (a :class:`ValueError`); the keys themselves are read when the tier opens."""
    if setting.strip() in ("", "none"):
        return
    for source in (part.strip() for part in setting.split(",")):
        kind, _, where = source.partition(":")
        if source and (kind not in ("file", "env") or not where):
            raise ValueError(_INLINE)


def read_master(source: str, key: str) -> bytes:
    """The master key ``source`` names: ``file:PATH`` or ``env:VAR``, holding hex digits.

    ``key`` names the setting in a :class:`~kvtier.spec.ConfigError`.  A key
    written in the configuration itself is refused: it would be in every
    copy of the file, in version control and in ``config explain``.
    """
    kind, _, where = source.strip().partition(":")
    if kind == "file" and where:
        try:
            with open(os.path.expanduser(where), "rb") as f:
                text = f.read(4096).decode("ascii", "replace")
        except OSError as exc:
            raise ConfigError(f"cannot read the master key file {where!r}: {exc.strerror}",
                              key=key) from None
    elif kind == "env" and where:
        if where not in os.environ:
            raise ConfigError(f"the environment variable {where!r} holding the master key "
                              "is not set", key=key)
        text = os.environ[where]
    else:
        raise ConfigError(_INLINE, key=key)
    try:
        master = bytes.fromhex(text.strip())
    except ValueError:
        master = b""
    if len(master) < MASTER_MIN:
        raise ConfigError(f"the master key in {source.strip()!r} must be at least "
                          f"{2 * MASTER_MIN} hex digits (32 random bytes)", key=key)
    return master


class _Buffers:
    """Page-aligned output buffers for sealed payloads, reused once released.

    A fresh 2 MiB buffer costs the kernel 512 page faults and a zeroing
    pass each time, more than the encryption itself on a busy machine; a
    buffer comes back here when the last view of it is gone (a finalizer
    on the array that holds it), so a tier writing batch after batch seals
    into memory it already has.  Page-aligned, so a store writing with
    O_DIRECT takes it as it is.  At most :data:`_KEEP` bytes are kept.
    """

    def __init__(self) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._kept = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> memoryview:
        with self._lock:
            free = self._free.get(size)
            room = free.pop() if free else None
            if room is not None:
                self._kept -= size
        if room is None:
            room = mmap.mmap(-1, size)
        array = np.frombuffer(room, dtype=np.uint8)
        weakref.finalize(array, self._give, room, size)
        return array.data

    def _give(self, room: mmap.mmap, size: int) -> None:
        with self._lock:
            if self._kept + size <= _KEEP:
                self._free.setdefault(size, []).append(room)
                self._kept += size


_KEEP = 256 << 20
_buffers = _Buffers()


def take_aligned(size: int) -> memoryview:
    """``size`` bytes of page-aligned memory, uninitialised, reused from a pool: a sealed
    payload, or a sealed block's ciphertext read from a store, O_DIRECT taking it as it is."""
    return _buffers.take(size)


class Keyring:
    """Master keys by id: the first seals new writes, every one opens.

    Thread-safe; the AES-GCM object of each (key id, tenant) is made once.
    """

    def __init__(self, masters: Sequence[bytes]) -> None:
        if AESGCM is None:
            raise ConfigError("encryption needs the 'cryptography' package: "
                              "pip install 'kvtier[encrypt]'", key="encrypt")
        if not masters:
            raise ValueError("a keyring needs at least one master key")
        self._masters: dict[bytes, bytes] = {}
        for master in masters:
            self._masters.setdefault(_hkdf(master, KEY_ID_LEN, _KEY_ID_INFO), master)
        #: The id of the key new writes are sealed with.
        self.write_id = _hkdf(masters[0], KEY_ID_LEN, _KEY_ID_INFO)
        self._aeads: dict[tuple[bytes, bytes], AESGCM] = {}
        self._lock = threading.Lock()

    @property
    def key_ids(self) -> list[bytes]:
        """Ids of the master keys this ring opens blocks with (the writing one first)."""
        return [self.write_id, *(k for k in self._masters if k != self.write_id)]

    def _aead(self, key_id: bytes, tenant: bytes) -> AESGCM:
        """The cipher of a tenant under a master key."""
        aead = self._aeads.get((key_id, tenant))
        if aead is None:
            master = self._masters.get(key_id)
            if master is None:
                raise CorruptBlockError(f"sealed under key id {key_id.hex()}, not in the keyring")
            aead = AESGCM(_hkdf(master, 32, _TENANT_INFO + tenant))
            with self._lock:
                self._aeads[(key_id, tenant)] = aead
        return aead

    def seal(self, tenant: bytes, nonce: bytes, payload: BytesLike, aad: bytes) -> memoryview:
        """``payload`` encrypted for ``tenant`` under the writing key, tag appended."""
        view = memoryview(payload).cast("B")
        out = _buffers.take(view.nbytes + TAG_LEN)
        self._aead(self.write_id, tenant).encrypt_into(nonce, view, aad, out)
        return out

    def open_into(self, key_id: bytes, tenant: bytes, nonce: bytes, sealed: BytesLike,
                  aad: bytes, out: memoryview) -> None:
        """Decrypt ``sealed`` (ciphertext and tag) into ``out``, which is ``TAG_LEN`` shorter.

        A wrong tag (a damaged block, or one moved from another namespace,
        tenant, key or name) is a :class:`~kvtier.spec.CorruptBlockError`;
        ``out`` may then hold anything.
        """
        aead = self._aead(key_id, tenant)
        try:
            aead.decrypt_into(nonce, sealed, aad, out)
        except InvalidTag:
            raise CorruptBlockError(
                "authentication failed: damaged, or moved from another key, namespace, "
                "tenant or name") from None
        except ValueError as exc:  # lengths that do not fit
            raise CorruptBlockError(f"sealed payload: {exc}") from None

    @staticmethod
    def nonce() -> bytes:
        """A fresh random 96-bit nonce, one per write."""
        return os.urandom(NONCE_LEN)


def keyring_from(setting: str, key: str = "encrypt") -> Keyring | None:
    """The keyring a tier's ``encrypt`` setting names; ``None`` for ``none`` (plaintext).

    ``setting`` lists key sources separated by commas, the one new writes
    use first, then those of older keys whose blocks must stay readable:
    ``"file:/etc/kvtier/key-2, file:/etc/kvtier/key-1"``.
    """
    sources = [s for s in (part.strip() for part in setting.split(",")) if s]
    if sources in ([], ["none"]):
        return None
    return Keyring([read_master(source, key) for source in sources])
