"""Who may read and write: bearer tokens, and writes a web page on another site cannot send.

- ``bidding_api_token`` guards writes (POST), ``bidding_api_read_token`` reads (GET, and
  writes too while no write token is set: the read token is then the API's only credential,
  and its holders its only users).
- Every write must also be one a browser sends cross-site only after a CORS preflight, which
  this API never answers: with an ``Authorization`` header, our ``X-Bidding-Request`` header,
  or a JSON body. Without it, a page on any site could POST a reset (it has no body) to an
  API on the loopback (``fetch(url, {method: "POST", mode: "no-cors"})``); its answer would be
  hidden from the page, but the write done.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from email.message import Message
from typing import Annotated

from fastapi import Depends, Header, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from bidding.config import Settings

#: The header a client of the API sends with a write that has no JSON body and no token
#: (``X-Bidding-Request: 1``): a page on another site cannot send it without a preflight.
REQUEST_HEADER = "X-Bidding-Request"

bearer = HTTPBearer(auto_error=False, description="bidding_api_token (writes), "
                    "bidding_api_read_token (reads; writes too while no bidding_api_token "
                    "is set), when set")

Check = Callable[..., None]


def cross_site_sendable(bearer_token: str | None, marker: str | None,
                        content_type: str | None) -> bool:
    """Whether a page on another site could have sent this request without a CORS preflight
    (a "simple request"): no bearer token, no (non-empty) ``X-Bidding-Request``, and no JSON
    content type (a simple request may have none, or a form's or text's). Only a bearer
    token counts: a browser attaches no bearer token by itself, but may attach the Basic
    credentials it remembers for the API's address to a form a page posts there."""
    if bearer_token or marker:
        return False
    if not content_type:
        return True
    parsed = Message()
    parsed["content-type"] = content_type
    subtype = parsed.get_content_subtype()
    return not (parsed.get_content_maintype() == "application"
                and (subtype == "json" or subtype.endswith("+json")))


def _matches(given: str, tokens: tuple[str, ...]) -> bool:
    return any(hmac.compare_digest(given.encode(), t.encode()) for t in tokens)


def _unauthorized(send: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED,
                         detail=f"missing or wrong bearer token: send Authorization: {send}",
                         headers={"WWW-Authenticate": "Bearer"})


def _require(tokens: tuple[str | None, ...], send: str
             ) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    """A dependency that passes when none of ``tokens`` is configured, or the request carries
    one; its 401 says what to ``send``."""
    configured = tuple(t for t in tokens if t is not None)

    def check(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
              ) -> None:
        if not configured:
            return
        if credentials is None or not _matches(credentials.credentials, configured):
            raise _unauthorized(send)
    return check


def write_access(settings: Settings) -> Check:
    """Writes need ``bidding_api_token`` when it is set, else ``bidding_api_read_token`` when
    that is; and, token or not, a request a page on another site could not send (403)."""
    if settings.api_token is not None:
        token = _require((settings.api_token,), "Bearer <bidding_api_token>")
    else:
        token = _require((settings.api_read_token,), "Bearer <bidding_api_read_token> (no "
                         "bidding_api_token is set, so the read token guards writes too)")

    def check(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        content_type: Annotated[str | None, Header(include_in_schema=False)] = None,
        x_bidding_request: Annotated[str | None, Header(
            alias=REQUEST_HEADER, description="Send `1` with a write that has neither a "
            "bearer token nor a JSON body (the reset): a web page on another site cannot "
            "send it without a CORS preflight, which this API does not answer")] = None,
    ) -> None:
        token(credentials)
        given = credentials.credentials if credentials is not None else None
        if cross_site_sendable(given, x_bidding_request, content_type):
            raise HTTPException(
                status.HTTP_403_FORBIDDEN,
                detail=f"a write needs the header {REQUEST_HEADER}: 1 (or a JSON body, or a "
                       "bearer token): a web page on another site can send neither without a "
                       "CORS preflight, which this API does not answer")
    return check


def read_access(settings: Settings) -> Check:
    """Reads need ``bidding_api_read_token`` (or the write token) when the read token is set."""
    return _require((settings.api_read_token, settings.api_token) if settings.api_read_token
                    else (), "Bearer <bidding_api_read_token> (or bidding_api_token)")
