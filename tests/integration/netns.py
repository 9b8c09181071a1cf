"""Hosts on one machine: network namespaces joined by a bridge, made by a test and removed
after it, and a TCP forwarder that makes a loopback-only service (PostgreSQL) reachable from
them over the bridge.

Each host is a namespace with one veth link to the bridge; ``cut`` brings a host's link down
(its packets vanish, as when a cable is pulled: connections hang, no reset), ``mend`` brings
it back. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def unavailable() -> str | None:
    """Why hosts cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"bidding-probe-{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"ip netns add failed: {exc.stderr.decode(errors='replace').strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Hosts:
    """A bridge with an address on this machine (``gateway``) and one namespace per host."""

    names: list[str]
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:5])
    subnet: int = field(default_factory=lambda: 100 + int(uuid.uuid4().int % 150))

    @property
    def bridge(self) -> str:
        return f"bb{self.tag}"

    @property
    def gateway(self) -> str:
        """This machine's address on the bridge: where the hosts find the services."""
        return f"10.213.{self.subnet}.1"

    def namespace(self, host: str) -> str:
        return f"bidding-{self.tag}-{self.names.index(host)}"

    def link(self, host: str) -> str:
        return f"bv{self.tag}{self.names.index(host)}"

    def exec_prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def create(self) -> None:
        """Make the bridge, the namespaces and their links."""
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for k, host in enumerate(self.names):
            ns, link = self.namespace(host), self.link(host)
            _ip("netns", "add", ns)
            _ip("link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", link, "master", self.bridge, "up")
            _ip("-n", ns, "addr", "add", f"10.213.{self.subnet}.{10 + k}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def cut(self, host: str) -> None:
        """Pull ``host``'s cable: its link goes down."""
        _ip("link", "set", self.link(host), "down")

    def mend(self, host: str) -> None:
        """Plug it back in."""
        _ip("link", "set", self.link(host), "up")

    def remove(self) -> None:
        """Remove everything ``create`` made (what exists of it)."""
        for host in self.names:
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("link", "del", self.link(host))
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("netns", "del", self.namespace(host))
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", self.bridge)


@contextlib.contextmanager
def hosts(names: list[str]) -> Iterator[Hosts]:
    """``Hosts`` for the test's duration."""
    made = Hosts(names)
    try:
        made.create()
        yield made
    finally:
        made.remove()


class Forwarder:
    """Accept TCP connections on ``listen`` and relay each to ``target`` (a thread)."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen, reuse_port=False)
        self.port = int(self.server.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="forwarder", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.server, selectors.EVENT_READ, None)
        peers: dict[socket.socket, socket.socket] = {}
        while not self._stop.is_set():
            for key, _ in selector.select(timeout=0.2):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.server:
                    try:
                        client, _addr = self.server.accept()
                        upstream = socket.create_connection(self.target, timeout=5)
                    except OSError:
                        continue
                    for a, b in ((client, upstream), (upstream, client)):
                        peers[a] = b
                        selector.register(a, selectors.EVENT_READ, None)
                    continue
                other = peers.get(sock)
                try:
                    data = sock.recv(65536)
                    if data and other is not None:
                        other.sendall(data)
                        continue
                except OSError:
                    pass
                for s in (sock, other):
                    if s is not None and s in peers:
                        selector.unregister(s)
                        peers.pop(s, None)
                        s.close()
        for s in list(peers):
            s.close()
        selector.close()
