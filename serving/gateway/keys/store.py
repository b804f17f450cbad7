"""The key stores' common shape, and the one place a presented secret is checked.

`KeyStore` is what the gateway reads; `WritableKeyStore` adds what `serving keys` writes
(SQLite and Redis; a keys file is written by hand).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from serving.gateway.keys.credentials import hash_secret, key_id_of, secret_matches
from serving.gateway.keys.record import KeyRecord, KeySpec

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


class WritableKeyStore(KeyStore, Protocol):
    @property
    def location(self) -> str:
        """Where the keys are, for messages: a file's path, Redis's address (no password)."""
        ...

    def create(self, spec: KeySpec, *, now: datetime | None = None) -> tuple[KeyRecord, str]:
        """Store a new key; returns it with its secret, which is stored nowhere."""
        ...

    def revoke(self, key_id: str) -> KeyRecord:
        """Mark a key revoked (again is fine); an unknown id is a `ServingError` naming it."""
        ...


def authenticate_with(store: KeyStore, secret: str) -> KeyRecord | None:
    """`authenticate` for any store that can `get` by public id."""
    return authenticate_across((store,), secret)


def authenticate_across(stores: Sequence[KeyStore], secret: str) -> KeyRecord | None:
    """The active key this secret belongs to, over several stores: the first store holding
    its id decides, unless any store holds that id revoked (a revocation anywhere holds
    everywhere). One secret comparison, whatever was found."""
    key_id = key_id_of(secret)
    if key_id is None:
        return None
    found: KeyRecord | None = None
    revoked = False
    for store in stores:
        record = store.get(key_id)
        if record is None:
            continue
        if record.revoked:
            revoked = True
        elif found is None:
            found = record
    matches = secret_matches(secret, found.secret_sha256 if found else _NO_SUCH_HASH)
    if found is None or revoked or not matches:
        return None
    return found
