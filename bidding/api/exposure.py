"""Who can reach ``bidding api`` (pure): the loopback, or more. Without ``bidding_api_token``
its writes answer anyone who reaches the port, so ``bidding api`` refuses to listen beyond the
loopback without one, unless the operator says ``--allow-open``.

No FastAPI here: the command checks this before it imports the application.
"""

from __future__ import annotations

import ipaddress

#: The one name taken for the loopback without resolving it; any other name is not (what it
#: resolves to may change, and a name may have addresses beyond the loopback too).
LOOPBACK_NAME = "localhost"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as ``--host`` takes it) is this machine's loopback only: an address in
    127.0.0.0/8, ::1 (bracketed or not, or IPv4-mapped 127.x), or ``localhost``."""
    name = host.strip().lower()
    if name == LOOPBACK_NAME:
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def open_refusal(host: str, api_token: str | None, allow_open: bool) -> str | None:
    """Why ``bidding api --host HOST`` must not start: beyond the loopback with no write token
    and no ``--allow-open``; None when it may."""
    if api_token is not None or allow_open or is_loopback(host):
        return None
    return (f"--host {host} is not the loopback and no bidding_api_token is set: anyone who "
            "reaches the port could submit and reset tasks. Set bidding_api_token (the "
            "environment's BIDDING_API_TOKEN), listen on 127.0.0.1, or pass --allow-open to "
            "serve it without a token anyway")
