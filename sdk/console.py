"""Where the command line prints: rich consoles that keep a table's rows whole in pipes.

On a terminal, rich fits a table to the terminal's width.  Written to a
pipe, a file or a log there is no width to fit, and rich would take 80
columns (or the width of whatever terminal its stdin is): cells wrap
mid-word and one row becomes a column of fragments that no tool can read.
So where the stream is not a terminal, a console here is as wide as the
widest line it is given: each row of a table is one line, each message one
line, whatever ``COLUMNS`` says (a narrower width could only break words).
"""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["PIPE_WIDTH", "console", "is_terminal"]

#: Width of a console writing to a pipe: wider than any row, so no row wraps.
PIPE_WIDTH = 1 << 16


def is_terminal(stderr: bool = False) -> bool:
    stream = sys.stderr if stderr else sys.stdout
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by a stream without one, or closed
        return False


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr) for this command, made when the command runs.

    Made per run, not at import: the stream may have been replaced since
    (click's test runner), and whether it is a terminal decides the width.
    """
    width = None if is_terminal(stderr) else PIPE_WIDTH
    return Console(stderr=stderr, highlight=False, width=width)
