"""Small value types the hooks exchange: declared capabilities and options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

__all__ = ["Capabilities", "CapacityScope", "Option", "OptionType", "Renamed", "ScanEntry"]

#: What one capacity bounds; see :attr:`Capabilities.capacity_scope`.
CapacityScope = Literal["namespace", "shard", "pool", "process"]

OptionType = Literal["str", "int", "float", "bool", "size", "size_or_percent", "duration",
                     "list", "map"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend instance declares about itself after ``kvtier_open``.

    The chain and the conformance kit trust these declarations; the kit runs
    only the test groups a backend declares (and checks that it keeps them).
    """

    #: Blocks survive ``close()`` and a reopen with the same options, and a
    #: block whose put answered ``True`` survives the writer being killed
    #: (``SIGKILL``) right after; see ``kvtier_close`` in the hookspecs.
    persistent: bool = False
    #: Several instances (processes, nodes) opening the same options and
    #: namespace see one store: a block one stores is a hit for another's
    #: get (its lookup may lag by a short-lived cache), an evict by one is
    #: a miss for another's get, and any capacity is enforced for all of
    #: them together.  The kit's ``shared`` group checks the first two with
    #: two instances in one process.  kvtier treats a tier that is
    #: persistent or shared as outside this process.  A tier that is
    #: neither lives in process memory: kvtier reads it with ``kvtier_get``
    #: and copies each block into the caller's buffer itself, taking the
    #: checksum as it copies, so its ``kvtier_get`` should hand out the
    #: bytes it holds rather than a copy (``kvtier_get_into`` serves the
    #: others, and these too where kvtier's C extension is not built).
    shared: bool = False
    #: Hooks may be called from several threads at once.
    thread_safe: bool = True
    #: Largest block accepted, in bytes; ``None`` for no limit of its own.
    max_block_size: int | None = None
    #: Byte capacity the backend enforces, per namespace (one instance serves
    #: one namespace), ``None`` for unbounded.
    capacity: int | None = None
    #: Blocks that capacity pushes out are reported through ``evicted`` in
    #: ``kvtier_put`` (required for a tier below to use ``write: back``).
    reports_evictions: bool = False
    #: The backend stores only blocks framed by a kvtier chain (header of
    #: the namespace it was opened with, checksum) and answers ``False`` to
    #: a put of anything else, such as the ``peer`` backend, whose server
    #: checks every header.  The chain always frames what it puts; the kit
    #: checks the refusal and the acceptance of frames (group ``framed``)
    #: and certifies the rest of the contract through a chain of one tier.
    #: Answered for the default options before ``kvtier_open`` as well.
    framed_only: bool = False
    #: Free-form facts for people, shown by ``kvtier backends`` as
    #: ``key=value``; neither kvtier nor its kit acts on them.  Keep keys
    #: short and values plain (str, int, float, bool): ``io_threads``,
    #: ``store``.  What the kit reads is a field of its own (``eviction``,
    #: ``capacity_scope``); for one release the kit still reads those two
    #: from here when the fields are left at their defaults, and warns.
    extra: dict[str, Any] = field(default_factory=dict)
    #: How the capacity chooses what it pushes out, by the policy's name:
    #: ``"lru"`` (the least recently used first; ``kvtier_get``,
    #: ``kvtier_get_into`` and a put of a stored key are uses, a lookup and
    #: a scan are not), ``"arc"``, ``"s3fifo"``, ``"adaptive"``, ``"fifo"``
    #: (the oldest put first, whatever was read since), or a name of the
    #: backend's own; ``None`` where it does not say, or evicts nothing.
    #: With a capacity, ``"lru"`` and a ``capacity_scope`` of
    #: ``"namespace"`` or ``"process"``, the kit's ``recency`` group checks
    #: what is a use.  Shown by ``kvtier backends``.
    eviction: str | None = None
    #: What one capacity bounds.  ``"namespace"``: the blocks of the
    #: namespace the instance was opened with, for every instance of the
    #: store together (the contract's rule, see ``shared``).  ``"shard"``:
    #: each shard of a store spread over several holds its share, and
    #: evicts its own oldest, not the namespace's (Redis Cluster).
    #: ``"pool"``: every namespace of the store together (an ``fs`` pool).
    #: ``"process"``: each process its own, not counting the blocks other
    #: processes store (``fs`` on a remote URL): the kit's ``shared`` group
    #: then skips its capacity check.  Meaningless without a capacity.
    capacity_scope: CapacityScope = "namespace"


@dataclass(frozen=True)
class Option:
    """One option a backend accepts in its YAML tier entry.

    ``type`` drives validation and parsing; the backend's ``kvtier_open``
    receives the parsed value:

    ============  ==========================================  ===============
    type          the YAML value                              the backend gets
    ============  ==========================================  ===============
    ``str``       a string                                    ``str``
    ``int``       an integer (or ``${VAR}`` of digits)         ``int``
    ``float``     a number                                    ``float``
    ``bool``      true/false (``${VAR}``: yes/no/on/off/1/0)  ``bool``
    ``size``      ``8GiB``, ``500MB``, ``4096``                ``int`` bytes
    ``duration``  ``250ms``, ``2s``, ``1m``, or seconds        ``float`` seconds
    ``list``      a list                                      ``list``
    ``map``       a mapping                                   ``dict``
    ============  ==========================================  ===============

    ``size_or_percent`` takes a size as ``size`` does, or a percent such as
    ``10%``: the backend gets ``int`` bytes, or the percent as a ``str``.

    ``help`` is one line shown by ``kvtier backends`` and in errors.
    ``default`` fills an unset option, converted by ``type`` but not passed
    to ``choices`` or ``check`` (``None``: the backend gets ``None``).
    ``required`` makes an unset option an error.
    ``choices`` lists the allowed parsed values.  ``check`` is called with
    the parsed value after ``choices`` and may raise ``ValueError`` with a
    short reason, which the error names with file, line and key.  ``secret``
    hides the value everywhere kvtier prints it (errors, ``config explain``,
    conformance reports show ``***``).
    """

    type: OptionType
    help: str
    default: Any = None
    required: bool = False
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], None] | None = None
    #: Never printed in full (credentials, secrets).
    secret: bool = False
    #: The key a file or caller writes, where it is not the name the option
    #: is declared under: that name (the one the backend's code reads) then
    #: still works for a release, with a warning naming this key.  The
    #: options several backends take are declared once, in
    #: :mod:`kvtier.spec.shared`, under the key they share.
    key: str | None = None
    #: Older keys of this option, still read for a release with a warning
    #: naming the new key.
    was: tuple[Renamed, ...] = ()
    #: Set by kvtier's own commands (``kvtier inspect`` opens ``fs`` with
    #: ``create: false``) or derived: no setting of a file, which gets a
    #: warning where it sets one; a caller may pass it.
    internal: bool = False
    #: Parses a value ``type`` cannot describe (a load policy's
    #: ``recompute``): returns the parsed value or raises ``ValueError`` with a
    #: short reason.  ``type`` then only names it.
    parse: Callable[[Any], Any] | None = None

    @property
    def deprecated(self) -> tuple[str, ...]:
        """The old keys of this option, as :attr:`was` names them."""
        return tuple(r.name for r in self.was)


@dataclass(frozen=True)
class Renamed:
    """An option's old key, read for one more release with a warning naming the new one.

    ``merge(old, new)`` gives the new key's value from the old key's (parsed
    as ``type``, by default the option's) and the new key's as written
    (``None`` where unset); it raises ``ValueError`` where they contradict.
    Without ``merge`` the old value is the new key's, and giving both is an
    error.
    """

    name: str
    type: OptionType | None = None
    merge: Callable[[Any, Any], Any] | None = None


class ScanEntry(NamedTuple):
    """One block listed by ``kvtier_scan``; a plain 4-tuple will do as well."""

    #: The block's namespace, 32 lowercase hex digits.
    namespace: str
    #: The block's key.
    key: bytes
    #: Stored bytes of the block (what ``kvtier_get`` returns, header included).
    size: int
    #: When it was stored, seconds since the epoch; ``None`` if the store does not know.
    mtime: float | None = None
