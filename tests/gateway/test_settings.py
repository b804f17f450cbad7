"""GatewaySettings: one model for flags, environment and defaults; errors name the field;
development keys are kept only as digests.

`GOOD` and `BAD` hold a value for every field, so a new field must be added here, and then
its flag, its variable and its validation are tested with the others.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from serving.errors import ServingError
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.setting_names import env_name, flag_name
from serving.gateway.settings import GatewaySettings, flag_aliases
from tests.gateway.settings_env import clean_environment, from_flags  # noqa: F401

URL = "http://127.0.0.1:8001"

# field -> (a valid value that is not the default, as typed, and what it parses to)
GOOD: dict[str, tuple[str, object]] = {
    "upstream": ("http://10.0.0.1:9000/", "http://10.0.0.1:9000"),
    "dns_nameserver": ("10.96.0.10:5353", "10.96.0.10:5353"),
    "discovery_interval_s": ("2.5", 2.5),
    "discovery_max_engines": ("8", 8),
    "discovery_allow_local": ("true", True),
    "keys_db": ("/srv/serving/k.db", "/srv/serving/k.db"),
    "keys_file": ("/etc/serving/keys.yaml", "/etc/serving/keys.yaml"),
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9000", 9000),
    "metrics_port": ("9100", 9100),
    "max_body_bytes": ("1000", 1000),
    "max_images_per_request": ("0", 0),
    "max_pooling_inputs": ("96", 96),
    "image_patch_size": ("16", 16),
    "image_merge_size": ("1", 1),
    "image_min_pixels": ("1024", 1024),
    "image_max_pixels": ("1003520", 1003520),
    "upstream_connect_timeout_s": ("1.5", 1.5),
    "upstream_idle_timeout_s": ("60", 60.0),
    "upstream_keepalive_s": ("2", 2.0),
    "upstream_max_connections": ("8", 8),
    "upstream_max_connection_age_s": ("10", 10.0),
    "readiness_timeout_s": ("0.5", 0.5),
    "retry_after_s": ("3", 3),
    "header_timeout_s": ("2", 2.0),
    "body_timeout_s": ("3", 3.0),
    "keepalive_timeout_s": ("90", 90),
    "default_max_tokens": ("64", 64),
    "lease_ttl_s": ("120", 120.0),
    "health_interval_s": ("0.25", 0.25),
    "drain_delay_s": ("0", 0.0),
    "graceful_shutdown_s": ("7", 7),
    "redis_url": ("redis://:pw@redis:6379/0", "redis://:pw@redis:6379/0"),
    "redis_timeout_s": ("0.5", 0.5),
    "redis_failure_policy": ("local", "local"),
    "redis_replicas": ("3", 3),
    "slot_sync_interval_s": ("0.5", 0.5),
    "usage_retention_days": ("31", 31),
    "batch_db": ("/data/batches.db", "/data/batches.db"),
    "batch_files_dir": ("/data/batch-files", "/data/batch-files"),
    "max_batch_file_bytes": ("1000", 1000),
    "max_batch_lines": ("10", 10),
    "batch_concurrency": ("2", 2),
    "routing": ("least-loaded", "least-loaded"),
    "routing_overload": ("2", 2),
    "engine_slots": ("16", 16),
    "scheduling": ("fcfs", "fcfs"),
    "reserved_slots": ("0", 0),
    "queue_timeout_s": ("5", 5.0),
    "stream_interval": ("4", 4),
    "serve_routes": ('["tokenize"]', ("tokenize",)),
    "runtime_adapters": ("true", True),
    "engine_priority": ("true", True),
}
# List settings: an error shows the bad item, not the whole list.
SHOWN_ITEM = {"serve_routes": "embeddings"}
# Settings whose values may carry a secret: errors and reprs never show them.
SECRET_FIELDS = {"redis_url"}
# field -> a value it refuses
BAD: dict[str, str] = {
    "upstream": "localhost:8001",
    "dns_nameserver": "kube-dns",
    "discovery_interval_s": "0",
    "discovery_max_engines": "0",
    "discovery_allow_local": "maybe",
    "keys_db": "",
    "keys_file": "",
    "host": "",
    "port": "70000",
    "metrics_port": "0",
    "max_body_bytes": "0",
    "max_images_per_request": "-1",
    "max_pooling_inputs": "0",
    "image_patch_size": "0",
    "image_merge_size": "1.5",
    "image_min_pixels": "0",
    "image_max_pixels": "many",
    "upstream_connect_timeout_s": "0",
    "upstream_idle_timeout_s": "nan",
    "upstream_keepalive_s": "-1",
    "upstream_max_connections": "-1",
    "upstream_max_connection_age_s": "-1",
    "readiness_timeout_s": "inf",
    "retry_after_s": "1.5",
    "header_timeout_s": "soon",
    "body_timeout_s": "0",
    "keepalive_timeout_s": "0",
    "default_max_tokens": "0",
    "lease_ttl_s": "-5",
    "health_interval_s": "0",
    "drain_delay_s": "-1",
    "graceful_shutdown_s": "2.5",
    "redis_url": "http://redis:6379",
    "redis_timeout_s": "0",
    "redis_failure_policy": "open",
    "redis_replicas": "0",
    "slot_sync_interval_s": "0",
    "usage_retention_days": "0",
    "batch_db": "",
    "batch_files_dir": "",
    "max_batch_file_bytes": "0",
    "max_batch_lines": "0",
    "batch_concurrency": "0",
    "routing": "random",
    "routing_overload": "-1",
    "engine_slots": "0",
    "scheduling": "random",
    "reserved_slots": "-1",
    "queue_timeout_s": "0",
    "stream_interval": "0",
    "serve_routes": '["embeddings"]',
    "runtime_adapters": "maybe",
    "engine_priority": "maybe",
}
# Set as digests only, from --api-key or SERVING_API_KEY (tested below).
# Keys are set in plain text by their own flags and variables, never as settings.
KEY_DIGESTS = ("api_key_digests", "admin_key_digests")
SETTINGS = [name for name in GatewaySettings.model_fields if name not in KEY_DIGESTS]
# The flag spellings callers used before the flags were generated (README, stack.py, bench).
LEGACY_FLAGS = {
    "--upstream-idle-timeout": "upstream_idle_timeout_s",
    "--upstream-connect-timeout": "upstream_connect_timeout_s",
    "--header-timeout": "header_timeout_s",
    "--body-timeout": "body_timeout_s",
    "--keepalive-timeout": "keepalive_timeout_s",
    "--drain-delay": "drain_delay_s",
    "--graceful-timeout": "graceful_shutdown_s",
}


def base_flags(field: str) -> list[str]:
    """The flags needed besides `field` (an upstream and a key source)."""
    return [] if field == "upstream" else ["--upstream", URL]


def test_every_setting_has_test_values() -> None:
    assert set(GOOD) == set(BAD) == set(SETTINGS)


@pytest.mark.parametrize("field", SETTINGS)
def test_every_field_has_a_variable(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    typed, parsed = GOOD[field]
    monkeypatch.setenv(env_name(field), typed)
    if field != "upstream":
        monkeypatch.setenv(env_name("upstream"), URL)
    assert getattr(GatewaySettings.from_env(), field) == parsed


@pytest.mark.parametrize("field", SETTINGS)
def test_every_field_has_a_flag(field: str) -> None:
    typed, parsed = GOOD[field]
    settings = from_flags(*base_flags(field), flag_name(field), typed)
    assert getattr(settings, field) == parsed


@pytest.mark.parametrize("field", SETTINGS)
def test_a_bad_variable_names_the_field_the_value_and_the_variable(
    field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(env_name(field), BAD[field])
    monkeypatch.setenv(env_name("upstream"), URL if field != "upstream" else BAD[field])
    with pytest.raises(ServingError) as caught:
        GatewaySettings.from_env()
    message = str(caught.value)
    assert message.startswith(f"{field}: {shown(field)}"), message
    assert env_name(field) in message and flag_name(field) in message


@pytest.mark.parametrize("field", SETTINGS)
def test_a_bad_flag_names_the_field_and_the_value(field: str) -> None:
    with pytest.raises(ServingError) as caught:
        from_flags(*base_flags(field), flag_name(field), BAD[field])
    message = str(caught.value)
    assert message.startswith(f"{field}: {shown(field)}"), message
    assert flag_name(field) in message


def shown(field: str) -> str:
    """How an error shows the bad value: hidden for settings that may carry a secret."""
    if field in SECRET_FIELDS:
        return "(hidden)"
    return repr(SHOWN_ITEM.get(field, BAD[field]))


def test_a_bad_redis_url_never_shows_its_password() -> None:
    with pytest.raises(ServingError) as caught:
        from_flags(*base_flags("redis_url"), "--redis-url", "http://:hunter2@redis:6379")
    assert "hunter2" not in str(caught.value)
    settings = from_flags(*base_flags("redis_url"), "--redis-url", "redis://:hunter2@redis:6379")
    assert "hunter2" not in repr(settings)


@pytest.mark.parametrize(("flag", "field"), LEGACY_FLAGS.items())
def test_older_flag_spellings_still_work(flag: str, field: str) -> None:
    typed, parsed = GOOD[field]
    assert getattr(from_flags("--upstream", URL, flag, typed), field) == parsed
    assert flag.removeprefix("--") in flag_aliases()[field.replace("_", "-")]


def test_a_flag_beats_the_environment_which_beats_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert from_flags("--upstream", URL).lease_ttl_s == 600.0
    monkeypatch.setenv("SERVING_GATEWAY_LEASE_TTL_S", "120")
    monkeypatch.setenv("SERVING_GATEWAY_DRAIN_DELAY_S", "9")
    monkeypatch.setenv("SERVING_GATEWAY_UPSTREAM", "http://from-env:1")
    settings = from_flags("--lease-ttl-s", "30")
    assert (settings.lease_ttl_s, settings.drain_delay_s) == (30.0, 9.0)
    assert settings.upstream == "http://from-env:1"
    assert from_flags("--drain-delay", "0").drain_delay_s == 0.0
    assert GatewaySettings.from_env(lease_ttl_s=45).lease_ttl_s == 45.0


def test_development_keys_from_the_environment_are_hashed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVING_API_KEY", "sk-a, sk-b,,")
    settings = GatewaySettings.from_env(upstream=URL)
    assert settings.api_key_digests == (hash_secret("sk-a"), hash_secret("sk-b"))
    assert "sk-a" not in repr(settings) and "api_key_digests" not in repr(settings)
    assert hash_secret("sk-a") not in repr(settings)
    # --api-key beats the variable
    assert from_flags("--upstream", URL, "--api-key", "sk-c").api_key_digests == (
        hash_secret("sk-c"),
    )


def test_admin_keys_from_the_environment_or_flag_are_hashed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SERVING_ADMIN_KEY", "adm-a,adm-b")
    settings = GatewaySettings.from_env(upstream=URL)
    assert settings.admin_key_digests == (hash_secret("adm-a"), hash_secret("adm-b"))
    assert "adm-a" not in repr(settings) and hash_secret("adm-a") not in repr(settings)
    assert settings.api_key_digests == ()  # an admin key is never a tenant key
    assert from_flags("--upstream", URL, "--admin-key", "adm-c").admin_key_digests == (
        hash_secret("adm-c"),
    )
    monkeypatch.setenv("SERVING_ADMIN_KEY", "has space")
    with pytest.raises(ServingError, match="SERVING_ADMIN_KEY"):
        GatewaySettings.from_env(upstream=URL)


@pytest.mark.parametrize("value", ["has space", "sk-ok,tab\tkey", "nön-ascii"])
def test_a_bad_development_key_names_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVING_API_KEY", value)
    with pytest.raises(ServingError, match="SERVING_API_KEY"):
        GatewaySettings.from_env(upstream=URL)


def test_loaded_settings_default_to_the_serving_home_key_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = GatewaySettings.from_env(upstream=URL)
    assert (settings.keys_db, settings.keys_file) == (str(tmp_path / "home" / "keys.db"), None)
    assert settings.api_key_digests == ()
    monkeypatch.setenv("SERVING_GATEWAY_KEYS_FILE", "/etc/keys.yaml")
    only_file = GatewaySettings.from_env(upstream=URL)
    assert (only_file.keys_db, only_file.keys_file) == (None, "/etc/keys.yaml")
    both = GatewaySettings.from_env(upstream=URL, keys_db="/k.db")
    assert (both.keys_db, both.keys_file) == ("/k.db", "/etc/keys.yaml")


def test_upstream_is_required() -> None:
    with pytest.raises(ServingError, match=r"upstream: required.*SERVING_GATEWAY_UPSTREAM"):
        GatewaySettings.from_env()


# `create`: exactly the values given, nothing from the environment.


def test_create_stores_digests_only() -> None:
    settings = GatewaySettings.create(upstream=URL + "/", api_keys=["sk-one", "sk-two"])
    assert settings.upstream == URL
    assert settings.api_key_digests == (hash_secret("sk-one"), hash_secret("sk-two"))
    assert "sk-one" not in repr(settings)
    assert "api_key_digests" not in repr(settings)


def test_create_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVING_GATEWAY_PORT", "9")
    monkeypatch.setenv("SERVING_API_KEY", "sk-env")
    settings = GatewaySettings.create(upstream=URL, api_keys=["k"])
    assert (settings.port, settings.api_key_digests, settings.keys_db) == (
        8000,
        (hash_secret("k"),),
        None,
    )


def test_settings_are_frozen() -> None:
    settings = GatewaySettings.create(upstream=URL, api_keys=["k"])
    with pytest.raises(ValidationError, match="frozen"):
        settings.port = 1


@pytest.mark.parametrize(
    ("upstream", "words"),
    [
        ("127.0.0.1:8001", "upstream"),
        ("ftp://host", "upstream"),
        ("http://", "upstream"),
        ("http://host:99999", "upstream"),
        ("http://host:0", "upstream"),
        ("http://host/?q=1", "upstream"),
        ("http://user:pw@host", "upstream"),
    ],
)
def test_bad_upstream(upstream: str, words: str) -> None:
    with pytest.raises(ServingError, match=words):
        GatewaySettings.create(upstream=upstream, api_keys=["k"])


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"port": 70000}, "port"),
        ({"port": "eighty"}, "port"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"upstream_idle_timeout_s": -1.0}, "upstream_idle_timeout_s"),
        ({"upstream_idle_timeout_s": float("nan")}, "upstream_idle_timeout_s"),
        ({"upstream_connect_timeout_s": 0}, "upstream_connect_timeout_s"),
        ({"retry_after_s": 1.5}, "retry_after_s"),
        ({"host": ""}, "host"),
        ({"drain_delay_s": -1}, "drain_delay_s"),
        ({"body_timeout_s": float("inf")}, "body_timeout_s"),
        ({"keys_db": ""}, "keys_db"),
        ({"image_min_pixels": 5000, "image_max_pixels": 4000}, "image_max_pixels"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_bad_values_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ServingError, match=f"^{field}: "):
        GatewaySettings.create(upstream=URL, api_keys=["k"], **options)


@pytest.mark.parametrize("keys", [[""], ["has space"], ["tab\tkey"], ["nön-ascii"]])
def test_bad_keys(keys: list[str]) -> None:
    with pytest.raises(ServingError, match="api_key"):
        GatewaySettings.create(upstream=URL, api_keys=keys)


def test_a_key_source_is_required() -> None:
    with pytest.raises(ServingError, match="key source"):
        GatewaySettings.create(upstream=URL, api_keys=[])
    assert GatewaySettings.create(upstream=URL, api_keys=[], keys_db="/k.db").keys_db == "/k.db"
    assert GatewaySettings.create(upstream=URL, api_keys=[], keys_file="/k.yaml").keys_file


def test_several_engines_are_one_comma_separated_upstream() -> None:
    settings = GatewaySettings.create(
        upstream="http://10.0.0.1:8000/, http://10.0.0.2:8000", api_keys=["sk-a"]
    )
    assert settings.upstream_urls == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")


@pytest.mark.parametrize(
    ("upstream", "problem"),
    [
        ("http://10.0.0.1:8000,http://10.0.0.1:8000/", "lists an engine twice"),
        ("http://10.0.0.1:8000,", "must be an http:// or https:// URL with a host"),
        ("http://10.0.0.1:8000,10.0.0.2:8000", "must be an http:// or https:// URL with a host"),
    ],
)
def test_a_bad_engine_list_names_the_upstream_setting(upstream: str, problem: str) -> None:
    with pytest.raises(ServingError, match="upstream") as caught:
        GatewaySettings.create(upstream=upstream, api_keys=["sk-a"])
    assert problem in str(caught.value)


def test_reserved_slots_leave_every_key_a_slot() -> None:
    two_engines = "http://127.0.0.1:8001,http://127.0.0.1:8003"
    settings = GatewaySettings.create(upstream=two_engines, api_keys=["k"], engine_slots=2)
    assert settings.queue_slots == 4
    assert (
        GatewaySettings.create(upstream=URL, api_keys=["k"], scheduling="fcfs").queue_slots is None
    )
    with pytest.raises(ServingError, match="reserved_slots: 4 is not below"):
        GatewaySettings.create(
            upstream=two_engines, api_keys=["k"], engine_slots=2, reserved_slots=4
        )
