"""``BiddingTask``: the base class that turns ``.delay()`` into an auction.

```python
@app.task(base=bidding.BiddingTask, task_type="extraction",
          required_skills=["pdf_text_extraction"])
def extract(url): ...

extract.delay(url).get()                          # auction, then run on the winner
extract.apply_async([url], bidding={"strategy": "composite", "budget": 2.0})
```
On the winning node the same class records the attempt (accepted, completed or failed) and
refuses to run a task twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore
from celery.result import AsyncResult

from bidding import execution
from bidding.announce import announce, build_announcement, check_options
from bidding.award import ATTEMPT_HEADER, NODE_HEADER
from bidding.models import RetryPolicy
from bidding.settings import get_settings


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


class BiddingTask(Task):  # type: ignore[misc]  # Celery's Task is untyped
    """A Celery task whose calls are auctioned among live nodes before they run."""

    #: The kind of work, used for experience (defaults to the task's short name).
    task_type: ClassVar[str | None] = None
    #: Skills a node needs to bid (seed 000's required_capabilities).
    required_skills: ClassVar[list[str] | tuple[str, ...]] = ()
    #: Default ``bidding={...}`` options of every call of this task.
    bidding: ClassVar[Mapping[str, Any]] = {}
    #: Retry policy of an attempt (AITP 6.1).
    retry_policy: ClassVar[RetryPolicy | None] = None

    #: Executions are acknowledged after they finish and requeued if the worker dies.
    acks_late = True
    reject_on_worker_lost = True

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        bidding: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Announce this call for bidding and return the AsyncResult of its execution."""
        if self.app.conf.task_always_eager:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                       shadow, **options)
        settings = get_settings(self.app)
        defaults = dict(self.bidding or {})
        check_options(defaults, f"{self.name} bidding defaults")
        call = dict(bidding or {})
        check_options(call, f"{self.name}.apply_async(bidding=...)")
        rfp = build_announcement(self, settings, args, kwargs, {**defaults, **call}, task_id)
        return announce(self.app, settings, rfp, link=link, link_error=link_error)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task body; on a node, record the attempt around it and skip duplicates."""
        request = self.request
        attempt = _header(request, ATTEMPT_HEADER)
        if request.called_directly or attempt is None:
            return super().__call__(*args, **kwargs)
        settings = get_settings(self.app)
        node = str(_header(request, NODE_HEADER))
        attempt = int(attempt)
        start = execution.begin(settings, request.id, attempt, node)
        if start is execution.Start.DUPLICATE:
            raise Ignore()
        began = time.monotonic()
        try:
            result = self.run(*args, **kwargs)
        except Exception as exc:
            if start is not execution.Start.UNKNOWN:
                execution.finish(settings, request.id, attempt, node, success=False,
                                 duration_s=time.monotonic() - began,
                                 error=f"{type(exc).__name__}: {exc}")
            raise
        if start is not execution.Start.UNKNOWN:
            execution.finish(settings, request.id, attempt, node, success=True,
                             duration_s=time.monotonic() - began)
        return result
