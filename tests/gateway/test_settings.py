"""GatewaySettings: validation names the field; keys are kept only as digests."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from serving.errors import ServingError
from serving.gateway.settings import GatewaySettings, digest_key

URL = "http://127.0.0.1:8001"


def test_create_stores_digests_only() -> None:
    settings = GatewaySettings.create(upstream=URL + "/", api_keys=["sk-one", "sk-two"])
    assert settings.upstream == URL
    assert settings.api_key_digests == (
        hashlib.sha256(b"sk-one").digest(),
        hashlib.sha256(b"sk-two").digest(),
    )
    assert "sk-one" not in repr(settings)
    assert "api_key_digests" not in repr(settings)
    assert digest_key("sk-one") == settings.api_key_digests[0]


def test_settings_are_frozen() -> None:
    settings = GatewaySettings.create(upstream=URL, api_keys=["k"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.port = 1  # type: ignore[misc]


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
        ({"port": "80"}, "port"),
        ({"max_body_bytes": 0}, "max_body_bytes"),
        ({"upstream_idle_timeout_s": -1.0}, "upstream_idle_timeout_s"),
        ({"upstream_idle_timeout_s": float("nan")}, "upstream_idle_timeout_s"),
        ({"upstream_connect_timeout_s": 0}, "upstream_connect_timeout_s"),
        ({"retry_after_s": 1.5}, "retry_after_s"),
        ({"host": ""}, "host"),
        ({"no_such_field": 1}, "no_such_field"),
    ],
)
def test_bad_values_name_the_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ServingError, match=field):
        GatewaySettings.create(upstream=URL, api_keys=["k"], **options)


@pytest.mark.parametrize("keys", [[], [""], ["has space"], ["tab\tkey"], ["nön-ascii"]])
def test_bad_keys(keys: list[str]) -> None:
    with pytest.raises(ServingError, match="api_key"):
        GatewaySettings.create(upstream=URL, api_keys=keys)


def test_from_env() -> None:
    env = {
        "SERVING_GATEWAY_UPSTREAM": URL,
        "SERVING_GATEWAY_PORT": "9000",
        "SERVING_GATEWAY_UPSTREAM_IDLE_TIMEOUT_S": "12.5",
        "SERVING_API_KEY": "sk-a, sk-b",
    }
    settings = GatewaySettings.from_env(env, host="0.0.0.0")
    assert (settings.port, settings.upstream_idle_timeout_s, settings.host) == (
        9000,
        12.5,
        "0.0.0.0",
    )
    assert settings.api_key_digests == (digest_key("sk-a"), digest_key("sk-b"))


def test_from_env_errors_name_the_variable() -> None:
    with pytest.raises(ServingError, match="SERVING_GATEWAY_UPSTREAM"):
        GatewaySettings.from_env({"SERVING_API_KEY": "k"})
    with pytest.raises(ServingError, match="SERVING_GATEWAY_PORT"):
        GatewaySettings.from_env(
            {"SERVING_GATEWAY_UPSTREAM": URL, "SERVING_GATEWAY_PORT": "x", "SERVING_API_KEY": "k"}
        )
    with pytest.raises(ServingError, match="SERVING_API_KEY"):
        GatewaySettings.from_env({"SERVING_GATEWAY_UPSTREAM": URL})


def test_a_key_source_is_required() -> None:
    with pytest.raises(ServingError, match="key source"):
        GatewaySettings.create(upstream=URL, api_keys=[])
    assert GatewaySettings.create(upstream=URL, api_keys=[], keys_db="/k.db").keys_db == "/k.db"
    assert GatewaySettings.create(upstream=URL, api_keys=[], keys_file="/k.yaml").keys_file


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"drain_delay_s": -1}, "drain_delay_s"),
        ({"header_timeout_s": 0}, "header_timeout_s"),
        ({"body_timeout_s": float("inf")}, "body_timeout_s"),
        ({"default_max_tokens": 0}, "default_max_tokens"),
        ({"keys_db": ""}, "keys_db"),
    ],
)
def test_new_fields_are_validated(options: dict[str, object], field: str) -> None:
    with pytest.raises(ServingError, match=field):
        GatewaySettings.create(upstream=URL, api_keys=["k"], **options)
