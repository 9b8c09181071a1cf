"""The configuration reference (docs/reference/configuration.md): generated from ``Settings``,
every field with its environment variable, default and meaning."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from bidding.config import Settings

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "reference" / "configuration.md"


def hook() -> ModuleType:
    """The MkDocs hook that writes the table (docs/hooks/settings_reference.py)."""
    spec = importlib.util.spec_from_file_location(
        "settings_reference", REPO / "docs" / "hooks" / "settings_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(markdown: str) -> dict[str, list[str]]:
    """The table's rows by setting name: their cells."""
    found = {}
    for line in markdown.splitlines():
        if line.startswith("| `bidding_"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            found[cells[0].strip("`").removeprefix("bidding_")] = cells
    return found


def test_every_setting_has_a_row_with_its_variable_default_and_meaning() -> None:
    # given the configuration page as the site builds it
    reference = hook()
    page = reference.on_page_markdown(PAGE.read_text(encoding="utf-8"))
    # then every field of Settings has a row: its environment variable, its default, a meaning
    table = rows(page)
    missing = sorted(set(Settings.model_fields) - set(table))
    assert not missing, f"settings missing from the configuration reference: {missing}"
    for name, (_, variable, default, meaning) in table.items():
        assert variable == f"`BIDDING_{name.upper()}`"
        assert default
        assert meaning and not meaning.startswith("("), (
            f"bidding_{name} has no meaning: write a #: comment above it in bidding/config.py")


def test_a_default_and_bounds_are_the_fields_own() -> None:
    # when the table is rendered, then a bounded setting shows its default and its bounds
    table = rows(hook().render())
    assert table["window"][2] == "`2.0`"
    assert table["window"][3].endswith("(> 0, <= 3600)")
    assert table["database_url"][2] == "`'sqlite:///bidding.db'`"
    assert table["notify_url"][2] == "-"
