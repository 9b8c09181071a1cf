"""Exceptions raised by celery-bidding.

Every exception a caller can see is defined here, so ``except bidding.BiddingError`` catches them
all. They carry plain messages only, because they travel through Celery's JSON result backend.
"""

from __future__ import annotations


class BiddingError(Exception):
    """Base class of every celery-bidding error."""


class ConfigurationError(BiddingError, ValueError):
    """A setting, task option or profile is invalid; the message names the field and the reason."""


class ProfileError(ConfigurationError):
    """A node profile (TOML) failed to load or validate."""


class UnknownStrategyError(ConfigurationError, LookupError):
    """A strategy name that is not registered; the message lists the valid names."""


class NoBidsError(BiddingError):
    """An auction ended without a winner (no bidders, no bids, or none valid).

    The message is one of seed 001's outcomes, e.g. ``"No bidders registered"`` or
    ``"No bids met minimum confidence"``, followed by the details.
    """


class OutputValidationError(BiddingError):
    """The task's result does not match its output schema (COMPLETED -> FAILED)."""


class CostExceededError(BiddingError):
    """The task spent more than its budget; it is failed and a notification sent."""


class EscalatedError(BiddingError):
    """The task needs a human: it was deferred too often or no node could take it."""


class DeadlinePassedError(BiddingError):
    """The task had not started by its deadline: it never starts (see ``TaskExpiredError``,
    which is what is raised now; this name is kept for code that catches it)."""


class TaskExpiredError(DeadlinePassedError):
    """The task had not started by its expiry (Celery's ``expires``, ``bidding={"expires":
    ...}``) or its deadline (AITP ``metadata.deadline``): it never starts, and ends FAILED.
    The message starts with ``expired:`` and says which limit passed, and where the task was
    waiting. A retry that would be due after it is not run either: the expiry is the task's,
    not an attempt's."""


class NodeLostError(BiddingError):
    """The winning node went offline (or never started the task) and its fallback is to fail."""


class NotRecordedError(BiddingError):
    """The task's award could not be recorded: the store refused a value of it, or no writer of
    the write-behind journal could read its entry (written by a newer version). The task is
    FAILED without running; the message says why."""


class UnknownTaskError(BiddingError, LookupError):
    """No announcement with this task id is in the store."""


class SubtaskFailedError(BiddingError):
    """A task graph failed: ``subtask`` (its id) failed after its retries, for ``reason``."""

    def __init__(self, message: str, subtask: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.subtask = subtask
        self.reason = reason
