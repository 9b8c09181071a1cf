"""Node workers on hosts of their own: each in a network namespace, reaching the broker (a
Redis of the test's own) and the store (PostgreSQL, through a forwarder) over a bridge, as
workers on other machines would. Bids, awards and executions cross the "network"; a host whose
cable is pulled mid-task loses it to another host, as a killed node would.

Made and removed by the test; skipped with the reason where namespaces cannot be made (not
root, no iproute2), failed instead under CI=true.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redis
import sqlalchemy as sa
from sqlalchemy import select

from bench.common.redis_server import PrivateRedis
from bidding.config import Settings, get_settings, reset_settings
from bidding.nodes.federation import Federation
from bidding.nodes.registry import invalidate_cache
from bidding.store import read_session, upgrade
from bidding.store.migrate import forget_schema_checks
from bidding.store.schema import AnnouncementRow, Message
from tests.conftest import require
from tests.integration.app import app, shared, slow
from tests.integration.conftest import (
    ROOT,
    _postgres_database,
    _repoint,
    restore_app,
    wait_for,
    write_profile,
)
from tests.integration.netns import Forwarder, Hosts, hosts, unavailable

pytestmark = pytest.mark.integration

NODES = {"north": ["shared"], "south": ["shared"], "east": ["shared"]}


@dataclass
class Network:
    hosts: Hosts
    federation: Federation
    settings: Settings
    counters: redis.Redis


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    why = unavailable()
    require("network namespaces", why is None, why or "")
    databases = _postgres_database()
    database = next(databases)
    directory = tmp_path_factory.mktemp("hosts")
    saved = (app.conf.broker_url, app.conf.result_backend)
    env_keys = ("BIDDING_DATABASE_URL", "BIDDING_HEARTBEAT_TTL")
    previous = {k: os.environ.get(k) for k in env_keys}
    try:
        with hosts(list(NODES)) as made:
            broker = PrivateRedis(directory / "redis", bind="0.0.0.0")
            broker.start()
            url = sa.engine.make_url(database)
            forwarder = Forwarder(("0.0.0.0", 0),
                                  (url.host or "127.0.0.1", url.port or 5432)).start()
            remote = url.set(host=made.gateway, port=forwarder.port).render_as_string(False)
            broker_url = f"redis://{made.gateway}:{broker.port}/0"
            counters_url = f"redis://{made.gateway}:{broker.port}/1"
            try:
                os.environ.update({"BIDDING_DATABASE_URL": remote, "BIDDING_HEARTBEAT_TTL": "4"})
                _repoint(app, broker_url, broker_url)
                reset_settings(app)
                forget_schema_checks()
                invalidate_cache()
                upgrade(remote)
                settings = get_settings(app)
                federation = Federation(
                    app="tests.integration.app", log_dir=directory / "logs", concurrency=2,
                    cwd=ROOT, prefix={n: made.exec_prefix(n) for n in NODES},
                    env={"BIDDING_DATABASE_URL": remote, "BIDDING_IT_BROKER": broker_url,
                         "BIDDING_IT_BACKEND": broker_url, "BIDDING_IT_COUNTERS": counters_url,
                         "BIDDING_HEARTBEAT_INTERVAL": "1", "BIDDING_HEARTBEAT_TTL": "4",
                         "PYTHONPATH": str(ROOT)})
                try:
                    federation.start(write_profile(directory, n, s) for n, s in NODES.items())
                    federation.wait_live(settings, timeout=90)
                    yield Network(made, federation, settings, redis.Redis.from_url(counters_url))
                finally:
                    federation.stop()
            finally:
                forwarder.stop()
                broker.stop()
    finally:
        restore_app(app, previous, saved)
        for _ in databases:  # drops the database
            pass


def kinds(network: Network, task_id: str) -> list[tuple[str, str | None]]:
    with read_session(network.settings.database_url) as s:
        return [(m.kind, m.node) for m in s.scalars(
            select(Message).where(Message.task_id == task_id).order_by(Message.id))]


def test_bids_awards_and_executions_cross_the_network(network: Network) -> None:
    # given three nodes, each on a host of its own
    task_type = f"hosts-{uuid.uuid4().hex[:6]}"
    # when tasks are submitted from this machine
    results = [shared.apply_async((i,), bidding={"task_type": task_type}) for i in range(6)]
    values = [r.get(timeout=60) for r in results]
    # then every task ran on one of the hosts and returned its value
    assert [v["value"] for v in values] == list(range(6))
    assert {v["node"] for v in values} <= set(NODES)
    # and every host's node bid on them: its answers crossed the network
    bidders = {node for r in results for kind, node in kinds(network, r.id) if kind == "BID"}
    assert bidders == set(NODES)


def test_a_host_whose_cable_is_pulled_mid_task_loses_it_to_another(network: Network) -> None:
    # given a 3 s task running on some host
    key = f"cut-{uuid.uuid4().hex}"
    result = slow.apply_async((key, 3.0), bidding={"task_type": f"cut-{key[-6:]}"})

    def running_on() -> str | None:
        with read_session(network.settings.database_url) as s:
            row = s.get(AnnouncementRow, result.id)
            return row.assigned_node if row is not None and row.state == "EXECUTING" else None

    assert wait_for(lambda: running_on() is not None, 30)
    victim = running_on()
    assert victim is not None
    # when that host's link goes down (its packets vanish; nothing is reset)
    network.hosts.cut(victim)
    started = time.monotonic()
    try:
        # then the task runs to its end on another host, once its heartbeat has expired
        value = result.get(timeout=60)
        assert value["node"] != victim
        assert time.monotonic() - started < 30
        assert any(kind == "REAWARDED" for kind, _ in kinds(network, result.id))
    finally:
        network.hosts.mend(victim)
    # and the host comes back as a node once its cable is back
    assert wait_for(lambda: victim in _live(network.settings), 60)


def _live(settings: Settings) -> set[str]:
    from bidding.nodes.registry import query_live_nodes

    return {n.name for n in query_live_nodes(settings)}


def test_the_test_hosts_are_removed_afterwards() -> None:
    # given hosts made by a test
    why = unavailable()
    require("network namespaces", why is None, why or "")
    with hosts(["a"]) as made:
        namespace = made.namespace("a")
        assert namespace in _namespaces()
    # then none of them is left behind
    assert namespace not in _namespaces()


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}
