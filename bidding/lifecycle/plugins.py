"""Plug-ins: optional behaviour called at named points of an attempt's life and of a node
worker's, the way dramatiq's worker calls its middleware's ``before_*``/``after_*`` hooks and
never names its Retries middleware.

A plug-in subclasses :class:`Plugin` and overrides the hooks it needs (each is a no-op here);
``install()`` names the plug-ins an app may use, and each is on when its ``wanted`` says so for
the app's settings. The execution path, the node's loops and the readers then call the hooks
of the plug-ins that are on (``plugins_of``), and test no setting of their own:

- ``before_start(task_id)``: an execution reached its node, before its attempt begins;
- ``row_coming(task_id)``: the attempt found no row for its task: a plug-in that writes rows
  behind waits for it (True: begin again); else the message is not this store's;
- ``after_end(task_id, task)``: the attempt ended its task (SUCCESS or FAILED);
- ``before_read(task_id)``: a reader (``explain``) is about to show the task;
- ``loops(sweep_every)``: background loops a node worker runs beside its sweeper's.

Built in: the write-behind journal (``auction.writebehind.plugin``) and the advancement of task
graphs (``graphs.plugin``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery

from bidding.config import Settings
from bidding.context import Context

_KINDS = "_bidding_plugin_kinds"
_MADE = "_bidding_plugins"


@dataclass(frozen=True)
class Loop:
    """A background loop a plug-in asks node workers to run."""

    name: str
    #: Seconds between two calls (asked before each wait when a function).
    interval: float | Callable[[], float]
    run: Callable[[], object]
    #: Whether it sweeps the whole federation (one node runs it: the sweeper's lease holder,
    #: ``lifecycle.lease``) rather than work of this node's own.
    federation_wide: bool = False
    #: Whether it is only a fallback for work done elsewhere: while it finds nothing, a
    #: federation-wide loop then slows down further than the sweep's phases
    #: (``sweeper.FALLBACK_IDLE_INTERVAL``).
    fallback_only: bool = False


class Plugin:
    """Optional behaviour (see the module); every hook is a no-op here."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app

    @classmethod
    def wanted(cls, settings: Settings) -> bool:
        """Whether the plug-in is on with ``settings`` (always, unless a subclass says)."""
        return True

    def before_start(self, task_id: str) -> None:
        """An execution of ``task_id`` reached its node; its attempt begins next."""

    def row_coming(self, task_id: str) -> bool:
        """The attempt found no row for ``task_id``: True when this plug-in waited for one
        it writes behind, so that the attempt begins again."""
        return False

    def after_end(self, task_id: str, task: Any) -> None:
        """The attempt ran by ``task`` (the Celery task) ended ``task_id``."""

    def before_read(self, task_id: str) -> None:
        """A reader is about to show ``task_id``."""

    def loops(self, sweep_every: Callable[[], float]) -> Sequence[Loop]:
        """Background loops a node worker runs (``sweep_every``: its sweeper's interval now,
        for a loop that sweeps with it)."""
        return ()


def use(app: Celery, *kinds: type[Plugin]) -> None:
    """Let ``app`` use the plug-ins ``kinds`` (each on when its ``wanted`` says so)."""
    known: list[type[Plugin]] = getattr(app, _KINDS, [])
    setattr(app, _KINDS, [*known, *(k for k in kinds if k not in known)])


def plugins_of(ctx: Context) -> Sequence[Plugin]:
    """The plug-ins on for ``app`` with ``settings``, made once per settings object."""
    made: tuple[Settings, list[Plugin]] | None = getattr(ctx.app, _MADE, None)
    if made is not None and made[0] is ctx.settings:
        return made[1]
    plugins = [kind(ctx.settings, ctx.app) for kind in getattr(ctx.app, _KINDS, [])
               if kind.wanted(ctx.settings)]
    setattr(ctx.app, _MADE, (ctx.settings, plugins))
    return plugins
