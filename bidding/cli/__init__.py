"""The ``bidding`` command: run a node, explain an award, list nodes, show stats, migrate.

```
bidding worker workers/redfin.toml -A proj      # a Celery worker for node redfin
bidding explain TASK_ID -A proj                 # every bid, its score breakdown, the winner
bidding tasks --tag nightly -A proj             # the latest tasks with a tag
bidding nodes -A proj | bidding stats -A proj | bidding db upgrade -A proj
bidding monitor -A proj | bidding reset TASK_ID -A proj   # seed 002's watch of delegated work
bidding check -A proj                           # the protocol checker over the message log
bidding api -A proj --port 8000                 # the AITP HTTP API (--allow-open: beyond
                                                #   the loopback without a token)
bidding redis --port 6479                       # an embedded Redis to try it with
```

One module per family of commands (``node``, ``tasks``, ``federation``, ``serve``, ``db``,
``demo``), what they share in ``common``; the group is here, and lists them all.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

__all__ = ["main"]

#: Each command, and where it lives (``module:attribute``).
#: A command's module is imported when the command runs (or ``--help`` lists it): a node
#: worker, which runs ``bidding worker`` for as long as it lives, never holds the modules of
#: the other commands (the demo's, the API server's) in its memory.
COMMANDS: dict[str, str] = {
    "worker": "bidding.cli.node:worker",
    "explain": "bidding.cli.tasks:explain",
    "status": "bidding.cli.tasks:status",
    "reset": "bidding.cli.tasks:reset",
    "monitor": "bidding.cli.tasks:monitor",
    "submit": "bidding.cli.tasks:submit",
    "tasks": "bidding.cli.tasks:tasks",
    "nodes": "bidding.cli.federation:nodes",
    "stats": "bidding.cli.federation:stats",
    "check": "bidding.cli.federation:check",
    "prune": "bidding.cli.federation:prune",
    "api": "bidding.cli.serve:api",
    "db": "bidding.cli.db:db",
    "demo": "bidding.cli.demo:demo",
    "redis": "bidding.cli.demo:redis_server",
}


#: click's error for an unknown command (click 8.2 and later; 8.1 says it without suggestions).
_NO_SUCH_COMMAND: Any = getattr(click.exceptions, "NoSuchCommand", None)


class _LazyGroup(click.Group):
    """A group whose commands are imported by name when they are looked up (click's own
    pattern for lazily loaded subcommands)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command's name, without importing any."""
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """The command ``cmd_name`` (its module imported now), or None: click says it has no
        such command."""
        where = COMMANDS.get(cmd_name)
        if where is None:
            return None
        module, attribute = where.split(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{where} is not a click command")
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """click's, with "Did you mean ...?" among every command (click suggests from the
        commands added to the group, and this one adds none)."""
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            if _NO_SUCH_COMMAND is None or not isinstance(exc, _NO_SUCH_COMMAND):
                raise
            raise _NO_SUCH_COMMAND(exc.command_name, possibilities=list(COMMANDS),
                                   ctx=ctx) from None


@click.group(cls=_LazyGroup)
def main() -> None:
    """celery-bidding: nodes bid for tasks, the best bid wins, the task runs there."""
