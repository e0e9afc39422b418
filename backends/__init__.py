"""kvtier's built-in backends.

They are registered through the ``kvtier.backends`` entry-point group, the same
way third-party backends are, and imported only when a chain needs them.

May import :mod:`kvtier.block` (the frame's header, for batches),
:mod:`kvtier.policies` (the eviction policies and online sizing) and
:mod:`kvtier.spec`.
"""
