"""Unit tests of bidding.profile: the shipped node profiles load, bad profiles name the fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from bidding.errors import ConfigurationError, ProfileError
from bidding.nodes.profile import NodeProfile, bid_queue, exec_queue, load_profile

WORKERS = Path(__file__).resolve().parents[2] / "workers"

VALID = """\
name = "testfin"
capabilities = ["sql", "coding"]
capacity = 3
price_per_unit = 0.02
latency_ms = 25
trust = 60
"""


def write(tmp_path: Path, text: str, name: str = "node.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def with_line(key: str, line: str) -> str:
    """VALID with the line of ``key`` replaced by ``line`` (or removed when line is empty)."""
    lines = [ln for ln in VALID.splitlines() if not ln.startswith(f"{key} ")]
    if line:
        lines.append(line)
    return "\n".join(lines) + "\n"


# --- the shipped profiles -------------------------------------------------------------------


def test_every_shipped_profile_loads():
    # given the profiles in workers/
    paths = sorted(WORKERS.glob("*.toml"))
    # when each is loaded
    loaded = {load_profile(p).name: load_profile(p) for p in paths}
    # then all five federation nodes load, each named after its file
    assert sorted(loaded) == ["bluefin", "greenfin", "redfin", "sasass", "tpm"]
    for path in paths:
        assert loaded[path.stem].name == path.stem


def test_redfin_profile_fields():
    # given workers/redfin.toml
    profile = load_profile(WORKERS / "redfin.toml")
    # then its declared values are read exactly
    assert profile.name == "redfin"
    assert profile.capabilities == ["gpu_inference", "nlp_analysis", "image_classification",
                                    "testing"]
    assert profile.capacity == 4
    assert profile.price_per_unit == 0.02
    assert profile.latency_ms == 40.0
    assert profile.trust == 80.0
    assert profile.description == "GPU inference and NLP"


def test_profile_queue_names():
    # given the bluefin profile
    profile = load_profile(WORKERS / "bluefin.toml")
    # then its queues are bids.<name> and exec.<name>
    assert profile.bid_queue == "bids.bluefin"
    assert profile.exec_queue == "exec.bluefin"
    assert bid_queue("tpm") == "bids.tpm"
    assert exec_queue("tpm") == "exec.tpm"


def test_profile_defaults_when_optional_keys_are_absent(tmp_path):
    # given a profile with only a name and capabilities
    path = write(tmp_path, 'name = "minimal"\ncapabilities = ["sql"]\n')
    profile = load_profile(path)
    # then the documented defaults apply
    assert profile.capacity == 4
    assert profile.price_per_unit == 0.01
    assert profile.latency_ms == 50.0
    assert profile.trust == 70.0


def test_profile_capabilities_are_stripped_and_deduplicated(tmp_path):
    # given capabilities with padding and a repeat
    path = write(tmp_path, with_line("capabilities", 'capabilities = [" sql", "sql ", "gpu"]'))
    # then each capability appears once, trimmed, in first-seen order
    assert load_profile(path).capabilities == ["sql", "gpu"]


def test_profile_is_frozen(tmp_path):
    # given a loaded profile
    profile = load_profile(write(tmp_path, VALID))
    # then it cannot be changed after validation
    with pytest.raises(ValueError, match="frozen"):
        profile.capacity = 99


# --- errors ---------------------------------------------------------------------------------


def test_missing_file_names_the_path(tmp_path):
    # given a path with no file
    path = tmp_path / "absent.toml"
    # when it is loaded
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    # then the error names the path and says it cannot be read
    assert str(path) in str(info.value)
    assert "cannot read profile" in str(info.value)
    # and it is a ConfigurationError too
    assert isinstance(info.value, ConfigurationError)


def test_invalid_toml(tmp_path):
    # given a file that is not TOML
    path = write(tmp_path, 'name = "redfin"\ncapabilities = [unclosed\n')
    # when it is loaded
    # then the error says so and names the file
    with pytest.raises(ProfileError, match="not valid TOML") as info:
        load_profile(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("key", "line", "bad_value"),
    [
        ("capacity", "capacity = 0", "0"),
        ("trust", "trust = 150", "150"),
        ("price_per_unit", "price_per_unit = -1", "-1"),
        ("latency_ms", "latency_ms = -5", "-5"),
    ],
)
def test_out_of_range_value_names_the_key(tmp_path, key, line, bad_value):
    # given a profile with one value out of range
    path = write(tmp_path, with_line(key, line))
    # when it is loaded
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    # then the error names the file, the key and the value that was given
    assert str(path) in message
    assert f"{key}:" in message
    assert f"(got {bad_value})" in message


def test_capacity_zero_message(tmp_path):
    # given capacity = 0
    path = write(tmp_path, with_line("capacity", "capacity = 0"))
    # then the message reads "capacity: Input should be greater than or equal to 1 (got 0)"
    with pytest.raises(
        ProfileError, match=r"capacity: Input should be greater than or equal to 1 \(got 0\)"
    ):
        load_profile(path)


def test_trust_150_message(tmp_path):
    # given trust = 150 (trust is 0-100)
    path = write(tmp_path, with_line("trust", "trust = 150"))
    # then the message names trust and its upper bound
    with pytest.raises(ProfileError, match=r"trust: Input should be less than or equal to 100"):
        load_profile(path)


def test_unknown_key_is_named_and_valid_keys_listed(tmp_path):
    # given a typo: "capabilites" instead of "capabilities"
    text = VALID.replace("capabilities =", "capabilites =")
    path = write(tmp_path, text)
    # when it is loaded
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    # then the typo is named as not permitted
    assert "capabilites: Extra inputs are not permitted" in message
    # and the valid keys are listed, including the intended one
    assert (
        "valid keys: name, capabilities, capacity, price_per_unit, latency_ms, trust, "
        "description" in message
    )


def test_bad_name_is_named(tmp_path):
    # given a name with a capital letter and a space
    path = write(tmp_path, with_line("name", 'name = "Red Fin"'))
    # then the error names "name" and echoes the value
    with pytest.raises(ProfileError, match=r"name: String should match pattern") as info:
        load_profile(path)
    assert "'Red Fin'" in str(info.value)


@pytest.mark.parametrize("name", ["redfin", "node-2", "a_b", "0edge"])
def test_good_names_are_accepted(name):
    # given names made of lowercase letters, digits, "-" and "_"
    # then they validate as node names
    assert NodeProfile(name=name, capabilities=["x"]).name == name


def test_empty_capabilities_is_named(tmp_path):
    # given a node that declares no capability
    path = write(tmp_path, with_line("capabilities", "capabilities = []"))
    # then the error names "capabilities"
    with pytest.raises(ProfileError, match=r"capabilities: List should have at least 1 item"):
        load_profile(path)


def test_missing_capabilities_is_named(tmp_path):
    # given a profile without the capabilities key
    path = write(tmp_path, with_line("capabilities", ""))
    # then the error says the field is required
    with pytest.raises(ProfileError, match=r"capabilities: Field required"):
        load_profile(path)


def test_blank_capability_is_refused(tmp_path):
    # given a capability that is only whitespace
    path = write(tmp_path, with_line("capabilities", 'capabilities = ["sql", "  "]'))
    # then the error names capabilities and says why
    with pytest.raises(ProfileError, match=r"capabilities: .*non-empty strings"):
        load_profile(path)


# --- every numeric value is bounded (review item e) -----------------------------------------


def test_a_profile_with_a_huge_backoff_factor_is_refused_naming_the_key(tmp_path):
    # given a profile whose [checking] table multiplies each wait by 1e40 (its eighth check
    # would overflow a float)
    path = write(tmp_path, VALID + "\n[checking]\ncheck_backoff_factor = 1e40\n")
    # when it is loaded
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    # then the error names the file, the key, the value and the allowed range
    assert str(path) in message
    assert "checking.check_backoff_factor:" in message
    assert "(got 1e+40)" in message
    assert "allowed: [1, 10]" in message


@pytest.mark.parametrize(
    ("table", "line", "key", "allowed"),
    [
        ("", "price_per_unit = 1e300", "price_per_unit", "[0, 1000000]"),
        ("", "latency_ms = 1e300", "latency_ms", "[0, 3600000]"),
        ("", "capacity = 100000", "capacity", "[1, 10000]"),
        ("", "trust = -1", "trust", "[0, 100]"),
        ("", "bidder_timeout_s = 1e9", "bidder_timeout_s", "(0, 600]"),
        ("checking", "initial_check_wait_time = 1e40", "checking.initial_check_wait_time",
         "(0, 86400]"),
        ("checking", "initial_check_wait_time = 0", "checking.initial_check_wait_time",
         "(0, 86400]"),
        ("checking", "max_check_wait_time = inf", "checking.max_check_wait_time",
         "(0, 604800]"),
        ("checking", "check_backoff_factor = nan", "checking.check_backoff_factor", "[1, 10]"),
        ("checking", "max_check_attempts = 1000000000", "checking.max_check_attempts",
         "[1, 1000]"),
    ],
)
def test_every_numeric_value_of_a_profile_is_bounded(tmp_path, table, line, key, allowed):
    # given a profile with one value out of its range (or not a number: nan, inf)
    text = VALID + f"\n[{table}]\n{line}\n" if table else with_line(key, line)
    path = write(tmp_path, text)
    # when it is loaded
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    # then the error names the file, the key and the range it must be within
    message = str(info.value)
    assert str(path) in message
    assert f"{key}:" in message
    assert f"allowed: {allowed}" in message
