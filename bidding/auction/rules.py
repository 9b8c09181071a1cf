"""Seed 000's coordinator rules, opt-in (pure): a call's required skills inferred from keywords
in its content (``bidding_skill_keywords``), and its preferred node from its task type
(``bidding_preferred_nodes``). Applied where every announcement is built, so ``.delay()``,
task graphs and the API get them alike; only where the call says nothing itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from functools import lru_cache
from typing import Any

__all__ = ["apply_rules", "found_keywords", "strings_of"]


@lru_cache(maxsize=16)
def _pattern(keywords: tuple[str, ...]) -> re.Pattern[str]:
    """One pattern for all keywords (longest first, so "machine learning" wins over
    "machine"), each a whole word: no letter, digit or underscore just before or after it
    (a lookaround, as ``\\b`` would fail on a keyword that ends in "+", say "c++")."""
    ordered = sorted(keywords, key=lambda k: (-len(k), k))
    return re.compile(r"(?<!\w)(" + "|".join(map(re.escape, ordered)) + r")(?!\w)",
                      re.IGNORECASE)


def strings_of(value: Any) -> Iterator[str]:
    """Every string inside ``value`` (JSON: lists, dicts, scalars), keys excepted."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from strings_of(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from strings_of(item)


def found_keywords(keywords: Mapping[str, str], texts: Iterable[str]) -> list[str]:
    """The keywords of ``keywords`` (lower case) found in ``texts``, in the mapping's order."""
    if not keywords:
        return []
    pattern = _pattern(tuple(keywords))
    found: set[str] = set()
    for text in texts:
        found.update(m.group(1).lower() for m in pattern.finditer(text))
        if len(found) == len(keywords):
            break
    return [k for k in keywords if k in found]


def apply_rules(merged: dict[str, Any], texts: Iterable[str],
                skill_keywords: Mapping[str, str],
                preferred_nodes: Mapping[str, str]) -> dict[str, str]:
    """Set ``merged``'s required skills (from the keywords in ``texts``: the task's content
    and its arguments' strings) and preferred node by the rules, where the call left them
    empty; return why, by option (the announcement's ``inferred``, which explain shows)."""
    why: dict[str, str] = {}
    if skill_keywords and not merged.get("required_skills"):
        keywords = found_keywords(skill_keywords, texts)
        if keywords:
            skills = list(dict.fromkeys(skill_keywords[k] for k in keywords))
            merged["required_skills"] = skills
            why["required_skills"] = "bidding_skill_keywords: " + ", ".join(
                f"{k!r} -> {skill_keywords[k]}" for k in keywords) + " (found in the task)"
    task_type = str(merged.get("task_type") or "")
    if merged.get("preferred_node") is None and task_type in preferred_nodes:
        merged["preferred_node"] = preferred_nodes[task_type]
        why["preferred_node"] = (f"bidding_preferred_nodes: task type {task_type!r} -> "
                                 f"{preferred_nodes[task_type]}")
    return why
