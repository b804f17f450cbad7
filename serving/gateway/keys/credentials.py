"""API key secrets: how they look, how they are hashed, how a presented one is checked.

A secret is `sk-<id>-<random>`; its key's public id is `key_<id>`. The id part lets the
gateway find the one record to compare against without a table scan and is safe to show in
logs and metrics; the 40 random characters (~238 bits) are what makes it secret. Stores keep
only the SHA-256 of the whole secret. A plain hash suffices (no slow KDF) because the secret
is random, not a password a person chose.

`hash_secret` is the one way any key is hashed: store keys here, development keys in the
gateway's settings and in `auth` when a request presents one.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string

SECRET_PREFIX = "sk-"
KEY_ID_PREFIX = "key_"
ID_PART_LENGTH = 8
RANDOM_PART_LENGTH = 40
_RANDOM_ALPHABET = string.ascii_letters + string.digits

KEY_ID_PATTERN = re.compile(rf"{KEY_ID_PREFIX}[0-9a-f]{{{ID_PART_LENGTH}}}")
# Anchored and bounded, so a megabyte of garbage in a header is rejected before hashing.
_SECRET_PATTERN = re.compile(
    rf"{SECRET_PREFIX}([0-9a-f]{{{ID_PART_LENGTH}}})-[A-Za-z0-9]{{{RANDOM_PART_LENGTH}}}"
)


def new_secret() -> tuple[str, str]:
    """A fresh `(key_id, secret)` pair; the secret is shown once and never stored."""
    id_part = secrets.token_hex(ID_PART_LENGTH // 2)
    random_part = "".join(secrets.choice(_RANDOM_ALPHABET) for _ in range(RANDOM_PART_LENGTH))
    return KEY_ID_PREFIX + id_part, f"{SECRET_PREFIX}{id_part}-{random_part}"


def key_id_of(secret: str) -> str | None:
    """The public id a presented secret claims, or None if it is not shaped like a secret."""
    match = _SECRET_PATTERN.fullmatch(secret)
    return KEY_ID_PREFIX + match.group(1) if match else None


def is_key_id(value: str) -> bool:
    return KEY_ID_PATTERN.fullmatch(value) is not None


def hash_secret(secret: str | bytes) -> str:
    """The SHA-256 of a key, as 64 lowercase hex digits: what is stored and compared."""
    data = secret.encode("utf-8") if isinstance(secret, str) else secret
    return hashlib.sha256(data).hexdigest()


def secret_matches(secret: str, secret_sha256: str) -> bool:
    # compare_digest takes time independent of where the digests differ, so response timing
    # does not reveal how much of a guessed hash was right.
    return hmac.compare_digest(hash_secret(secret), secret_sha256)
