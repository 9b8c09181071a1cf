"""The real-worker federation: an embedded Redis, a SQLite store, one node per ``TRUE_P`` entry."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common.log import log
from bench.common.nodes import WORKER_FLAGS, node_federation, write_profiles
from bench.common.paths import ROOT

if TYPE_CHECKING:
    from bidding.config import Settings


@contextlib.contextmanager
def running_nodes(tmp: Path) -> Iterator[Settings]:
    """Start everything in ``tmp`` and wait until every node heartbeats; yields the caller's
    settings. On exit every process started here is stopped, also on errors."""
    from bidding.nodes.embedded import EmbeddedRedis

    embedded = EmbeddedRedis(tmp / "redis")
    federation = None
    try:
        embedded.start()
        db_url = f"sqlite:///{tmp / 'store.db'}"
        env = {
            "FIFO_BROKER": embedded.url,
            "BIDDING_DATABASE_URL": db_url,
            "BIDDING_SWEEP_INTERVAL": "1.0",
            "PYTHONPATH": str(ROOT),
        }
        # Before bench.fifo_app is imported: it reads its broker from the environment.
        os.environ.update(env)
        from bench.fifo_app import TRUE_P, app
        from bidding.config import get_settings
        from bidding.store import upgrade

        settings = get_settings(app)
        upgrade(db_url)
        paths = write_profiles(tmp / "profiles", TRUE_P, skill="work", capacity=1)
        federation = node_federation("bench.fifo_app", env, tmp / "logs", ROOT, WORKER_FLAGS)
        log(f"starting {len(paths)} node workers (temp dir {tmp})")
        federation.start(paths)
        federation.wait_live(settings, timeout=90)
        time.sleep(1.0)
        yield settings
    finally:
        if federation is not None:
            federation.stop(timeout=30)
        embedded.stop()
