"""An app's bidding settings: JSON only, conf and environment, cached per app."""

from __future__ import annotations

import pytest
from celery import Celery

from bidding.config import check_json_only, get_settings, reset_settings
from bidding.errors import ConfigurationError


def make_app(**conf: object) -> Celery:
    app = Celery("t", set_as_current=False)
    app.conf.update(broker_url="memory://", **conf)
    return app


def test_default_celery_serialization_is_accepted() -> None:
    # given an app with Celery's defaults (JSON), then nothing is refused
    check_json_only(make_app())


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"task_serializer": "pickle"}, "task_serializer"),
        ({"result_serializer": "pickle"}, "result_serializer"),
        ({"accept_content": ["json", "pickle"]}, "accept_content"),
        ({"result_accept_content": ["application/x-python-serialize"]}, "result_accept_content"),
    ],
)
def test_an_app_configured_for_pickle_is_refused(conf: dict[str, object], field: str) -> None:
    # given an app that would send or accept pickle
    app = make_app(**conf)
    # when its bidding settings are first read, then it is refused naming the setting
    with pytest.raises(ConfigurationError, match=field):
        get_settings(app)


def test_settings_come_from_conf_and_are_cached_until_reset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given an app with a window in its conf and no environment override
    monkeypatch.delenv("BIDDING_WINDOW", raising=False)
    app = make_app(bidding_window=0.75)
    # when the settings are read twice, then the same object comes back
    first = get_settings(app)
    assert first.window == 0.75
    assert get_settings(app) is first
    # and after a conf change they are re-read only once reset
    app.conf.bidding_window = 1.5
    assert get_settings(app).window == 0.75
    reset_settings(app)
    assert get_settings(app).window == 1.5


def test_a_misspelt_setting_is_refused_with_the_valid_names() -> None:
    # given a typo in a bidding setting, then the first use names it and lists the valid ones
    with pytest.raises(ConfigurationError, match=r"bidding_windwo.*bidding_window"):
        get_settings(make_app(bidding_windwo=1.0))


def test_celery_conf_is_accepted_by_the_json_only_check() -> None:
    # given an app configured with bidding's recommended Celery settings
    from bidding.config import celery_conf

    app = Celery("t", set_as_current=False)
    app.conf.update(celery_conf("memory://", "cache+memory://"))
    # then it passes the JSON-only check, fetches one message at a time, keeps both URLs
    check_json_only(app)
    assert app.conf.worker_prefetch_multiplier == 1
    assert (app.conf.broker_url, app.conf.result_backend) == ("memory://", "cache+memory://")
    # and the backend defaults to the broker
    assert celery_conf("redis://h/0")["result_backend"] == "redis://h/0"


def test_worker_with_an_unknown_default_strategy_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given an app whose workers are told to use a strategy that does not exist
    from types import SimpleNamespace

    import bidding
    from bidding.app import NodeStep
    monkeypatch.setenv("BIDDING_STRATEGY", "cheapest")
    app = make_app()
    bidding.install(app)
    # when a worker starts (its node step loads the settings)
    with pytest.raises(ConfigurationError) as info:
        NodeStep(SimpleNamespace(app=app))
    # then it is refused in one line naming the variable, the strategy and the valid names
    message = str(info.value)
    assert message.startswith("invalid settings: BIDDING_STRATEGY: unknown strategy 'cheapest'")
    assert "weighted" in message
    assert "\n" not in message
    # and once the operator names a strategy that exists, the worker starts
    monkeypatch.setenv("BIDDING_STRATEGY", "composite")
    fixed = make_app()
    bidding.install(fixed)
    NodeStep(SimpleNamespace(app=fixed))


def test_unknown_default_strategy_in_conf_is_named_by_its_conf_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given the same mistake in app.conf instead of the environment
    from bidding.app import check_default_strategy

    monkeypatch.delenv("BIDDING_STRATEGY", raising=False)
    app = make_app(bidding_strategy="cheapest")
    # when a worker checks it, then the message names bidding_strategy
    with pytest.raises(ConfigurationError) as info:
        check_default_strategy(get_settings(app))
    assert str(info.value).startswith("invalid settings: bidding_strategy: unknown strategy ")
