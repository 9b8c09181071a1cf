"""Run a federation of node workers as real processes (the embedded Redis is ``embedded``).

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
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bidding import clock
from bidding.config import Settings
from bidding.nodes.profile import load_profile
from bidding.nodes.registry import invalidate_cache, query_live_nodes


def descendants(pid: int) -> list[int]:
    """Every live process started by ``pid``, its children's children included (read from
    /proc: a worker's pool processes, a demo's node workers, which run in sessions of their
    own, so a process group does not hold them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The command name (2nd field) may hold spaces: the parent's pid follows its ")".
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM a process group we started (``start_new_session=True``), then SIGKILL if it
    lingers after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@dataclass
class NodeProcess:
    """One worker process of a node."""

    #: Its key in the federation: the node's name, or another name for a further worker.
    name: str
    profile: Path
    process: subprocess.Popen[bytes]
    log: Path
    #: The node it serves (the profile's name).
    node: str = ""
    #: The command it was started with (a restart runs it again).
    cmd: list[str] = field(default_factory=list)
    #: Its Celery node name, e.g. ``north@host``.
    hostname: str = ""


@dataclass
class Federation:
    """Start, watch and stop ``bidding worker`` processes for a set of profiles."""

    app: str
    env: Mapping[str, str]
    log_dir: Path
    #: Worker processes per node; None: each node's capacity (``bidding worker``'s default).
    concurrency: int | None = 2
    loglevel: str = "INFO"
    cwd: Path = field(default_factory=Path.cwd)
    extra_args: Sequence[str] = ()
    #: A command each named worker's command runs under (e.g. ``ip netns exec HOST``: the
    #: worker then runs on another "host"), by worker name.
    prefix: Mapping[str, Sequence[str]] = field(default_factory=dict)
    nodes: dict[str, NodeProcess] = field(default_factory=dict)

    def start(self, profiles: Iterable[str | Path]) -> None:
        """Start one worker process per profile (does not wait; see ``wait_live``)."""
        for path in profiles:
            profile = load_profile(path)
            self._spawn(profile.name, profile.name, Path(path), [])

    def add_worker(self, profile: str | Path, name: str, *extra: str) -> NodeProcess:
        """Start a further worker of ``profile``'s node under the Celery name ``name@host``
        (each worker of a node needs a name of its own); ``extra`` worker arguments."""
        node = load_profile(profile).name
        return self._spawn(name, node, Path(profile), ["-n", f"{name}@%h", *extra])

    def _spawn(self, name: str, node: str, path: Path, extra: list[str]) -> NodeProcess:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            *self.prefix.get(name, ()),
            sys.executable, "-m", "bidding.cli", "worker", str(path), "-A", self.app,
            *(["-c", str(self.concurrency)] if self.concurrency else []),
            "-l", self.loglevel, *self.extra_args, *extra,
        ]
        started = NodeProcess(name, path, self._run(cmd, self.log_dir / f"{name}.log"),
                              self.log_dir / f"{name}.log", node=node, cmd=cmd,
                              hostname=f"{name}@{socket.gethostname()}")
        self.nodes[name] = started
        return started

    def _run(self, cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
        handle = log.open("ab")
        try:
            return subprocess.Popen(
                cmd, cwd=self.cwd, env={**os.environ, **self.env}, stdout=handle,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        finally:
            handle.close()

    def restart(self, name: str, sig: int = signal.SIGKILL, pause: float = 0.0) -> float:
        """Kill a worker (SIGKILL: at once, no warm shutdown) and start it again under the same
        name after ``pause`` seconds, as systemd or Kubernetes would; returns when it started."""
        self.kill(name, sig)
        if sig != signal.SIGKILL:
            self.nodes[name].process.wait(timeout=30)
        time.sleep(pause)
        node = self.nodes[name]
        started = clock.now()
        node.process = self._run(node.cmd, node.log)
        return started

    def wait_registered(self, settings: Settings, name: str, since: float,
                        timeout: float = 60.0) -> None:
        """Block until worker ``name`` registered an incarnation started after ``since``."""
        from bidding.store import read_session
        from bidding.store.schema import Worker

        node = self.nodes[name]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                raise RuntimeError(f"worker {name} exited with {node.process.returncode}:\n"
                                   f"{self.tail(name)}")
            with read_session(settings.database_url) as session:
                row = session.get(Worker, node.hostname)
                if row is not None and row.started_at >= since:
                    return
            time.sleep(0.1)
        raise TimeoutError(f"worker {name} not registered after {timeout:g}s\n{self.tail(name)}")

    def wait_live(self, settings: Settings, names: Iterable[str] | None = None,
                  timeout: float = 60.0) -> None:
        """Block until every named node heartbeats, or raise with the tail of its log."""
        keys = set(names if names is not None else self.nodes)
        wanted = {self.nodes[k].node if k in self.nodes else k for k in keys}
        deadline = time.monotonic() + timeout
        while True:
            for node in self.nodes.values():
                if node.name in keys and node.process.poll() is not None:
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
        stop_process(self.nodes.pop(name).process, timeout)

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
