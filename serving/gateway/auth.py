"""Who is calling: Bearer parsing, the key stores, and the development keys.

    authenticator = KeyStoreAuthenticator([SqliteKeyStore(path)], dev=StaticKeyAuthenticator(d))
    caller = authenticator.authenticate(authorization_header)  # or AuthenticationError

A missing header, a malformed one, another scheme, an unknown key and a revoked key all raise
the same `AuthenticationError`; the key is never logged, echoed or kept beyond its hash. The
stores see revocations soon (SQLite: a `data_version` check at most every 50 ms; files:
reloaded when they change; Redis: a snapshot refreshed every second), so a revoked key stops
working in a running gateway.

The caller is a `Caller`: a `keys.KeyRecord` for store keys, a `Principal` for development
keys (no limits, every model; public id `dev`).
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from serving.gateway.errors import AuthenticationError
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.keys.store import KeyStore, authenticate_across
from serving.gateway.quota.limits import Limits, QuotaSubject

_SCHEME = b"bearer"
NO_LIMITS = Limits()
DEV_KEY_ID = "dev"


class Caller(QuotaSubject, Protocol):
    """An authenticated caller. `key_id` is public: safe for logs and metric labels."""

    @property
    def models(self) -> tuple[str, ...]: ...

    @property
    def weight(self) -> int:
        """Its share of the engine under fair sharing (`fair_queue`)."""
        ...

    @property
    def default_adapter(self) -> str | None:
        """The adapter that serves its requests for a base model, if any."""
        ...

    @property
    def priority(self) -> int:
        """vLLM's priority for its requests (lower first), sent with engine_priority."""
        ...

    def allows_model(self, model: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Principal:
    """A development key's caller: no limits, every model."""

    key_id: str
    limits: Limits = NO_LIMITS
    model_limits: Mapping[str, Limits] = field(default_factory=dict)
    models: tuple[str, ...] = ()
    weight: int = 1
    default_adapter: str | None = None
    priority: int = 0

    def allows_model(self, model: str) -> bool:
        return not self.models or model in self.models


class Authenticator(Protocol):
    def authenticate(self, authorization: bytes | None) -> Caller:
        """The caller named by an `Authorization` header value, or `AuthenticationError`."""
        ...


def parse_bearer(authorization: bytes | None) -> bytes | None:
    """The token of `Bearer <token>` (scheme case-insensitive), else None."""
    if authorization is None:
        return None
    scheme, sep, token = authorization.strip().partition(b" ")
    token = token.strip()
    if not sep or scheme.lower() != _SCHEME or not token or b" " in token or b"\t" in token:
        return None
    return token


def bearer_of_api_key(api_key: bytes | None) -> bytes | None:
    """An `x-api-key` value (Anthropic's clients send the key so) as the `Authorization`
    value `authenticate` reads, so it takes the same path: hashed, compared in constant
    time, never kept."""
    return None if api_key is None else b"Bearer " + api_key.strip()


def dev_key_id(index: int) -> str:
    """The public id of the development key at `index`: `dev`, then `dev-1`, `dev-2`, ..."""
    return DEV_KEY_ID if index == 0 else f"{DEV_KEY_ID}-{index}"


class StaticKeyAuthenticator:
    """Accepts a fixed set of keys given as `hash_secret` digests (the development keys).

    Their public ids are `dev_key_id`'s.
    """

    def __init__(self, digests: Sequence[str]) -> None:
        self._entries = tuple(
            (digest, Principal(key_id=dev_key_id(index))) for index, digest in enumerate(digests)
        )

    def find(self, token: bytes | None) -> Principal | None:
        # Hash and compare even when the header is unusable, so the time spent does not say
        # which check failed; compare against every digest without stopping early.
        digest = hash_secret(token if token is not None else b"")
        found: Principal | None = None
        for expected, principal in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = principal
        return None if token is None else found

    def authenticate(self, authorization: bytes | None) -> Caller:
        found = self.find(parse_bearer(authorization))
        if found is None:
            raise AuthenticationError()
        return found


class KeyStoreAuthenticator:
    """Keys from one or more stores (`serving keys`, a keys file), then the development keys."""

    def __init__(
        self, stores: Sequence[KeyStore], *, dev: StaticKeyAuthenticator | None = None
    ) -> None:
        self._stores = tuple(stores)
        self._dev = dev

    def authenticate(self, authorization: bytes | None) -> Caller:
        token = parse_bearer(authorization)
        if token is not None and token.isascii():
            secret = token.decode("ascii")
            record = authenticate_across(self._stores, secret)
            if record is not None:
                return record
        found = self._dev.find(token) if self._dev is not None else None
        if found is None:
            raise AuthenticationError()
        return found

    def key_name(self, key_id: str) -> str | None:
        """The name of a public key id in the first store holding it (revoked keys too), for
        reports; None for a development key or an id no store holds."""
        for store in self._stores:
            record = store.get(key_id)
            if record is not None:
                return record.name
        return None

    @property
    def unready_reason(self) -> str | None:
        """Why no key can be accepted: every store is a keys file that does not load, and
        there is no development key. One broken Secret never takes a replica out of its
        Service while another store still works."""
        broken = [getattr(store, "broken", None) for store in self._stores]
        if self._dev is not None or not broken or not all(broken):
            return None
        return "no key store loads: " + "; ".join(reason for reason in broken if reason)

    def close(self) -> None:
        for store in self._stores:
            store.close()
