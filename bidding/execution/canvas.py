"""Celery's canvas around a bidding task: ``link``, ``link_error``, chains, groups and chords.

Celery carries a call's callbacks, errbacks, the rest of its chain, its group and chord in the
task message, and the worker that runs the task acts on them (``celery.app.trace``). A bidding
task's message is sent later, by whichever process awards it, so the call's canvas is kept in
its announcement (``Announcement.canvas``, JSON like the rest) and put into every execution
message of the task, as ``send_task`` would have. A retry is a new execution with the same
canvas, so the callbacks run once, after the attempt that succeeds. When the task fails without
any attempt running (no bids, escalated, its winner lost with ``on_agent_offline="fail"``),
``report.fail_caller`` stores the failure with the request ``caller_request`` makes, as a worker
would: the errbacks run, the chain and the chord learn of it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from celery import Celery
from celery.app.task import Context
from kombu.utils.functional import maybe_list

from bidding.errors import ConfigurationError
from bidding.models import Announcement, CanvasOptions


def _plain(value: Any, what: str) -> Any:
    """``value`` as plain JSON (what the announcement stores); a clear error if it is not."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{what}: not JSON serializable ({exc}); celery-bidding sends JSON only") from None


def _signatures(value: Any, what: str) -> list[dict[str, Any]] | None:
    """A signature or a list of them, as plain dicts (a Celery ``Signature`` is a dict)."""
    if value is None:
        return None
    items: list[Any] = maybe_list(value)  # type: ignore[no-untyped-call]  # kombu is untyped
    if not all(isinstance(item, Mapping) for item in items):
        raise ConfigurationError(f"{what}: expected Celery signatures (task.s(...)), "
                                 f"got {type(value).__name__}")
    return [_plain(dict(item), what) for item in items]


def canvas_of(app: Celery, link: Any = None, link_error: Any = None,
              options: Mapping[str, Any] | None = None) -> CanvasOptions:
    """The canvas of one ``apply_async`` call: its ``link``/``link_error`` and the options
    Celery's canvas passes (``chain``, ``group_id``, ``group_index``, ``chord``, ``root_id``,
    ``parent_id``). Called from inside a task, the caller becomes the parent (Flower's tree),
    as with ``send_task``."""
    options = options or {}
    root_id, parent_id = options.get("root_id"), options.get("parent_id")
    parent = app.current_worker_task
    if parent is not None and parent.request.id:
        root_id = root_id or parent.request.root_id or parent.request.id
        parent_id = parent_id or parent.request.id
    chord = options.get("chord")
    return CanvasOptions(
        callbacks=_signatures(link, "link"),
        errbacks=_signatures(link_error, "link_error"),
        chain=_signatures(options.get("chain"), "chain"),
        group_id=options.get("group_id"),
        group_index=options.get("group_index"),
        chord=None if chord is None else _plain(dict(chord), "chord"),
        root_id=root_id,
        parent_id=parent_id,
    )


def message_options(canvas: CanvasOptions) -> dict[str, Any]:
    """The keyword arguments of ``amqp.create_task_message`` that carry ``canvas``."""
    return {"callbacks": canvas.callbacks, "errbacks": canvas.errbacks, "chain": canvas.chain,
            "group_id": canvas.group_id, "group_index": canvas.group_index,
            "chord": canvas.chord, "root_id": canvas.root_id, "parent_id": canvas.parent_id}


def caller_request(announcement: Announcement) -> Context:
    """The request a worker would have had for ``announcement``, for the result backend's failure
    handling (errbacks, the chain after it, its chord)."""
    canvas = announcement.canvas
    return Context(
        id=announcement.task_id,
        task=announcement.task_name,
        args=announcement.args,
        kwargs=announcement.kwargs,
        callbacks=canvas.callbacks,
        errbacks=canvas.errbacks,
        chain=canvas.chain,
        group=canvas.group_id,
        group_index=canvas.group_index,
        chord=canvas.chord,
        root_id=canvas.root_id or announcement.task_id,
        parent_id=canvas.parent_id,
        delivery_info={},
        hostname=None,
        ignore_result=False,
    )
