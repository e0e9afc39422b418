"""Blocks between nodes: the wire protocol and ``kvtier serve``.

The protocol imports :mod:`kvtier.spec` only, so the ``peer`` backend can use
it without a chain; the server builds on :mod:`kvtier.chain`.
"""
