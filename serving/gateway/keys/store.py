"""The key stores' common shape, and the one place a presented secret is checked."""

from __future__ import annotations

from typing import Protocol

from serving.gateway.keys.credentials import hash_secret, key_id_of, secret_matches
from serving.gateway.keys.record import KeyRecord

# Compared against when the claimed id is unknown, so that case costs the same hash and
# compare as a wrong secret for a real id.
_NO_SUCH_HASH = hash_secret("sk-00000000-" + "0" * 40)


class KeyStore(Protocol):
    """Read side, all the gateway needs. Lookups are synchronous and cheap (in-memory or a
    single indexed SQLite read), so they may run on the event loop."""

    def get(self, key_id: str) -> KeyRecord | None: ...

    def list_keys(self) -> list[KeyRecord]: ...

    def authenticate(self, secret: str) -> KeyRecord | None:
        """The active key this secret belongs to; None for malformed, unknown, wrong or
        revoked alike (callers answer the same 401 for all four)."""
        ...

    def close(self) -> None: ...


def authenticate_with(store: KeyStore, secret: str) -> KeyRecord | None:
    """`authenticate` for any store that can `get` by public id."""
    key_id = key_id_of(secret)
    if key_id is None:
        return None
    record = store.get(key_id)
    matches = secret_matches(secret, record.secret_sha256 if record else _NO_SUCH_HASH)
    if record is None or not matches or record.revoked:
        return None
    return record
