"""The request body limit (``bidding_api_max_body_bytes``): an ASGI middleware that answers
413 before the application sees a body over the limit.

A middleware, not a FastAPI dependency: FastAPI reads and parses a route's body before it runs
any of the route's dependencies, so a dependency would see a 20 MB definition only once it
was in memory and parsed. The middleware sees the stream first, and guards every route
(those added later, the dashboard's files) without each having to ask for it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    """The request's ``Content-Length``, if it has a valid one (a chunked request has none;
    the server refuses an invalid one before the application sees it)."""
    for name, value in headers:
        if name.lower() == b"content-length" and value.strip().isdigit():
            return int(value)
    return None


def over_limit(limit: int, size: int | None = None) -> str:
    """What a 413 says: the body's size when it was declared, the setting and its value."""
    sized = f" ({size} bytes)" if size is not None else ""
    return f"the request body{sized} is over bidding_api_max_body_bytes ({limit} bytes)"


class BodyLimit:
    """Refuse a request whose body is over ``limit`` bytes with 413 and a JSON ``detail``:
    at once when its ``Content-Length`` says so, else when the bytes read pass the limit
    (a chunked body: nothing past the first message over the limit is read). A body within
    the limit is read, then handed to the application as it came."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on with its body, or answer 413 and read no more of it."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope.get("headers") or ())
        if declared is not None and declared > self.limit:
            await self._refuse(scope, receive, send, declared)
            return
        # Read the body here, up to the limit: the application would read all of it anyway
        # (FastAPI before it validates), so holding it costs no more than it would.
        messages: deque[Message] = deque()
        size = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the application hears it as it would
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._refuse(scope, receive, send, None)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.popleft() if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send,
                      size: int | None) -> None:
        # Connection: close, since the rest of the body is never read: the server cannot
        # find the next request on this connection after it.
        response = JSONResponse(status_code=413, content={"detail": over_limit(self.limit, size)},
                                headers={"Connection": "close"})
        await response(scope, receive, send)
