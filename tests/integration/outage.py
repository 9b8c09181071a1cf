"""A Redis server of the test's own, which it can stop and start again (a broker restart).

It keeps an append-only file, as a production broker should: what was queued when it stopped
is still there when it comes back.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import redis

from tests.conftest import require


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """``redis-server`` on a port of its own, persisted to ``directory``."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which("redis-server")
        require("redis-server", binary is not None, "the redis-server binary is not on PATH")
        self.binary = str(binary)
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The broker URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and wait until it answers."""
        self.directory.mkdir(parents=True, exist_ok=True)
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115  # the server keeps it
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
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
