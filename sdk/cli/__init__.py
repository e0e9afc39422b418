"""The ``kvtier`` command line.

Builds on everything else; nothing imports it.  Commands with heavy imports
(pytest, vLLM) load them only when run.

May import :mod:`kvtier`, :mod:`kvtier.tierbench`, :mod:`kvtier.block`,
:mod:`kvtier.chain`, :mod:`kvtier.config`, :mod:`kvtier.console`,
:mod:`kvtier.observe`, :mod:`kvtier.peer`, :mod:`kvtier.plan`,
:mod:`kvtier.plugins`, :mod:`kvtier.spec` and :mod:`kvtier.testing`: not the
integrations, whose commands (``vllm-args``, ``calibrate``, ``sglang-args``,
``lmcache-args``) come through the ``kvtier.commands`` entry points
(:mod:`.commands`), loaded when run.
"""

from __future__ import annotations

from kvtier.cli.main import cli, main

__all__ = ["cli", "main"]
