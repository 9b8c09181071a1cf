"""The Celery app of the integration tests; worker subprocesses load it with -A."""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

import redis
from celery import Celery
from pydantic import BaseModel

import bidding
from bidding.config import celery_conf

_DB = int(os.environ.get("BIDDING_TEST_REDIS_DB", "11"))
BROKER = os.environ.get("BIDDING_IT_BROKER", f"redis://127.0.0.1:6379/{_DB}")
BACKEND = os.environ.get("BIDDING_IT_BACKEND", BROKER)
#: Where task bodies count their executions (a separate Redis db from the broker's).
COUNTERS = os.environ.get("BIDDING_IT_COUNTERS", f"redis://127.0.0.1:6379/{_DB + 1}")

app = Celery("bidding_it")
app.conf.update(
    **celery_conf(BROKER, BACKEND),
    worker_hijack_root_logger=False,
    bidding_window=float(os.environ.get("BIDDING_IT_WINDOW", "1.0")),
)
if os.environ.get("BIDDING_IT_RESULT_RETRIES"):
    # Outage tests: Celery gives up writing a result soon, so the store's report is what
    # reaches the caller.
    app.conf.result_backend_max_retries = int(os.environ["BIDDING_IT_RESULT_RETRIES"])
bidding.install(app)


class PreferredOnly:
    """A strategy that awards only the preferred node's bid (tests that need one node)."""

    def select(self, bids: Any, announcement: Any, capabilities: Any) -> Any:
        return next((b for b in bids if b.node == announcement.preferred_node), None)


bidding.register_strategy("preferred_only", PreferredOnly)

# The documented cost-aware strategy, exactly as docs/guides/bidding.md shows it: importing it
# registers "cost_aware" here and in every worker (tests/integration/test_figures.py).
import examples.strategies.cost_aware  # noqa: E402, F401

_counters: redis.Redis | None = None


def counters() -> redis.Redis:
    """The Redis client task bodies record executions with."""
    global _counters
    if _counters is None:
        _counters = redis.Redis.from_url(COUNTERS)
    return _counters


def _run(task: Any, value: Any, seconds: float) -> dict[str, Any]:
    counters().incr(f"exec:{task.request.id}")
    if seconds:
        time.sleep(seconds)
    return {"node": str(task.request.hostname).split("@")[0], "value": value}


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="shared_work",
          required_skills=["shared"])
def shared(self: Any, value: Any, seconds: float = 0.0) -> dict[str, Any]:
    """Work every test node can do."""
    return _run(self, value, seconds)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="gpu_work", required_skills=["gpu"])
def gpu(self: Any, value: Any) -> dict[str, Any]:
    """Work only the gpu node can do."""
    return _run(self, value, 0.0)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="approach_work", required_skills=["gpu"])
def approach(self: Any, value: Any) -> dict[str, Any]:
    """Returns the award it runs under (only the gpu node can do it)."""
    award = bidding.current_award()
    assert award is not None, "a bidding task's body runs under an award"
    return {"proposal": award.proposal, "node": award.node, "score": award.score,
            "attempt": award.attempt, "budget_left": award.budget_left,
            "task_id": award.task_id, "worker": str(self.request.hostname).split("@")[0]}


class Order(BaseModel):
    """A pydantic model argument (Celery's ``pydantic=True``)."""

    item: str
    quantity: int


class Receipt(BaseModel):
    """A pydantic model result (Celery's ``pydantic=True`` returns its JSON dict)."""

    item: str
    total: int
    node: str


@app.task(shared=False, base=bidding.BiddingTask, bind=True, pydantic=True,
          capability="it_order", required_skills=["shared"])
def order(self: Any, order: Order, price: int = 2) -> Receipt:
    """Takes a model, returns a model: validated and dumped by Celery's pydantic wrapper."""
    assert isinstance(order, Order), type(order)
    return Receipt(item=order.item, total=order.quantity * price,
                   node=str(self.request.hostname).split("@")[0])


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="untagged_work")
def untagged(self: Any, text: str) -> dict[str, Any]:
    """Names no skills: any node bids, unless the coordinator's rules infer some."""
    return _run(self, text, 0.0)


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="phantom_work",
          required_skills=["phantom"])
def phantom(self: Any, value: Any) -> dict[str, Any]:
    """Work only a node without a consumer (the ghost) claims to do."""
    return _run(self, value, 0.0)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="failing", required_skills=["shared"])
def failing(self: Any, message: str) -> None:
    """Raises on the node: the failure reaches the caller and is recorded."""
    counters().incr(f"exec:{self.request.id}")
    raise ValueError(message)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="flaky", required_skills=["shared"])
def flaky(self: Any, key: str, fail_times: int) -> dict[str, Any]:
    """Fails its first ``fail_times`` attempts (counted across nodes), then succeeds."""
    n = counters().incr(f"attempts:{key}")
    counters().rpush(f"nodes:{key}", str(self.request.hostname).split("@")[0])
    if n <= fail_times:
        raise RuntimeError(f"attempt {n} fails on purpose")
    return {"node": str(self.request.hostname).split("@")[0], "attempts": n}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="slow", required_skills=["shared"])
def slow(self: Any, key: str, seconds: float) -> dict[str, Any]:
    """Counts how often it starts and how often it runs to completion."""
    counters().incr(f"started:{key}")
    counters().rpush(f"nodes:{key}", str(self.request.hostname).split("@")[0])
    time.sleep(seconds)
    counters().incr(f"finished:{key}")
    return {"node": str(self.request.hostname).split("@")[0]}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="sleepy", required_skills=["shared"])
def sleepy(self: Any, seconds: float) -> dict[str, Any]:
    """Sleeps; with a soft time limit shorter than ``seconds`` it times out."""
    time.sleep(seconds)
    return {"node": str(self.request.hostname).split("@")[0], "slept": seconds}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="metered", required_skills=["shared"])
def metered(self: Any, units: float) -> str:
    """Reports the units it consumed (its cost is the node's price times units)."""
    self.report_units(units)
    return "done"


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="shaped", required_skills=["shared"])
def shaped(self: Any, value: Any) -> dict[str, Any]:
    """Returns ``{"value": value}``: valid or not against a schema, depending on ``value``."""
    return {"value": value}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="steps", required_skills=["shared"])
def steps(self: Any, n: int, pause: float) -> int:
    """Reports progress after each of ``n`` steps."""
    for i in range(1, n + 1):
        time.sleep(pause)
        self.progress(i, n, f"step {i}")
    return n


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="retrying", required_skills=["shared"],
          max_retries=5)
def retrying(self: Any, key: str, times: int) -> dict[str, Any]:
    """Calls self.retry(countdown=0.3) ``times`` times, as Celery users do."""
    n = counters().incr(f"attempts:{key}")
    counters().rpush(f"nodes:{key}", str(self.request.hostname).split("@")[0])
    if n <= times:
        raise self.retry(countdown=0.3)
    return {"node": str(self.request.hostname).split("@")[0], "attempts": n}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="swelling", required_skills=["shared"])
def swelling(self: Any, key: str, size: int, blob: str = "") -> int:
    """Without a ``blob``, retries itself with one of ``size`` characters (perhaps over
    ``bidding_max_arguments_bytes``); with one, returns its length."""
    counters().incr(f"attempts:{key}")
    if not blob:
        raise self.retry(args=(key, size, "x" * size), countdown=0.1)
    return len(blob)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="late", required_skills=["late_skill"])
def late(self: Any, value: Any) -> dict[str, Any]:
    """Only a node that joins later can do this."""
    return _run(self, value, 0.0)


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="ghostly",
          required_skills=["shared", "ghostly"])
def ghostly(self: Any, value: Any) -> dict[str, Any]:
    """The ghost (a node that bids but never runs anything) matches this best."""
    return _run(self, value, 0.0)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="stubborn", required_skills=["shared"])
def stubborn(self: Any, seconds: float) -> str:
    """Ignores its soft time limit, so only the hard limit stops it."""
    from celery.exceptions import SoftTimeLimitExceeded

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(SoftTimeLimitExceeded):
            time.sleep(0.05)
    return "finished"


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="total", required_skills=["shared"])
def total(self: Any, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The sum of ``shared``'s values (a chord's body, or the next link of a chain)."""
    return _run(self, sum(part["value"] for part in parts), 0.0)


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="remember", required_skills=["shared"])
def remember(self: Any, task_id: str, key: str) -> str:
    """An errback (``link_error``): keeps the id of the task that failed, under ``key``."""
    counters().rpush(key, task_id)
    return task_id


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          task_type="countdown", required_skills=["shared"],
          max_retries=2)
def countdown(self: Any, key: str, n: int) -> list[int]:
    """Retries itself with ``n - 1`` (``self.retry(args=...)``) until ``n`` is 0."""
    counters().rpush(f"args:{key}", n)
    if n > 0:
        raise self.retry(args=(key, n - 1), countdown=0.1)
    return [int(v) for v in counters().lrange(f"args:{key}", 0, -1)]


# --- AITP capabilities (task graphs, issue 12): every test node can run them ("shared") ------


@app.task(shared=False, base=bidding.BiddingTask, bind=True, capability="pdf_text_extraction",
          required_skills=["shared"])
def extract_text(self: Any, paper_pdf_url: str, max_pages: int = 50) -> dict[str, Any]:
    """Seed 004's subtask 1: the 'text' is made from the URL; says what type max_pages had."""
    counters().incr(f"exec:{self.request.id}")
    words = [w for w in paper_pdf_url.replace("/", " ").replace(".", " ").split() if w]
    return {"extracted_text": " ".join(words), "pages": max_pages,
            "max_pages_type": type(max_pages).__name__}


@app.task(shared=False, base=bidding.BiddingTask, bind=True, capability="nlp_analysis",
          required_skills=["shared"])
def analyze_text(self: Any, text: str) -> dict[str, Any]:
    """Seed 004's subtask 2: the longest words of the text."""
    counters().incr(f"exec:{self.request.id}")
    return {"analysis": sorted(set(text.split()), key=lambda w: (-len(w), w))[:3]}


@app.task(shared=False, base=bidding.BiddingTask, bind=True, capability="orchestration",
          required_skills=["shared"])
def aggregate(self: Any, raw_text: str, nlp_results: list[str]) -> dict[str, Any]:
    """Seed 004's subtask 3."""
    counters().incr(f"exec:{self.request.id}")
    return {"hypothesis": f"{nlp_results[0]} matters", "results": nlp_results,
            "methodology": f"read {len(raw_text.split())} words", "limitations": "none"}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          capability="it_echo", required_skills=["shared"])
def echo(self: Any, value: Any, key: str = "") -> dict[str, Any]:
    """Returns its value; counts its runs under ``ran:<key>``."""
    if key:
        counters().incr(f"ran:{key}")
    return {"value": value, "node": str(self.request.hostname).split("@")[0]}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          capability="it_sleep", required_skills=["shared"])
def nap(self: Any, seconds: float, label: str, key: str = "") -> dict[str, Any]:
    """Sleeps ``seconds``; returns its label and node; counts finished naps under
    ``napped:<key>``."""
    time.sleep(seconds)
    if key:
        counters().incr(f"napped:{key}")
    return {"label": label, "node": str(self.request.hostname).split("@")[0]}


@app.task(shared=False, base=bidding.BiddingTask, bind=True,
          capability="it_fail", required_skills=["shared"])
def broken(self: Any, message: str) -> dict[str, Any]:
    """Always fails with ``message``."""
    raise ValueError(message)


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="doomed",
          required_skills=["doomed"], bidding={"min_confidence": 0.0, "min_trust": 0.0})
def doomed(self: Any, n: int) -> None:
    """Fails on purpose, saying in which process (the memory test's failures; its own task
    type, so that no other test's nodes learn from it)."""
    counters().rpush("doomed:pids", os.getpid())
    raise ValueError(f"doomed {n}")


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="census",
          required_skills=["doomed"], bidding={"min_trust": 0.0})
def census(self: Any) -> dict[str, int]:
    """How many of Celery's exception infos (one per failed task, until collected) this pool
    process still holds, without collecting anything itself."""
    import gc

    from billiard.einfo import ExceptionInfo

    held = sum(isinstance(o, ExceptionInfo) for o in gc.get_objects())
    return {"pid": os.getpid(), "exception_infos": held}


@app.task(shared=False, base=bidding.BiddingTask, task_type="arenas",
          required_skills=["doomed"], bidding={"min_trust": 0.0})
def arenas() -> int:
    """How many malloc arenas eight threads that allocate at once end up with in this pool
    process (``tests.arenas``)."""
    from tests.arenas import arenas_after_threads

    return arenas_after_threads(8)


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="queued",
          required_skills=["shared"])
def queued(self: Any, label: str, key: str, seconds: float = 0.0) -> str:
    """Records that it started (its label, in order, under ``started:<key>``), then sleeps."""
    counters().rpush(f"started:{key}", label)
    if seconds:
        time.sleep(seconds)
    return label


def _span(task: Any, key: str, seconds: float) -> dict[str, Any]:
    """Sleep ``seconds``, recording when this attempt ran and where (``spans:<key>``)."""
    node = str(task.request.hostname).split("@")[0]
    began = time.time()
    time.sleep(seconds)
    counters().rpush(f"spans:{key}", json.dumps([node, began, time.time()]))
    return {"node": node}


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="infer_work",
          required_skills=["infer"])
def infer(self: Any, key: str, seconds: float) -> dict[str, Any]:
    """GPU work whose memory each call names (``bidding={"resources": ...}``)."""
    return _span(self, key, seconds)


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="big_model_work",
          required_skills=["infer"], resources={"gpu_mem_gb": 30})
def load_big_model(self: Any, key: str, model: str) -> dict[str, Any]:
    """Needs 30 GB of GPU memory (the task's own declaration); marks ``model`` warm where it
    ran."""
    warm = bidding.mark_warm(model)
    return {**_span(self, key, 0.0), "warm": warm}


@app.task(shared=False, base=bidding.BiddingTask, bind=True, task_type="warm_work",
          required_skills=["infer"])
def warm_call(self: Any, key: str) -> dict[str, Any]:
    """Asks for a warm model per call (``bidding={"affinity": [...]}``)."""
    return _span(self, key, 0.0)
