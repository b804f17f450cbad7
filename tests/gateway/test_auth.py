"""Bearer parsing and the constant-time static key check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving.gateway.auth import Principal, StaticKeyAuthenticator, parse_bearer
from serving.gateway.errors import AuthenticationError
from serving.gateway.keys.credentials import hash_secret

tokens = st.binary(min_size=1, max_size=64).filter(
    lambda b: not any(c in b for c in b" \t\r\n\x0b\x0c")
)


@given(tokens, st.sampled_from([b"Bearer", b"bearer", b"BEARER"]))
def test_parse_bearer_round_trip(token: bytes, scheme: bytes) -> None:
    assert parse_bearer(scheme + b" " + token) == token


@pytest.mark.parametrize(
    "value",
    [None, b"", b"Bearer", b"Bearer ", b"Basic abc", b"abc", b"Bearer a b", b"Bearer\tabc"],
)
def test_parse_bearer_rejects(value: bytes | None) -> None:
    assert parse_bearer(value) is None


def test_authenticate_finds_each_key() -> None:
    auth = StaticKeyAuthenticator([hash_secret("sk-a"), hash_secret("sk-b")])
    assert auth.authenticate(b"Bearer sk-a") == Principal(key_id="dev")
    assert auth.authenticate(b"Bearer sk-b") == Principal(key_id="dev-1")


@pytest.mark.parametrize("value", [None, b"Bearer sk-c", b"Basic sk-a", b"sk-a", b"Bearer "])
def test_authenticate_failures_are_identical(value: bytes | None) -> None:
    auth = StaticKeyAuthenticator([hash_secret("sk-a")])
    with pytest.raises(AuthenticationError) as caught:
        auth.authenticate(value)
    assert caught.value.body() == AuthenticationError().body()
    assert b"sk-" not in caught.value.body()
