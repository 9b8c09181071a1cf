"""A bidding task's options are checked when its class is made, not at its first call."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

import bidding
from bidding.config import celery_conf
from bidding.errors import ConfigurationError


def make_app() -> Celery:
    app = Celery("t", set_as_current=False)
    app.conf.update(celery_conf("memory://"))
    bidding.install(app)
    return app


def register(app: Celery, **options: Any) -> Any:
    """``@app.task(base=bidding.BiddingTask, **options)`` on a task named demo.tasks.work."""

    @app.task(base=bidding.BiddingTask, name="demo.tasks.work", shared=False, **options)
    def work(*args: Any) -> None:
        """Never runs: the tests only register it."""

    return work


@pytest.mark.parametrize(
    ("options", "option", "meant"),
    [
        ({"required_skill": ["pdf"]}, "required_skill=['pdf']", "required_skills"),
        ({"task_typ": "extraction"}, "task_typ='extraction'", "task_type"),
        ({"retry_polcy": bidding.RetryPolicy()}, "retry_polcy=", "retry_policy"),
        ({"biding": {"budget": 1.0}}, "biding=", "bidding"),
        ({"skills": ["pdf"]}, "skills=['pdf']", "required_skills"),
        ({"budget": 2.0}, "budget=2.0", "bidding={'budget': ...}"),
        ({"preferred_nodes": "redfin"}, "preferred_nodes='redfin'",
         "bidding={'preferred_node': ...}"),
    ],
)
def test_misspelt_option_on_the_decorator_is_refused_when_the_worker_starts(
    options: dict[str, Any], option: str, meant: str
) -> None:
    # given a bidding task registered with a misspelt (or misplaced) option
    app = make_app()
    register(app, **options)
    # when the app is finalized, as a worker does at start (or a caller at the first call)
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    # then the error names the task and the option, and says which option it meant
    message = str(info.value)
    assert message.startswith(f"task demo.tasks.work: unknown option {option}"), message
    assert message.endswith(f"; did you mean {meant}?"), message


def test_misspelt_option_is_refused_by_the_decorator_of_a_finalized_app() -> None:
    # given an app already finalized (its tasks are made as they are declared)
    app = make_app()
    app.finalize()
    # when a task is declared with required_skill, then the decorator itself refuses it
    with pytest.raises(ConfigurationError, match="did you mean required_skills"):
        register(app, required_skill=["pdf"])


def test_misspelt_attribute_of_a_class_based_task_is_refused() -> None:
    # given a task written as a class, with a typo in its class attributes
    # when the class is defined, then it is refused naming the class
    with pytest.raises(ConfigurationError) as info:
        class Extract(bidding.BiddingTask):  # type: ignore[misc]  # Celery's Task is untyped
            name = "demo.tasks.extract"
            required_skils = ["pdf"]
    assert str(info.value) == ("task demo.tasks.extract: unknown option required_skils=['pdf']; "
                               "did you mean required_skills?")


def test_only_misspelt_options_are_refused_not_celerys_or_the_tasks_own() -> None:
    # given a task with Celery's own options (autoretry's too), the bidding options spelt
    # right, attributes of its own that look like no bidding option, and one typo, last
    options: dict[str, Any] = {
        "bind": True, "queue": "q", "max_retries": 3, "rate_limit": "1/s",
        "autoretry_for": (ValueError,), "retry_backoff": True, "retry_jitter": False,
        "retry_kwargs": {"max_retries": 2}, "task_type": "extraction",
        "retry_policy": bidding.RetryPolicy(max_retries=1),
        "bidding": {"budget": 1.0, "strategy": "registered_later"}, "max_size": 10,
        "bid": True,
    }
    app = make_app()
    register(app, **options, required_skill=["pdf"])
    # when the app is finalized, then only the typo is refused
    with pytest.raises(ConfigurationError, match=r"^task demo\.tasks\.work: unknown option "
                       r"required_skill=\['pdf'\]; did you mean required_skills\?$"):
        app.finalize()
    # and with the typo fixed, the task is made with its options
    fixed = make_app()
    task = register(fixed, **options, required_skills=["pdf"])
    fixed.finalize()
    assert task.required_skills == ["pdf"]
    assert task.max_size == 10


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"bidding": {"budgett": 1.0}},
         "task demo.tasks.work: bidding: unknown option(s) budgett; did you mean budget?; "),
        ({"bidding": {"priority": 12}},
         "bidding options of demo.tasks.work: priority: 12 is not a priority; give \"high\" (8), "
         "\"normal\" (5), \"low\" (2) or an integer from 0 to 9 (higher is more urgent) (got 12)"),
        ({"required_skills": [" "]}, "bidding options of demo.tasks.work: required_skills: "),
        ({"retry_policy": {"max_retries": -1}},
         "bidding options of demo.tasks.work: retry_policy.max_retries: Input should be greater "
         "than or equal to 0 (got -1)"),
    ],
)
def test_bad_defaults_on_the_decorator_are_refused_when_the_worker_starts(
    options: dict[str, Any], expected: str
) -> None:
    # given a task whose defaults every call would be refused for
    app = make_app()
    register(app, **options)
    # when the app is finalized, then the task is refused, named, with the field and reason
    with pytest.raises(ConfigurationError) as info:
        app.finalize()
    assert str(info.value).startswith(expected), str(info.value)
