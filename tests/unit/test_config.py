"""Unit tests of bidding.config settings and of model validation at the boundary."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from bidding.config import Settings, load_settings
from bidding.errors import ConfigurationError
from bidding.models import Announcement, RetryPolicy

# --- load_settings --------------------------------------------------------------------------


def test_defaults_without_conf_or_environment():
    # given no app.conf values and an empty environment
    settings = load_settings({}, {})
    # then the documented defaults apply
    assert settings.window == 2.0
    assert settings.strategy == "weighted"
    assert settings.no_bid == "fail"
    assert settings.min_confidence == 0.5
    assert settings.min_trust == 50.0
    assert settings.candidate_cap == "auto"
    assert settings.database_url == "sqlite:///bidding.db"
    assert settings.bid_threads == 4
    assert settings.sweep_interval == 0.2
    assert settings.experience_window == 10
    assert settings.profile is None
    assert settings == Settings()


def test_the_boundarys_limits_default_to_one_mib():
    # given nothing set, then a request body and a call's arguments may have 1 MiB each
    settings = load_settings({}, {})
    assert settings.api_max_body_bytes == 1_048_576
    assert settings.max_arguments_bytes == 1_048_576
    # and either is a setting, from app.conf or the environment
    assert load_settings({"bidding_api_max_body_bytes": 4096}, {}).api_max_body_bytes == 4096
    assert load_settings({}, {"BIDDING_MAX_ARGUMENTS_BYTES": "2048"}).max_arguments_bytes == 2048


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("api_max_body_bytes", 0, "greater than or equal to 1024"),
    ("api_max_body_bytes", 2**31, "less than or equal to 1073741824"),
    ("max_arguments_bytes", 100, "greater than or equal to 1024"),
    ("max_arguments_bytes", -1, "greater than or equal to 1024")])
def test_a_limit_out_of_its_bounds_is_refused_naming_the_setting(name, value, reason):
    # given a limit below 1 KiB (nothing useful fits) or above 1 GiB (PostgreSQL's largest
    # text value)
    with pytest.raises(ConfigurationError) as info:
        load_settings({f"bidding_{name}": value}, {})
    # then the message names the setting and the bound
    assert f"bidding_{name}: Input should be {reason} (got {value})" in str(info.value)


def test_defaults_when_nothing_is_passed(monkeypatch):
    # given no arguments and no BIDDING_* variable in the process environment
    monkeypatch.delenv("BIDDING_WINDOW", raising=False)
    # then load_settings() reads os.environ and still gives the default window
    assert load_settings().window == 2.0


def test_conf_mapping_is_read():
    # given app.conf-style keys
    conf = {"bidding_window": 0.5, "bidding_strategy": "composite", "bidding_no_bid": "fallback"}
    # when settings are loaded
    settings = load_settings(conf, {})
    # then they are used
    assert settings.window == 0.5
    assert settings.strategy == "composite"
    assert settings.no_bid == "fallback"


def test_conf_none_means_default():
    # given a conf key explicitly set to None (Celery's "unset")
    # then the default is used
    assert load_settings({"bidding_window": None}, {}).window == 2.0


def test_environment_overrides_conf():
    # given conf window 0.5 and BIDDING_WINDOW=0.25 in the environment
    settings = load_settings({"bidding_window": 0.5}, {"BIDDING_WINDOW": "0.25"})
    # then the environment wins and the string is parsed as a number
    assert settings.window == 0.25


def test_environment_strings_are_parsed():
    # given environment values, all strings
    env = {"BIDDING_AUTO_MIGRATE": "false", "BIDDING_CANDIDATE_CAP": "4", "BIDDING_PROFILE": "x"}
    settings = load_settings({}, env)
    # then they are converted to the settings' types
    assert settings.auto_migrate is False
    assert settings.candidate_cap == 4
    assert settings.profile == "x"


def test_the_candidate_cap_takes_auto_or_a_number_and_refuses_anything_else():
    # given the cap from the environment: "auto", a number, then a negative one
    assert load_settings({}, {"BIDDING_CANDIDATE_CAP": "auto"}).candidate_cap == "auto"
    assert load_settings({}, {"BIDDING_CANDIDATE_CAP": "0"}).candidate_cap == 0
    with pytest.raises(ConfigurationError) as info:
        load_settings({}, {"BIDDING_CANDIDATE_CAP": "-2"})
    # then the error names the variable
    assert "BIDDING_CANDIDATE_CAP" in str(info.value)


def test_bad_window_names_the_setting():
    # given a negative window in conf
    with pytest.raises(ConfigurationError) as info:
        load_settings({"bidding_window": -1}, {})
    message = str(info.value)
    # then the message names bidding_window, the reason and the value
    assert "bidding_window: Input should be greater than 0 (got -1)" in message


def test_bad_window_from_environment_names_the_variable_the_user_set():
    # given a non-numeric window in the environment
    with pytest.raises(ConfigurationError) as info:
        load_settings({}, {"BIDDING_WINDOW": "soon"})
    message = str(info.value)
    # then the message names BIDDING_WINDOW (what the user set), not the conf key
    assert "BIDDING_WINDOW: Input should be a valid number" in message
    assert "(got 'soon')" in message
    assert "bidding_window" not in message


def test_bad_settings_are_named_by_where_each_came_from():
    # given a bad min_trust in the environment and a bad window in app.conf
    # when settings are loaded
    with pytest.raises(ConfigurationError) as info:
        load_settings({"bidding_window": 0}, {"BIDDING_MIN_TRUST": "150"})
    message = str(info.value)
    # then each is named as the user wrote it: the variable, and the conf key
    assert "BIDDING_MIN_TRUST: Input should be less than or equal to 100 (got '150')" in message
    assert "bidding_window: Input should be greater than 0 (got 0)" in message


def test_bad_no_bid_names_the_setting():
    # given a no_bid policy that is not "fail" or "fallback"
    with pytest.raises(ConfigurationError) as info:
        load_settings({"bidding_no_bid": "retry"}, {})
    message = str(info.value)
    # then the message names bidding_no_bid and the allowed values
    assert "bidding_no_bid:" in message
    assert "'fail'" in message
    assert "'fallback'" in message
    assert "(got 'retry')" in message


def test_several_bad_settings_are_all_reported():
    # given two bad settings at once
    with pytest.raises(ConfigurationError) as info:
        load_settings({"bidding_window": 0, "bidding_min_confidence": 2}, {})
    # then both are named in one message
    assert "bidding_window" in str(info.value)
    assert "bidding_min_confidence" in str(info.value)


def test_unknown_bidding_variable_is_refused_naming_it_and_the_valid_settings():
    # given a BIDDING_* variable that is no setting, and nothing close to one
    # when settings are loaded
    with pytest.raises(ConfigurationError) as info:
        load_settings({}, {"BIDDING_NONSENSE": "1", "BIDDING_WINDOW": "0.5"})
    # then it is refused by its name, with the variables that are settings
    message = str(info.value)
    assert message.startswith("BIDDING_NONSENSE: unknown bidding setting; valid settings: ")
    assert "BIDDING_WINDOW, BIDDING_STRATEGY" in message
    assert "BIDDING_PROFILE" in message


@pytest.mark.parametrize(
    ("variable", "meant"),
    [("BIDDING_STRATEGI", "BIDDING_STRATEGY"), ("BIDDING_MIN_TRUSTS", "BIDDING_MIN_TRUST"),
     ("BIDDING_DATABASE", "BIDDING_DATABASE_URL")],
)
def test_misspelt_bidding_variable_is_refused_with_the_setting_it_meant(variable, meant):
    # given a misspelt setting in the environment
    with pytest.raises(ConfigurationError) as info:
        load_settings({}, {variable: "x"})
    # then the message names it and suggests the setting
    assert str(info.value) == f"{variable}: unknown bidding setting; did you mean {meant}?"


def test_only_unknown_settings_are_refused_not_the_variables_of_tests_and_the_demo():
    # given the variables the test suites, the integration harness and the example app read,
    # a worker's boot id, a setting, and one unknown variable
    env = {"BIDDING_TEST_REDIS_DB": "3", "BIDDING_TEST_POSTGRES": "postgresql://x",
           "BIDDING_IT_BROKER": "redis://x", "BIDDING_DEMO_CONFIG": "celeryconfig",
           "_BIDDING_BOOT_ID": "abc", "BIDDING_WINDOW": "0.5", "BIDDING_NONSENSE": "1"}
    # when settings are loaded, then only the unknown variable is refused
    with pytest.raises(ConfigurationError) as info:
        load_settings({}, env)
    assert str(info.value).startswith("BIDDING_NONSENSE: unknown bidding setting; ")
    assert str(info.value).count("unknown bidding setting") == 1
    # and without it the settings among them apply
    del env["BIDDING_NONSENSE"]
    assert load_settings({}, env).window == 0.5


# --- RetryPolicy ----------------------------------------------------------------------------


def test_retry_policy_defaults():
    # given the default policy
    policy = RetryPolicy()
    # then it is AITP's: 3 retries, exponential from 1000 ms
    assert (policy.max_retries, policy.backoff, policy.base_ms) == (3, "exponential", 1000)


def test_retry_policy_negative_retries():
    # given max_retries = -1
    # then a ConfigurationError names retry_policy.max_retries
    with pytest.raises(ConfigurationError) as info:
        RetryPolicy(max_retries=-1)
    assert "retry_policy.max_retries: Input should be greater than or equal to 0" in str(
        info.value
    )
    assert "(got -1)" in str(info.value)


def test_retry_policy_unknown_backoff():
    # given backoff = "quadratic"
    # then a ConfigurationError names retry_policy.backoff and the value
    with pytest.raises(ConfigurationError, match=r"retry_policy\.backoff") as info:
        RetryPolicy(backoff="quadratic")
    assert "'quadratic'" in str(info.value)
    assert "'exponential'" in str(info.value)


def test_retry_policy_unknown_key():
    # given a misspelt option
    # then the error names it
    with pytest.raises(ConfigurationError, match=r"retry_policy\.max_retry: Extra inputs"):
        RetryPolicy(max_retry=2)


# --- Announcement validation ----------------------------------------------------------------


def announcement(**fields):
    values = {"task_id": "t-1", "task_name": "demo.work", "task_type": "analysis"}
    values.update(fields)
    return Announcement(**values)


def test_announcement_defaults():
    # given a minimal announcement
    a = announcement()
    # then seed 000's priority 5 and seed 001's min_confidence 0.5 apply
    assert a.priority == 5
    assert a.min_confidence == 0.5
    assert a.strategy == "weighted"
    assert a.required_skills == []


def test_announcement_priority_10_fails_naming_priority():
    # given priority 10 (valid range is 0-9)
    with pytest.raises(ValidationError) as info:
        announcement(priority=10)
    # then the error is on the priority field only
    errors = info.value.errors()
    assert [e["loc"] for e in errors] == [("priority",)]
    assert "an integer from 0 to 9" in errors[0]["msg"]


def test_announcement_required_skills_deduplicated():
    # given required skills with a repeat and padding
    a = announcement(required_skills=["sql", " sql ", "gpu", "sql"])
    # then each skill appears once, trimmed, in first-seen order
    assert a.required_skills == ["sql", "gpu"]


def test_announcement_blank_skill_fails():
    # given a blank skill name
    with pytest.raises(ValidationError, match="required_skills"):
        announcement(required_skills=["sql", " "])


def test_announcement_unknown_option_fails():
    # given a misspelt option
    with pytest.raises(ValidationError, match="prioirty"):
        announcement(prioirty=3)


@pytest.mark.parametrize(
    ("setting", "value", "allowed"),
    [
        ("check_backoff_factor", 1e40, "[1, 10]"),
        ("initial_check_wait_time", 1e40, "(0, 86400]"),
        ("max_check_wait_time", float("inf"), "(0, 604800]"),
        ("max_check_attempts", 10**9, "[1, 1000]"),
    ],
)
def test_the_checking_settings_have_the_bounds_of_a_profiles_checking_table(
        setting, value, allowed):
    # given a bidding_* checking setting out of the range a profile's [checking] table allows
    # when settings are loaded
    with pytest.raises(ConfigurationError) as info:
        load_settings({f"bidding_{setting}": value}, {})
    # then the error names the setting and the allowed range
    message = str(info.value)
    assert f"bidding_{setting}:" in message
    assert f"allowed: {allowed}" in message


def test_behind_a_transaction_pooler_the_store_asks_psycopg_for_no_prepared_statements():
    # given the setting on, from the environment, made the process's store options
    from bidding.config import use_store_settings
    from bidding.store.engine import pooler_connect_args

    on = load_settings({}, {"BIDDING_DB_TRANSACTION_POOLER": "true"})
    try:
        use_store_settings(on)
        # then a psycopg URL's engines prepare nothing, and other drivers get nothing new
        assert pooler_connect_args("postgresql+psycopg://u@h/db") == {"prepare_threshold": None}
        assert pooler_connect_args("sqlite:///x.db") == {}
    finally:
        use_store_settings(load_settings({}, {}))
    # and with the default (off), psycopg keeps its own threshold
    assert pooler_connect_args("postgresql+psycopg://u@h/db") == {}
