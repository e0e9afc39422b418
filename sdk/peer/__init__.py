"""Blocks between nodes: the wire protocol and ``kvtier serve``.

The protocol (``protocol`` and its socket I/O, ``_sockio``) imports
:mod:`kvtier.spec` only, so the ``peer`` backend can use it without a chain;
the server builds on :mod:`kvtier.chain`.

May import :mod:`kvtier.block`, :mod:`kvtier.chain`, :mod:`kvtier.config`,
:mod:`kvtier.plugins` and :mod:`kvtier.spec` (the server; the protocol
imports the spec only).
"""
