"""The ``kvtier`` command line.

Builds on everything else; nothing imports it.  Commands with heavy imports
(pytest, vLLM) load them only when run.
"""

from __future__ import annotations

from kvtier.cli.main import cli, main

__all__ = ["cli", "main"]
