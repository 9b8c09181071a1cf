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

import click

from bidding.cli.db import db
from bidding.cli.demo import demo, redis_server
from bidding.cli.federation import check, nodes, prune, stats
from bidding.cli.node import worker
from bidding.cli.serve import api
from bidding.cli.tasks import explain, monitor, reset, status, submit, tasks

__all__ = ["main"]


@click.group()
def main() -> None:
    """celery-bidding: nodes bid for tasks, the best bid wins, the task runs there."""


for _command in (worker, explain, status, reset, monitor, submit, tasks, nodes, stats, check, prune,
                 api, db, demo, redis_server):
    main.add_command(_command)
del _command
