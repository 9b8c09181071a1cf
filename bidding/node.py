"""This process's node: the profile a worker bids with, loaded once from its path."""

from __future__ import annotations

import os

from bidding.config import Settings
from bidding.profile import NodeProfile, load_profile

PROFILE_ENV = "BIDDING_PROFILE"
_profiles: dict[str, NodeProfile] = {}


def current_profile(settings: Settings) -> NodeProfile | None:
    """The profile named by ``bidding_profile`` / ``BIDDING_PROFILE``, or None outside a node."""
    path = settings.profile or os.environ.get(PROFILE_ENV)
    if not path:
        return None
    found = _profiles.get(path)
    if found is None:
        found = _profiles[path] = load_profile(path)
    return found
