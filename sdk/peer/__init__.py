"""Blocks between nodes: the wire protocol and ``kvtier serve``.

The protocol (``protocol`` and its socket I/O, ``_sockio``) imports
:mod:`kvtier.spec` only, so the ``peer`` backend can use it without a chain;
the server builds on :mod:`kvtier.chain`.
"""
