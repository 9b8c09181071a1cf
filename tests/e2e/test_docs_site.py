"""The docs site (mkdocs.yml, pages under docs/): it builds with ``--strict``, and the command
blocks marked runnable in README.md and the pages run as written.

A block is runnable when the line before its opening fence is ``<!-- runnable -->``: it runs
with bash, ``set -e``, from the checkout's root, in a new terminal's environment (no Celery,
bidding or Flower variable, no virtualenv active), so it must activate ``.venv`` itself as the
README says. Blocks that need a long-running server (the quick start's embedded Redis and
nodes) are not marked: the tour's test (test_tour.py) runs the same kind of commands.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require
from tests.e2e.test_dashboard import CHROMIUM, browse
from tests.e2e.test_flower import clean_env

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV = REPO_ROOT / ".venv"
MARK = "<!-- runnable -->"
RUNNABLE = re.compile(r"^<!-- runnable -->\n```(?:sh|bash|console)\n(.*?)^```$",
                      re.MULTILINE | re.DOTALL)
#: docs/img/docs-home.png is replaced by this run's screenshot when this is "1".
UPDATE_SCREENSHOTS = os.environ.get("BIDDING_UPDATE_SCREENSHOTS") == "1"


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def runnable_blocks() -> list[tuple[str, str]]:
    """Every runnable block: (where it is, its commands)."""
    found = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        blocks = RUNNABLE.findall(text)
        assert len(blocks) == text.count(MARK), f"{page}: {MARK} not followed by a sh block"
        found += [(f"{page.relative_to(REPO_ROOT)} #{n}", block)
                  for n, block in enumerate(blocks, 1)]
    return found


def newcomer_env() -> dict[str, str]:
    """A new terminal's environment: no settings, no virtualenv on the path."""
    env = clean_env()
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(VENV)))
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as ``make docs`` builds it (--strict)."""
    require("mkdocs", shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is not None,
            "mkdocs is not installed: pip install -e '.[dev]'")
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO_ROOT, env={**clean_env(), "NO_MKDOCS_2_WARNING": "1"}, capture_output=True,
        text=True, timeout=120, check=False)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr}"
    return out


def test_the_site_builds_strict_with_every_page(site: Path) -> None:
    # given the site built with --strict (a broken link or anchor fails the build)
    # then every page is there, the configuration reference with its generated table
    assert (site / "index.html").is_file()
    for page in ("getting-started", "concepts", "guides/bidding", "architecture",
                 "decisions/0001-no-chord-bid-board", "benchmarks"):
        assert (site / page / "index.html").is_file(), page
    configuration = (site / "reference" / "configuration" / "index.html").read_text()
    assert "BIDDING_WINDOW" in configuration and "settings-reference" not in configuration


def test_the_site_home_page_renders(site: Path, tmp_path: Path) -> None:
    # when the home page is opened in a browser, then it shows the pitch and the navigation
    require("chromium", Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK),
            f"{CHROMIUM} not found: apt-get install chromium")
    browser = CHROMIUM
    shot = tmp_path / "docs-home.png"
    home = (site / "index.html").as_uri()
    dom = browse(browser, home, tmp_path / "profile", "--dump-dom")
    assert "Plain Celery gives the next task" in dom and "Getting started" in dom, dom[:2000]
    browse(browser, home, tmp_path / "profile-shot", f"--screenshot={shot}",
           "--window-size=1280,900")
    assert shot.stat().st_size > 10_000
    if UPDATE_SCREENSHOTS:
        shutil.copyfile(shot, REPO_ROOT / "docs" / "img" / "docs-home.png")


def test_the_runnable_blocks_run_as_written() -> None:
    # given the blocks marked runnable, README's install check among them
    blocks = runnable_blocks()
    assert any(where.startswith("README.md") for where, _ in blocks), blocks
    require("the checkout's .venv", (VENV / "bin" / "activate").is_file(),
            f"{VENV} not found: make .venv/.installed-stamp")
    for where, commands in blocks:
        # when each runs in a new terminal at the checkout's root
        result = subprocess.run(["bash", "-e", "-c", commands], cwd=REPO_ROOT,
                                env=newcomer_env(), capture_output=True, text=True,
                                timeout=120, check=False)
        # then it succeeds
        assert result.returncode == 0, (
            f"{where} failed ({result.returncode}):\n{commands}\n--- stdout ---\n"
            f"{result.stdout}\n--- stderr ---\n{result.stderr}")
