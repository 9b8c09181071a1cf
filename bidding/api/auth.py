"""Bearer tokens: ``bidding_api_token`` guards writes, ``bidding_api_read_token`` reads."""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from bidding.config import Settings

bearer = HTTPBearer(auto_error=False, description="bidding_api_token (writes), "
                    "bidding_api_read_token (reads), when set")


def _matches(given: str, tokens: tuple[str | None, ...]) -> bool:
    return any(t is not None and hmac.compare_digest(given.encode(), t.encode()) for t in tokens)


def _require(*tokens: str | None) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    """A dependency that passes when no token is configured, or the request carries one."""
    def check(credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
              ) -> None:
        if all(t is None for t in tokens):
            return
        if credentials is None or not _matches(credentials.credentials, tokens):
            raise HTTPException(
                status.HTTP_401_UNAUTHORIZED,
                detail="missing or wrong bearer token (Authorization: Bearer <token>)",
                headers={"WWW-Authenticate": "Bearer"})
    return check


def write_access(settings: Settings) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    """Writes need ``bidding_api_token`` when it is set."""
    return _require(settings.api_token)


def read_access(settings: Settings) -> Callable[[HTTPAuthorizationCredentials | None], None]:
    """Reads need ``bidding_api_read_token`` (or the write token) when the read token is set."""
    if settings.api_read_token is None:
        return _require()
    return _require(settings.api_read_token, settings.api_token)
