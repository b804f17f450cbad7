"""Whose batch it is: the `Caller` a batch's lines run as, found again by the key's public
id (a restarted gateway resumes batches before their owners call again).

    owners = Owners(find=lambda key_id: caller_in_stores(stores, dev_ids, key_id))
    owners.remember(caller)        # every Batch API request
    owners.lookup("k1a2b3")        # None: the key is gone or revoked (its batches stop)

A key found in a store is read anew on every lookup, so a revoked key's lines stop and a
changed limit applies to the next line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from serving.gateway.auth import Caller, Principal
from serving.gateway.keys.store import KeyStore


class Owners:
    def __init__(self, find: Callable[[str], Caller | None] | None = None) -> None:
        self._find = find
        self._seen: dict[str, Caller] = {}

    def remember(self, caller: Caller) -> None:
        self._seen[caller.key_id] = caller

    def lookup(self, key_id: str) -> Caller | None:
        if self._find is not None:
            return self._find(key_id)
        # An authenticator without stores to read (tests): the caller as last seen.
        return self._seen.get(key_id)


def caller_in_stores(
    stores: Sequence[KeyStore], dev_ids: Sequence[str], key_id: str
) -> Caller | None:
    """The active key `key_id` (revoked in any store: None), or the development key."""
    found = None
    for store in stores:
        record = store.get(key_id)
        if record is not None and record.revoked:
            return None
        if record is not None and found is None:
            found = record
    if found is None and key_id in dev_ids:
        return Principal(key_id=key_id)
    return found
