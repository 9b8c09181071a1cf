"""The demo's web services: the HTTP API with its dashboard (``bidding api``) and Flower, each a
process of its own beside the node workers, on the loopback interface.

They are started as commands, as an operator would start them (the demo imports nothing of
``bidding.api``: the two are siblings in the layers), and they read the same broker and store
as the nodes through the environment.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bidding.nodes.embedded import free_port, port_is_free
from bidding.nodes.federation import stop_process

#: The ports the demo asks for first (the API's and Flower's usual ones); a free one otherwise.
API_PORT = 8000
FLOWER_PORT = 5555


@dataclass
class WebService:
    """One web process of the demo."""

    #: What it is, as printed: "dashboard", "Flower".
    name: str
    #: The address a user opens.
    url: str
    #: A URL that answers 200 once it serves (and needs no token).
    probe: str
    process: subprocess.Popen[bytes]
    log: Path

    def answers(self) -> bool:
        """True when the probe URL answers 200."""
        with contextlib.suppress(OSError, urllib.error.URLError), \
                urllib.request.urlopen(self.probe, timeout=2) as response:
            return bool(response.status == 200)
        return False

    def tail(self, lines: int = 15) -> str:
        """The last lines of its log, for a message saying why it did not start."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  [{self.name}] {line}" for line in text[-lines:])


def _port(preferred: int) -> int:
    return preferred if port_is_free(preferred) else free_port()


def _nice() -> None:
    # The nodes start at the same time and the demo waits for them: their start-up goes first
    # on a small machine, and these processes take what CPU is left (they are idle after).
    os.nice(10)


def _spawn(cmd: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        # A session of its own, so stopping it stops its children too (uvicorn, tornado).
        return subprocess.Popen(cmd, env=dict(env), stdout=handle, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_nice)


def start_web(app: str, env: Mapping[str, str], log_dir: Path) -> tuple[list[WebService],
                                                                       list[str]]:
    """Start the API with its dashboard (when the ``api`` extra is installed) and Flower for
    ``app``; returns them (not waited for: see ``wait_web``) and what could not be started."""
    started: list[WebService] = []
    missing: list[str] = []
    if importlib.util.find_spec("fastapi") and importlib.util.find_spec("uvicorn"):
        port = _port(API_PORT)
        url = f"http://127.0.0.1:{port}"
        started.append(WebService(
            "dashboard", f"{url}/", f"{url}/openapi.json", _spawn(
                [sys.executable, "-m", "bidding.cli", "api", "-A", app, "--host", "127.0.0.1",
                 "--port", str(port)], env, log_dir / "api.log"), log_dir / "api.log"))
    else:
        missing.append("dashboard: not started, it needs the api extra "
                       "(pip install 'celery-bidding[api]')")
    port = _port(FLOWER_PORT)
    url = f"http://127.0.0.1:{port}"
    started.append(WebService(
        "Flower", f"{url}/", f"{url}/healthcheck", _spawn(
            [sys.executable, "-m", "celery", "-A", app, "flower", f"--port={port}",
             "--address=127.0.0.1"], env, log_dir / "flower.log"), log_dir / "flower.log"))
    return started, missing


def wait_web(services: list[WebService], timeout: float = 60.0) -> list[str]:
    """Wait until each service answers; returns a problem line (with its log) for each that
    exited or did not answer in time. The demo goes on without it."""
    deadline = time.monotonic() + timeout
    waiting = list(services)
    problems = []
    while waiting:
        for s in list(waiting):
            if s.answers():
                waiting.remove(s)
            elif s.process.poll() is not None:
                waiting.remove(s)
                problems.append(f"{s.name} exited with {s.process.returncode}:\n{s.tail()}")
        if waiting and time.monotonic() > deadline:
            problems += [f"{s.name} did not answer within {timeout:g} s:\n{s.tail()}"
                         for s in waiting]
            break
        time.sleep(0.2)
    return problems


def exited(services: list[WebService]) -> list[str]:
    """A problem line (with its log) for each service that has exited."""
    return [f"{s.name} exited with {s.process.returncode}:\n{s.tail()}"
            for s in services if s.process.poll() is not None]


def signal_web(services: list[WebService]) -> None:
    """Ask every web process to stop (SIGTERM), without waiting: see ``stop_web``."""
    for s in services:
        if s.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(s.process.pid, signal.SIGTERM)


def stop_web(services: list[WebService]) -> None:
    """Stop every web process: SIGTERM, and SIGKILL for one that lingers."""
    signal_web(services)
    for s in services:
        stop_process(s.process, timeout=10)
