"""Celery's ``worker`` command, run without Celery's umbrella ``celery`` command.

``app.worker_main(argv)`` goes through ``celery.bin.celery``, which imports every ``celery``
subcommand and every plug-in of the ``celery.commands`` entry point when it is imported: Flower
(Tornado, prometheus_client), click-repl (prompt_toolkit) and more of Pygments. A worker uses
none of them, and they stayed in the node's main process for its whole life: about 11 MB of it
(bench/idle.py). Here the ``worker`` command runs alone, given what the umbrella command would
have given it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

from celery import Celery

#: The umbrella command's options read from the environment (``celery --help``), and what it
#: sets from them before a subcommand runs; ``app.worker_main`` honoured them, so this does too.
_UMBRELLA_ENV = {
    "BROKER_URL": "CELERY_BROKER_URL",
    "RESULT_BACKEND": "CELERY_RESULT_BACKEND",
    "LOADER": "CELERY_LOADER",
    "CONFIG_MODULE": "CELERY_CONFIG_MODULE",
}


def run_worker(app: Celery, argv: Sequence[str], prog_name: str) -> int | None:
    """Run ``celery worker ARGV`` for ``app`` in this process, as ``app.worker_main`` would,
    its usage errors naming ``prog_name``; the worker's exit code (None when it gave none)."""
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker

    for name, celery_name in _UMBRELLA_ENV.items():
        if os.environ.get(name):
            os.environ[celery_name] = os.environ[name]
    if _flag("SKIP_CHECKS"):
        os.environ["CELERY_SKIP_CHECKS"] = "true"
    # The umbrella adds the app's own worker options (``--bidding-profile``) and preload options
    # to the shared command object; a copy keeps a second run in this process from adding them
    # twice.
    command = copy.copy(worker)
    command.params = [*worker.params, *app.user_options.get("worker", ()),
                      *app.user_options.get("preload", ())]
    context = CLIContext(app=app, no_color=_flag("NO_COLOR"), workdir=None)
    code = command.main(args=list(argv), prog_name=prog_name, obj=context,
                        standalone_mode=False)
    return code if isinstance(code, int) else None


def _flag(name: str) -> bool:
    """A flag of the umbrella command set in the environment, as Click reads it."""
    return os.environ.get(name, "").strip().lower() not in {"", "0", "false", "f", "no", "n", "off"}
