"""The API's boundary, pure parts: which hosts are the loopback (``bidding api`` refuses to
serve open writes elsewhere), the body limit as an ASGI middleware driven message by message,
and which requests a web page on another site could send without asking (CORS)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bidding.api.auth import cross_site_sendable
from bidding.api.exposure import is_loopback, open_refusal
from bidding.api.limits import BodyLimit

Message = dict[str, Any]


# --- bidding api --host: loopback or not ----------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "127.255.255.254", "::1",
                                  "[::1]", "localhost", "LocalHost", "::ffff:127.0.0.1"])
def test_the_loopback_is_127_slash_8_ipv6s_one_and_localhost(host: str) -> None:
    # given a host on this machine's loopback, when it is checked, then it is the loopback
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.20", "10.0.0.1",
                                  "128.0.0.1", "::2", "example.org", "localhost.example.org",
                                  "::ffff:10.0.0.1"])
def test_every_other_host_is_not_the_loopback(host: str) -> None:
    # given every interface, a LAN address or a name (not resolved: it may point anywhere)
    # when it is checked, then it is not the loopback
    assert not is_loopback(host)


def test_an_api_on_every_interface_without_a_write_token_is_refused_naming_how_to_fix_it(
        ) -> None:
    # given --host 0.0.0.0 and no bidding_api_token (a read token does not count)
    # when the start is checked
    refusal = open_refusal("0.0.0.0", api_token=None, allow_open=False)
    # then it is refused, naming the host, the setting, its variable and the flag
    assert refusal is not None
    assert "0.0.0.0" in refusal
    assert "bidding_api_token" in refusal and "BIDDING_API_TOKEN" in refusal
    assert "--allow-open" in refusal


@pytest.mark.parametrize(("host", "token", "allow_open"), [
    ("127.0.0.1", None, False), ("localhost", None, False), ("::1", None, False),
    ("0.0.0.0", "s3cret", False), ("0.0.0.0", None, True), ("192.168.1.20", "s3cret", True)])
def test_a_loopback_host_a_write_token_or_allow_open_lets_it_start(
        host: str, token: str | None, allow_open: bool) -> None:
    # given a loopback host, or a token, or the operator's explicit --allow-open
    # when the start is checked, then nothing refuses it
    assert open_refusal(host, api_token=token, allow_open=allow_open) is None


# --- the body limit, message by message -----------------------------------------------------


class Recorder:
    """An ASGI app that reads the whole body, then answers 200 with its length."""

    def __init__(self) -> None:
        self.called = False
        self.body = b""

    async def __call__(self, scope: Message, receive: Callable[[], Awaitable[Message]],
                      send: Callable[[Message], Awaitable[None]]) -> None:
        self.called = True
        while True:
            message = await receive()
            self.body += message.get("body", b"")
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(self.body)).encode()})


def drive(app: Any, headers: list[tuple[bytes, bytes]], chunks: Any
          ) -> tuple[int, dict[bytes, bytes], bytes, int]:
    """Send a POST whose body comes in ``chunks`` (an iterator: perhaps endless) through
    ``app``: the status, headers and body of its answer, and how many messages it read."""
    sent: list[Message] = []
    reads = [0]

    async def receive() -> Message:
        reads[0] += 1
        chunk = next(chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/aitp/tasks", "headers": headers}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body, reads[0]


def endless(size: int) -> Any:
    """A chunked upload that never ends, ``size`` bytes a message."""
    while True:
        yield b"x" * size


def test_a_chunked_body_over_the_limit_is_refused_reading_no_more_than_the_limit() -> None:
    # given a 1 MiB limit before an app, and a chunked upload without a Content-Length that
    # never ends, 64 KiB a message
    app = Recorder()
    limited = BodyLimit(app, limit=1_048_576)
    # when it is sent
    status, headers, body, reads = drive(limited, [(b"content-type", b"application/json")],
                                         endless(65_536))
    # then 413, as JSON naming the setting and its value, and the connection is closed
    assert status == 413
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"connection"] == b"close"
    assert json.loads(body) == {"detail": "the request body is over bidding_api_max_body_bytes "
                                          "(1048576 bytes)"}
    # and reading stopped at the first message past the limit; the app never saw it
    assert reads == 17
    assert not app.called


def test_a_declared_length_over_the_limit_is_refused_before_reading_the_body() -> None:
    # given a 1 MiB limit, and a request that says its body has 20 MB
    app = Recorder()
    limited = BodyLimit(app, limit=1_048_576)
    # when it is sent
    status, _, body, reads = drive(limited, [(b"content-length", b"20971520")],
                                   endless(65_536))
    # then 413 names its size, the setting and its value, and not a byte of it was read
    assert status == 413
    assert json.loads(body)["detail"] == ("the request body (20971520 bytes) is over "
                                          "bidding_api_max_body_bytes (1048576 bytes)")
    assert reads == 0 and not app.called


def test_a_body_within_the_limit_reaches_the_app_whole() -> None:
    # given a 1 MiB limit, and a body of exactly 1 MiB in 16 messages, without a length
    app = Recorder()
    limited = BodyLimit(app, limit=1_048_576)
    chunks = iter([b"y" * 65_536] * 16)
    # when it is sent, then the app reads all of it and answers
    status, _, body, _ = drive(limited, [], chunks)
    assert (status, body) == (200, b"1048576")
    assert app.body == b"y" * 1_048_576


# --- what a page on another site can send ---------------------------------------------------


@pytest.mark.parametrize(("token", "marker", "content_type"), [
    (None, None, None),  # fetch(url, {method: "POST", mode: "no-cors"}): the reset POST
    (None, None, "text/plain"),
    (None, None, "text/plain; charset=utf-8"),
    (None, None, "application/x-www-form-urlencoded"),  # an HTML form
    (None, None, "multipart/form-data; boundary=x"),
    (None, "", None),
])
def test_a_request_a_page_elsewhere_can_send_without_asking_is_recognised(
        token: str | None, marker: str | None, content_type: str | None) -> None:
    # given what a browser sends cross-site without a CORS preflight: no bearer token, none
    # of our header, a form's or text's content type (or none)
    # then it is one
    assert cross_site_sendable(token, marker, content_type)


@pytest.mark.parametrize(("token", "marker", "content_type"), [
    ("x", None, None),
    (None, "1", None),
    (None, "1", "text/plain"),
    (None, None, "application/json"),
    (None, None, "application/json; charset=utf-8"),
    (None, None, "application/problem+json"),
])
def test_a_token_our_header_or_json_needs_a_preflight_so_a_page_elsewhere_cannot_send_it(
        token: str | None, marker: str | None, content_type: str | None) -> None:
    # given a request with a header a browser sends cross-site only after a CORS preflight
    # (which this API never answers)
    # then it is not one a page elsewhere can send
    assert not cross_site_sendable(token, marker, content_type)
