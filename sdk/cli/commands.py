"""Commands that other packages add to ``kvtier``: the ``kvtier.commands`` entry-point group.

An integration (the engines' in :mod:`kvtier.contrib`, or a third-party
distribution) declares its click commands in its ``pyproject.toml``::

    [project.entry-points."kvtier.commands"]
    vllm-args = "kvtier.contrib.vllm.args:vllm_args_command"

so the command line never imports an integration: the group lists the
names without loading anything, and loads a command only when it is run or
its help is shown.  A command that cannot be loaded (a broken install, a
missing dependency, an object that is not a click command) costs one warning
line on stderr, never the rest of the command line.  A built-in command's
name wins over an entry point's.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import click

__all__ = ["GROUP", "PluginGroup"]

#: The entry-point group integrations register their commands in.
GROUP = "kvtier.commands"


class PluginGroup(click.Group):
    """A click group that adds the commands of the ``kvtier.commands`` entry points."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._loaded: dict[str, click.Command | None] = {}

    def _entry_points(self) -> dict[str, EntryPoint]:
        found: dict[str, EntryPoint] = {}
        for ep in entry_points(group=GROUP):
            found.setdefault(ep.name, ep)  # the first of a name, as for backends
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._entry_points()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        built_in = super().get_command(ctx, cmd_name)
        if built_in is not None:
            return built_in
        if cmd_name not in self._loaded:
            ep = self._entry_points().get(cmd_name)
            self._loaded[cmd_name] = None if ep is None else _load(ep)
        return self._loaded[cmd_name]


def _load(ep: EntryPoint) -> click.Command | None:
    dist = getattr(ep, "dist", None)
    where = ep.value + (f" ({dist.name})" if dist is not None else "")
    try:
        command = ep.load()
    except Exception as exc:  # a plugin's failure is one line, not the whole command line's
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        click.echo(f"kvtier: warning: command {ep.name!r} from {where} not loaded: {reason}",
                   err=True)
        return None
    if not isinstance(command, click.Command):
        click.echo(f"kvtier: warning: command {ep.name!r} from {where} not loaded: "
                   f"{type(command).__name__} is not a click command", err=True)
        return None
    return command
