"""Typed ``bidding_*`` settings: one place for names, defaults and validation, and the settings
of an app (``get_settings``), loaded once and checked for JSON-only serialization.

Values are read from ``app.conf`` (``bidding_window = 2.0``) and overridden by the environment
(``BIDDING_WINDOW=0.5``), so every deployment knob can be set without touching code.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bidding.errors import ConfigurationError
from bidding.models import BidMode, CandidateCap, NoBidPolicy, describe_validation

if TYPE_CHECKING:
    from celery import Celery

ENV_PREFIX = "BIDDING_"
CONF_PREFIX = "bidding_"
#: ``BIDDING_*`` environment variables that are not settings, so never refused as unknown:
#: those of the package's own test suites and benchmarks (``BIDDING_TEST_REDIS``,
#: ``BIDDING_TEST_POSTGRES``, ``BIDDING_IT_BROKER``...), by prefix, and the example app's
#: config module (``BIDDING_DEMO_CONFIG``). A worker's boot id (``_BIDDING_BOOT_ID``) does not
#: start with ``BIDDING_`` at all.
ENV_NOT_SETTINGS_PREFIXES: tuple[str, ...] = ("BIDDING_TEST_", "BIDDING_IT_")
ENV_NOT_SETTINGS: frozenset[str] = frozenset({"BIDDING_DEMO_CONFIG"})


#: Bounds of the checking policy of delegated work: the ``bidding_*check*`` settings and a
#: node profile's ``[checking]`` table alike. A factor above 10 or waits beyond these say
#: nothing a smaller value would not (the wait reaches its cap within a few checks), and
#: unbounded they let a profile's ``check_backoff_factor = 1e40`` overflow a float at its
#: eighth check.
CHECK_WAIT_LIMIT = 86_400.0
MAX_CHECK_WAIT_LIMIT = 7 * 86_400.0
BACKOFF_FACTOR_LIMIT = 10.0
CHECK_ATTEMPTS_LIMIT = 1000


#: How many windows of a node's latest episodes of a task type its bids read: the latest
#: window makes the estimate of its success there, and all of them that estimate's prior
#: (``scores.informed_confidence``). Ten episodes alone could not tell a 0.88 node from a
#: 0.93 one; thirty as the prior do it better, and the latest ten still see a node fail.
PRIOR_WINDOWS = 3


class Settings(BaseModel):
    """Every ``bidding_*`` setting with its default. Field ``x`` is ``app.conf.bidding_x``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: SQLAlchemy URL of the store (announcements, bids, nodes, episodes, messages).
    database_url: str = "sqlite:///bidding.db"
    #: Create or upgrade the store's schema (Alembic) on first use in a process.
    auto_migrate: bool = True
    #: Seconds an auction waits for bids before it closes with the bids that arrived.
    window: float = Field(2.0, gt=0, le=3600)
    #: Default selection strategy (a registered name or ``"package.module:Class"``).
    strategy: str = "weighted"
    #: Dotted paths (``"package.module:Class"``) of strategies that tasks may name, besides the
    #: built-in and registered names and ``bidding_strategy`` itself. A strategy's name travels
    #: in messages and the store: a node imports only what is listed here.
    allowed_strategies: tuple[str, ...] = ()
    #: What an auction without a valid bid does: fail the task, or fall back to any live node.
    no_bid: NoBidPolicy = "fail"
    #: Bids with a lower confidence are not eligible.
    min_confidence: float = Field(0.5, ge=0, le=1)
    #: Bids from nodes with a lower (learned) trust are not eligible (the protocol's default is 50).
    min_trust: float = Field(50.0, ge=0, le=100)
    #: Ask at most this many eligible nodes per auction (0 = all of them). "auto": 8 up to 16
    #: eligible nodes, then twice the square root of their number (12 of 32, 23 of 128, 32 of
    #: 256), so that a large federation's best nodes are still among those asked.
    candidate_cap: CandidateCap = "auto"
    #: Where bids wait while an auction is open: "auto" (Redis when the broker is Redis, else
    #: the store), "store", or a Redis URL (see bidding.auction.board).
    bid_board: str = "auto"
    #: Write a new task's proxy award behind (bidding.auction.writebehind): the caller's
    #: ``.delay()`` appends the announcement, its bids and its award to a Redis stream in one
    #: Lua call, reserving the winner there, and the node workers write them to the store in
    #: batches (the winner writes its own before it starts). Needs the Redis bid board, and
    #: Redis with persistence (``appendonly yes``): until written, an award is in Redis only.
    award_journal: bool = False
    #: Seconds a journal entry may wait in a writer that took it and went silent (killed)
    #: before another node's writer takes it over.
    journal_reclaim_seconds: float = Field(10.0, gt=0, le=3600)
    #: Who makes the bids: "auto" has the announcer make the bids of the candidates whose
    #: profile names no bidder of their own (their heartbeat says so), as "proxy" does, and
    #: ask the others, in one auction; "ask" sends every candidate a bid request and its node
    #: answers; "proxy" has the announcing process compute every candidate's bid itself, with
    #: the built-in bid function on their published profiles and their history in the store,
    #: and award at once (see bidding.auction.proxy; a node's own bidder is not consulted).
    #: Set it where tasks are announced (callers and node workers, whose sweepers announce
    #: retries).
    bid_mode: BidMode = "auto"
    #: How an award places a task that needs resources among the nodes it fits now:
    #: "spread" prefers the node it leaves the most free, "pack" the one it leaves the least
    #: (best fit: a node's resources fill before the next node's, keeping big nodes free for
    #: big tasks). Set it where tasks are awarded (callers and node workers).
    fit: Literal["spread", "pack"] = "spread"
    #: The most characters of a task's content, and of its args and kwargs (as JSON,
    #: together), that a bid request carries to a node's bidder; longer ones are cut, and
    #: the bidder's ``Announcement.truncated`` gives their full sizes
    #: (see bidding.auction.request_view).
    bid_request_limit: int = Field(8192, ge=256, le=1_048_576)
    #: Seconds a node reuses its history (experience, in-flight work) between bids on the same
    #: task type, while its history version on the Redis board holds; the award re-counts
    #: in-flight work anyway (0 = read the store for every bid).
    history_cache_seconds: float = Field(0.5, ge=0, le=60)
    #: Connections each process keeps open to a server store (PostgreSQL), and may exceed by
    #: 10 at a peak. A node's threads (sweeper, heartbeat, bid threads, monitor) need a few;
    #: raise it in an announcing process whose threads call ``.delay()`` concurrently.
    db_pool_size: int = Field(5, ge=1, le=1000)
    #: The PostgreSQL URL leads to a pooler in transaction mode (PgBouncer's
    #: ``pool_mode = transaction``), where consecutive transactions of one connection may run
    #: on different server connections: the store then asks psycopg for no server-side
    #: prepared statements, which would be missing on the next server connection.
    db_transaction_pooler: bool = False
    #: The most malloc arenas a node worker's processes use, on glibc (bidding.nodes.arenas):
    #: each of a node's threads would otherwise keep an arena of its own, about 1.5 MB more
    #: on the sweeping node. 0 leaves glibc's default; ``MALLOC_ARENA_MAX`` (or glibc's
    #: ``arena_max`` tunable), when set, wins.
    malloc_arenas: int = Field(2, ge=0, le=1024)
    #: Days a finished task is kept in the store, with its bids, messages, ledger entries and
    #: graph rows; one node worker at a time prunes older ones, a tenth of this apart (at most
    #: hourly), and ``bidding prune`` does it by hand. What the nodes learned stays (their
    #: record and latest outcomes per task type: bidding.lifecycle.retention). 0 keeps all.
    retention_days: float = Field(30.0, ge=0, le=36500)
    #: Seconds between a node's heartbeats.
    heartbeat_interval: float = Field(2.0, gt=0)
    #: A node whose last heartbeat is older than this many seconds is not a candidate.
    heartbeat_ttl: float = Field(10.0, gt=0)
    #: Seconds a node that stopped being live without stopping cleanly (its worker lost the
    #: broker and is reconnecting, its heartbeats stopped reaching the store, it was killed
    #: and is being restarted) still counts as coming back, from when it stopped being live
    #: (a heartbeat TTL after its last heartbeat): a task no live node can do while such a
    #: node offers its skills waits for it (re-announced every heartbeat interval) instead
    #: of failing with "No bidders registered". 0 fails at once.
    liveness_grace: float = Field(10.0, ge=0, le=3600)
    #: Times an auction none of whose candidates answered (their workers restarting or
    #: reconnecting, a node killed before its heartbeat expired) is announced again, a
    #: heartbeat interval later, before it fails with "No bids received". 0 fails at once.
    silent_rounds: int = Field(2, ge=0, le=20)
    #: Seconds a producer caches the list of live nodes (an auction that finds no candidate
    #: in the cached list reads it again before it concludes anything).
    live_cache_seconds: float = Field(1.0, ge=0)
    #: Threads per node worker that answer bid requests (in the main process, never queued
    #: behind executions).
    bid_threads: int = Field(4, ge=1, le=256)
    #: Bid requests that may wait for a bid thread; one more is refused at once, saying the
    #: node is overloaded (queued, it would be answered after its auction closed, and the
    #: queue would grow without end while requests come faster than the node answers).
    bid_queue_size: int = Field(1024, ge=1, le=1_000_000)
    #: Seconds between a node worker's sweeps for auctions past their window.
    sweep_interval: float = Field(0.2, gt=0, le=60)
    #: Number of a node's latest episodes of a task type that make its experience score and
    #: its confidence there (the episodes before them, ``PRIOR_WINDOWS`` windows in all, make
    #: the confidence's prior: ``episodes_read``).
    experience_window: int = Field(10, ge=1)
    #: Failures within this many seconds count as "recent" for the x0.8 penalty.
    recent_failure_seconds: float = Field(3600.0, gt=0)
    #: Seconds an awarded task may wait to start, while its winner could have started it (a
    #: free pool process: the clock starts again while every one is busy), before it goes to
    #: the next-best bidder; 0 = only when the winner's node stops heartbeating. Per task:
    #: ``bidding={"schedule_to_start_timeout": ...}``.
    schedule_to_start_timeout: float = Field(60.0, ge=0)
    #: Without a schedule-to-start timeout: seconds after which an awarded task its live winner
    #: has not started is sent to it again, in case its message was lost (the process that
    #: awarded it died before sending); the wait doubles each time. 0 = never.
    delivery_check_seconds: float = Field(60.0, ge=0)
    #: Seconds between a node's hard and soft time limit (timeout_seconds is the soft one).
    hard_timeout_grace: float = Field(5.0, ge=0)
    #: The watch of delegated (ASSIGNED or EXECUTING) tasks, when no award, start or
    #: progress report is news: the first check this many seconds after the latest one...
    initial_check_wait_time: float = Field(30.0, gt=0, le=CHECK_WAIT_LIMIT)
    #: ...each check that finds no news multiplies the wait by this factor...
    check_backoff_factor: float = Field(2.0, ge=1, le=BACKOFF_FACTOR_LIMIT)
    #: ...up to this many seconds between checks...
    max_check_wait_time: float = Field(1800.0, gt=0, le=MAX_CHECK_WAIT_LIMIT)
    #: ...and after this many checks without news the task is escalated (a flag, the task
    #: keeps running). A node's profile may set its own in a ``[checking]`` table.
    max_check_attempts: int = Field(10, ge=1, le=CHECK_ATTEMPTS_LIMIT)
    #: Webhook that receives every notification (cost exceeded, escalated) as a JSON POST.
    notify_url: str | None = None
    #: Seconds a call to ``notify_url`` may take before it is given up (and logged).
    notify_timeout: float = Field(5.0, gt=0)
    #: Path of this worker's node profile (set by ``bidding worker`` or ``--bidding-profile``).
    profile: str | None = None
    #: The most bytes of JSON a call's args and kwargs may take together (``[args, kwargs]``,
    #: as the store keeps them): ``.delay()``, ``apply_async`` and ``self.retry(args=...)``
    #: refuse a larger call naming the task and the size, and ``bidding.submit`` (POST
    #: /aitp/tasks) a definition's input values or a subtask's literal input. Every attempt's
    #: row and message carries them: pass large data by reference (a URL, a path, a key).
    #: At most 1 GiB, PostgreSQL's largest text value.
    max_arguments_bytes: int = Field(1_048_576, ge=1024, le=1_073_741_824)
    #: ``bidding api``: when set, every write (POST) needs ``Authorization: Bearer <token>``
    #: (401 without it). Reads stay open unless ``api_read_token`` is set too. Without it,
    #: ``bidding api`` refuses to listen on a host other than the loopback (unless
    #: ``--allow-open``).
    api_token: str | None = Field(None, min_length=1, repr=False)
    #: ``bidding api``: when set, every read (GET) needs ``Authorization: Bearer <token>`` with
    #: this token (or the write token); while ``api_token`` is not set, writes need it too.
    api_read_token: str | None = Field(None, min_length=1, repr=False)
    #: ``bidding api``: the largest request body it reads, in bytes; a larger one is answered
    #: 413 naming this setting before it is parsed or stored (a chunked one too: reading stops
    #: at the limit).
    api_max_body_bytes: int = Field(1_048_576, ge=1024, le=1_073_741_824)

    #: The keyword rule, opt-in: keyword -> skill. A call that names no required
    #: skills (neither the task nor the call) requires the skills of the keywords found, as
    #: whole words and in any case, in its content and in the strings of its arguments;
    #: ``explain`` says so. From the environment: a JSON object.
    skill_keywords: dict[str, str] = Field(default_factory=dict)
    #: The routing map, opt-in: task type -> node name, the ``preferred_node`` of a
    #: call that names none (the composite strategy's x1.1 then applies to that node's bid).
    #: From the environment: a JSON object.
    preferred_nodes: dict[str, str] = Field(default_factory=dict)

    @field_validator("skill_keywords", "preferred_nodes", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        # From the environment: '{"pdf": "pdf_text_extraction"}'.
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ValueError(f"not a JSON object ({exc})") from None
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping (a JSON object from the environment)")
        return dict(value)

    @field_validator("skill_keywords")
    @classmethod
    def _keywords(cls, value: dict[str, str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for keyword, skill in value.items():
            if not keyword.strip() or not skill.strip():
                raise ValueError(f"{keyword!r} -> {skill!r}: keyword and skill must be "
                                 "non-empty")
            # Keywords match in any case: two spellings of one keyword are one keyword.
            key = keyword.strip().lower()
            if key in found and found[key] != skill.strip():
                raise ValueError(f"keyword {keyword.strip()!r} maps to two skills "
                                 f"({found[key]!r} and {skill.strip()!r})")
            found[key] = skill.strip()
        return found

    @field_validator("preferred_nodes")
    @classmethod
    def _routes(cls, value: dict[str, str]) -> dict[str, str]:
        for task_type, node in value.items():
            # The store's limits: a task type of 64 characters, a node name of 32.
            if not task_type.strip() or len(task_type) > 64:
                raise ValueError(f"task type {task_type!r}: 1 to 64 characters")
            if not node.strip() or len(node) > 32:
                raise ValueError(f"{task_type!r} -> {node!r}: a node name of 1 to 32 "
                                 "characters")
        return value

    @field_validator("allowed_strategies", mode="before")
    @classmethod
    def _paths(cls, value: Any) -> Any:
        # From the environment: "pkg.a:One,pkg.b:Two".
        if isinstance(value, str):
            return tuple(p.strip() for p in value.split(",") if p.strip())
        return value

    @property
    def episodes_read(self) -> int:
        """A node's latest episodes of a task type its bids read (and retention keeps):
        ``experience_window`` of them make its estimate, all of them that estimate's prior."""
        return self.experience_window * PRIOR_WINDOWS

    @property
    def strategy_allowlist(self) -> frozenset[str]:
        """The dotted strategy paths this process may import: ``bidding_allowed_strategies``
        and the configured default ``bidding_strategy``."""
        return frozenset((*self.allowed_strategies, self.strategy))

    @field_validator("bid_board")
    @classmethod
    def _board(cls, value: str) -> str:
        if value in ("auto", "store") or value.startswith(
                ("redis://", "rediss://", "unix://", "redis+socket://")):
            return value
        raise ValueError('must be "auto", "store" or a redis:// URL')


SETTING_NAMES: tuple[str, ...] = tuple(Settings.model_fields)


def load_settings(
    conf: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build :class:`Settings` from a Celery ``app.conf`` mapping, overridden by the environment.

    Raises :class:`ConfigurationError` naming the setting and the reason: by its environment
    variable (``BIDDING_WINDOW``) when its value came from there, else by its conf key
    (``bidding_window``).
    """
    conf = conf if conf is not None else {}
    environ = environ if environ is not None else os.environ
    unknown = sorted(str(k) for k in conf if str(k).startswith(CONF_PREFIX)
                     and str(k)[len(CONF_PREFIX):] not in SETTING_NAMES)
    if unknown:
        valid = ", ".join(CONF_PREFIX + n for n in SETTING_NAMES)
        raise ConfigurationError(
            f"unknown setting(s) {', '.join(unknown)}; valid settings: {valid}"
        )
    _refuse_unknown_variables(environ)
    values: dict[str, Any] = {}
    # Errors name a setting as the user wrote it: BIDDING_WINDOW when the environment set it.
    from_env: dict[str, str] = {}
    for name in SETTING_NAMES:
        env_name = ENV_PREFIX + name.upper()
        env_value = environ.get(env_name)
        if env_value is not None:
            values[name] = env_value
            from_env[name] = env_name
            continue
        conf_value = conf.get(CONF_PREFIX + name)
        if conf_value is not None:
            values[name] = conf_value
    try:
        return Settings(**values)
    except ValidationError as exc:
        reason = describe_validation(exc, CONF_PREFIX, from_env, model=Settings)
        raise ConfigurationError(f"invalid settings: {reason}") from None


def _refuse_unknown_variables(environ: Mapping[str, str]) -> None:
    """Refuse ``BIDDING_*`` variables that are no setting (a typo would otherwise be ignored
    silently, as the default it meant to change applies), naming each with a did-you-mean."""
    known = [ENV_PREFIX + name.upper() for name in SETTING_NAMES]
    unknown = sorted(k for k in environ if k.startswith(ENV_PREFIX) and k not in known
                     and k not in ENV_NOT_SETTINGS and not k.startswith(ENV_NOT_SETTINGS_PREFIXES))
    if not unknown:
        return
    clauses = []
    for name in unknown:
        # Matched without the prefix, which every name shares and would make all look close.
        close = difflib.get_close_matches(name[len(ENV_PREFIX):].lower(), SETTING_NAMES, n=1)
        hint = (f"did you mean {ENV_PREFIX + close[0].upper()}?" if close
                else f"valid settings: {', '.join(known)}")
        clauses.append(f"{name}: unknown bidding setting; {hint}")
    raise ConfigurationError("; ".join(clauses))


_ATTR = "_bidding_settings"
#: The only content types an app may accept: JSON, by name or by MIME type.
JSON_CONTENT = frozenset({"json", "application/json"})


#: The ``db_pool_size`` and ``db_transaction_pooler`` of the settings this process used last.
#: The store's engines are built per process and URL, not per app, so they are built from them
#: (``db_pool_size()``, ``db_transaction_pooler()``).
_pool_size = [Settings.model_fields["db_pool_size"].default]
_transaction_pooler = [False]


def db_pool_size() -> int:
    """Connections the store's engines built from now on keep open (``bidding_db_pool_size``
    of the settings this process used last)."""
    return int(_pool_size[0])


def db_transaction_pooler() -> bool:
    """Whether the store's engines built from now on go through a transaction pooler
    (``bidding_db_transaction_pooler`` of the settings this process used last)."""
    return bool(_transaction_pooler[0])


def use_store_settings(settings: Settings) -> None:
    """Make ``settings``' store connection options the ones engines are built with from now
    on (an app's settings do so when first read; a command without an app calls this)."""
    _pool_size[0] = settings.db_pool_size
    _transaction_pooler[0] = settings.db_transaction_pooler


def get_settings(app: Celery) -> Settings:
    """``app``'s bidding settings (``app.conf.bidding_*`` overridden by ``BIDDING_*``)."""
    found: Settings | None = getattr(app, _ATTR, None)
    if found is None:
        check_json_only(app)
        found = load_settings(dict(app.conf))
        setattr(app, _ATTR, found)
        use_store_settings(found)
    return found


def reset_settings(app: Celery) -> None:
    """Forget cached settings (after changing ``app.conf`` in tests)."""
    if hasattr(app, _ATTR):
        delattr(app, _ATTR)


def celery_conf(broker_url: str, result_backend: str | None = None) -> dict[str, Any]:
    """The Celery settings a bidding app's nodes want: JSON only (what ``check_json_only``
    enforces), executions fetched one at a time, and broker retries at start-up."""
    return {
        "broker_url": broker_url,
        "result_backend": result_backend or broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
    }


def check_json_only(app: Celery) -> None:
    """Refuse an app configured to send or accept pickle: bidding messages are JSON only."""
    conf = app.conf
    for key in ("task_serializer", "result_serializer"):
        if conf.get(key) != "json":
            raise ConfigurationError(f"{key}: must be 'json' for celery-bidding "
                                     f"(got {conf.get(key)!r})")
    for key in ("accept_content", "result_accept_content"):
        accepted = conf.get(key) or []
        bad = [c for c in accepted if str(c) not in JSON_CONTENT]
        if bad:
            raise ConfigurationError(f"{key}: must accept JSON only (got {list(accepted)!r})")
