"""Integrations of kvtier with inference engines.

May import nothing of kvtier; each integration's package says what it may
import.  Their commands reach ``kvtier`` through the ``kvtier.commands``
entry points (pyproject.toml), so the command line imports none of them.
"""
