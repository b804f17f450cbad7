import hashlib
import hmac

import pytest

from serving.gateway.keys.credentials import (
    hash_secret,
    is_key_id,
    key_id_of,
    new_secret,
    secret_matches,
)


def test_secret_carries_its_public_id() -> None:
    key_id, secret = new_secret()
    assert is_key_id(key_id)
    assert secret.startswith("sk-" + key_id.removeprefix("key_") + "-")
    assert len(secret) == len("sk-") + 8 + 1 + 40
    assert key_id_of(secret) == key_id


def test_secrets_are_random() -> None:
    assert len({new_secret()[1] for _ in range(200)}) == 200


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "sk-",
        "Bearer sk-ab12cd34-" + "a" * 40,
        "sk-AB12CD34-" + "a" * 40,  # the id part is lowercase hex
        "sk-ab12cd34-" + "a" * 39,
        "sk-ab12cd34-" + "a" * 41,
        "sk-ab12cd34-" + "a" * 39 + "!",
        "sk-ab12cd34-" + "a" * 40 + "\n",
        "sk-ab12cd3-" + "a" * 41,
        "sk-ab12cd34-" + "a" * 1_000_000,
    ],
)
def test_malformed_secrets_name_no_key(presented: str) -> None:
    assert key_id_of(presented) is None


def test_hash_is_sha256_hex_and_compared_in_constant_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, secret = new_secret()
    digest = hash_secret(secret)
    assert digest == hashlib.sha256(secret.encode()).hexdigest()
    calls: list[tuple[str, str]] = []
    real_compare = hmac.compare_digest

    def recording_compare(a: str, b: str) -> bool:
        calls.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording_compare)
    assert secret_matches(secret, digest)
    assert not secret_matches(secret + "x", digest)
    assert calls == [(digest, digest), (hash_secret(secret + "x"), digest)]
