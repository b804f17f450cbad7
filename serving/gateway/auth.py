"""Who is calling: Bearer parsing and a constant-time key check.

    authenticator = StaticKeyAuthenticator(settings.api_key_digests)
    principal = authenticator.authenticate(authorization_header)  # or AuthenticationError

A missing header, a malformed one, another scheme and an unknown key all raise the same
`AuthenticationError`; the key is never logged, echoed or kept beyond its digest. A key store
(revocable keys with limits) plugs in as another `Authenticator`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from serving.gateway.errors import AuthenticationError

_SCHEME = b"bearer"


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller. `key_id` is public: safe for logs and metric labels."""

    key_id: str


class Authenticator(Protocol):
    def authenticate(self, authorization: bytes | None) -> Principal:
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


class StaticKeyAuthenticator:
    """Accepts a fixed set of keys given as SHA-256 digests (the development keys)."""

    def __init__(self, digests: Sequence[bytes]) -> None:
        self._entries = tuple(
            (digest, Principal(key_id=f"dev-{index}")) for index, digest in enumerate(digests)
        )

    def authenticate(self, authorization: bytes | None) -> Principal:
        token = parse_bearer(authorization)
        # Hash and compare even when the header is unusable, so the time spent does not say
        # which check failed; compare against every digest without stopping early.
        digest = hashlib.sha256(token if token is not None else b"").digest()
        found: Principal | None = None
        for expected, principal in self._entries:
            if hmac.compare_digest(digest, expected) and found is None:
                found = principal
        if token is None or found is None:
            raise AuthenticationError()
        return found
