"""MkDocs hook: the configuration reference's table, generated from ``bidding.config.Settings``.

Every field of ``Settings`` is one row: its ``app.conf`` name, its environment variable, its
default, its bounds and its meaning, the ``#:`` comment written above the field in
``bidding/config.py``. A page includes the table with the line ``<!-- settings-reference -->``.
``tests/unit/test_settings_reference.py`` fails when a field has no meaning or no row.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

from pydantic.fields import FieldInfo

from bidding import config

MARKER = "<!-- settings-reference -->"
_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))


def meanings() -> dict[str, str]:
    """Each field's ``#:`` comment (the lines just above it in the class), joined into one."""
    source = inspect.getsource(config)
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(node for node in tree.body
               if isinstance(node, ast.ClassDef) and node.name == "Settings")
    found: dict[str, str] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment: list[str] = []
            index = node.lineno - 2
            while index >= 0 and lines[index].strip().startswith("#:"):
                comment.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            found[node.target.id] = " ".join(comment)
    return found


def default_of(info: FieldInfo) -> str:
    """The field's default as a reader would write it, or a dash for none."""
    value: Any = info.get_default(call_default_factory=True)
    if value is None or value in ((), {}, ""):
        return "-"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value)
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def bounds_of(info: FieldInfo) -> str:
    """The field's numeric bounds (``> 0, <= 3600``), or nothing."""
    found = []
    for item in info.metadata:
        for attr, sign in _BOUNDS:
            value = getattr(item, attr, None)
            if value is not None:
                found.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(found)


def escape(text: str) -> str:
    """A table cell's text: pipes escaped."""
    return text.replace("|", "\\|")


def render() -> str:
    """The Markdown table of every setting."""
    said = meanings()
    rows = ["| setting | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, info in config.Settings.model_fields.items():
        bounds = bounds_of(info)
        meaning = escape(said.get(name, ""))
        if bounds:
            meaning = f"{meaning} ({bounds})" if meaning else f"({bounds})"
        rows.append(f"| `{config.CONF_PREFIX}{name}` | `{config.ENV_PREFIX}{name.upper()}` | "
                    f"{default_of(info)} | {meaning} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs' hook: the marker replaced by the table."""
    return markdown.replace(MARKER, render()) if MARKER in markdown else markdown
