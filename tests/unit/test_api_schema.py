"""schemathesis against the API's own OpenAPI schema, through the ASGI app: every operation
gets generated requests (valid and invalid ones), and no answer may be a server error or fall
outside what the schema declares (status code, content type, headers, body).

The app is the unit API tests' (a memory:// broker, no worker) on a SQLite store and on a
PostgreSQL one (which refuses values SQLite keeps: a NUL character, an id past 32 bits), with
both tokens set and sent, so the schema's bearer security is exercised as declared; its store
holds a closed auction with two bids, so the read routes answer with real content, not only
404s.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from bidding.api.app import create_app
from bidding.nodes.registry import invalidate_cache
from bidding.store import dispose_all, upgrade
from bidding.store.migrate import forget_schema_checks
from tests.unit.conftest import postgres_database
from tests.unit.test_api import make_app, nodes_beat

TOKEN = "schema-write"
#: Requests per operation: bounded so the whole file runs in a few seconds.
EXAMPLES = 25
#: No server error, and nothing the schema does not declare. (Not ``negative_data_rejection``:
#: like most HTTP APIs, this one ignores query parameters it does not know.)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


def _spec() -> dict[str, Any]:
    """The app's OpenAPI document. Building the app touches no store, so any URL will do."""
    return create_app(make_app("sqlite:///schema-only.db")).openapi()


# Loaded when the module is collected: schemathesis' lazy loader (``from_fixture``) does not
# run under pytest 9 (it sets ``request.node._nodeid``, which pytest 9 no longer has).
schema = schemathesis.openapi.from_dict(_spec())


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def api(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Any]:
    """The app on a SQLite or a PostgreSQL store holding one closed auction (bluefin and
    sasass bid), both tokens set."""
    with ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{Path(tmp_path_factory.mktemp('schema')) / 'store.db'}"
            upgrade(url)
        else:
            url = stack.enter_context(postgres_database())
        nodes_beat(url, "bluefin", "sasass")
        app = make_app(url, bidding_bid_mode="proxy", bidding_api_token=TOKEN,
                       bidding_api_read_token="schema-read")
        app.tasks["t.extract"].delay("https://example.org/a.pdf")
        try:
            yield create_app(app)
        finally:
            dispose_all()
            forget_schema_checks()
            invalidate_cache()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_every_answer_is_one_the_schema_declares(case: Any, api: Any) -> None:
    # given a request the schema allows (or one it does not, for the negative checks)
    # when it is sent with the write token (which reads accept too)
    # then the answer is no server error, and its status, type, headers and body are declared
    case.call_and_validate(app=api, headers={"Authorization": f"Bearer {TOKEN}"},
                           checks=CHECKS)
