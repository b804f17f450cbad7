"""The gateway's settings: one frozen value object, validated on construction.

    settings = GatewaySettings.create(upstream="http://127.0.0.1:8001", api_keys=["sk-dev"])
    settings = GatewaySettings.from_env()          # SERVING_GATEWAY_* and SERVING_API_KEY

API keys are never stored: only their SHA-256 digests, which `auth` compares in constant time.
Every validation failure is a `ServingError` whose message names the field and the bad value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from serving.errors import ServingError

ENV_PREFIX = "SERVING_GATEWAY_"
API_KEY_ENV = "SERVING_API_KEY"


def digest_key(key: str) -> bytes:
    """The SHA-256 digest the gateway stores and compares instead of the key itself."""
    return hashlib.sha256(key.encode("utf-8")).digest()


@dataclass(frozen=True, kw_only=True, slots=True)
class GatewaySettings:
    """What one gateway process needs; see the module docstring for how to build one."""

    upstream: str
    """Base URL of the vLLM OpenAI server, e.g. ``http://127.0.0.1:8001`` (no default)."""
    api_key_digests: tuple[bytes, ...] = dataclasses.field(repr=False)
    """SHA-256 digests of the accepted development API keys (at least one)."""
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 10 * 1024 * 1024
    """Largest request body accepted; larger ones get 413 before anything is forwarded."""
    upstream_connect_timeout_s: float = 5.0
    """Time allowed to open a TCP connection to the upstream (then 503)."""
    upstream_idle_timeout_s: float = 300.0
    """Longest silence allowed from the upstream, before headers or between chunks (then
    504). There is no total timeout, so long streams live; a non-streaming request sends
    nothing until it is done, so this bounds its generation time too."""
    upstream_keepalive_s: float = 4.0
    """How long an idle pooled upstream connection is kept; below vLLM's 5 s keep-alive so
    the gateway never reuses a connection the upstream is closing."""
    upstream_max_connections: int = 0
    """Cap on pooled upstream connections; 0 means no cap (vLLM schedules for itself)."""
    readiness_timeout_s: float = 2.0
    """Total time `/readyz` gives the upstream's `/health`."""
    retry_after_s: int = 1
    """`Retry-After` sent with 503 responses."""
    graceful_shutdown_s: int = 30
    """On SIGTERM, how long in-flight requests may finish before they are cut."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream", _check_upstream(self.upstream))
        if not self.api_key_digests:
            raise ServingError(
                f"api_key: at least one API key is required (--api-key or {API_KEY_ENV})"
            )
        for digest in self.api_key_digests:
            if not isinstance(digest, bytes) or len(digest) != hashlib.sha256().digest_size:
                raise ServingError("api_key_digests: each entry must be a 32-byte SHA-256 digest")
        if not self.host:
            raise ServingError("host: must not be empty")
        _check_int("port", self.port, low=0, high=65535)
        _check_int("max_body_bytes", self.max_body_bytes, low=1)
        _check_int("upstream_max_connections", self.upstream_max_connections, low=0)
        _check_int("retry_after_s", self.retry_after_s, low=0)
        _check_int("graceful_shutdown_s", self.graceful_shutdown_s, low=0)
        for name in (
            "upstream_connect_timeout_s",
            "upstream_idle_timeout_s",
            "upstream_keepalive_s",
            "readiness_timeout_s",
        ):
            _check_positive(name, getattr(self, name))

    @classmethod
    def create(
        cls, *, upstream: str, api_keys: Iterable[str], **options: object
    ) -> GatewaySettings:
        """Settings from plain keys (hashed here); `options` are the other fields by name."""
        digests = tuple(digest_key(_check_key(key)) for key in api_keys)
        try:
            return cls(upstream=upstream, api_key_digests=digests, **options)  # type: ignore[arg-type]
        except TypeError as exc:
            raise ServingError(f"gateway settings: {exc}") from exc

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, **overrides: object
    ) -> GatewaySettings:
        """Settings from `SERVING_GATEWAY_<FIELD>` variables and `SERVING_API_KEY`.

        `SERVING_API_KEY` may hold several keys separated by commas. `overrides` win over
        the environment.
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            if field.name == "api_key_digests":
                continue
            raw = env.get(ENV_PREFIX + field.name.upper())
            if raw is not None:
                values[field.name] = _parse_env(ENV_PREFIX + field.name.upper(), raw, field.type)
        values.update(overrides)
        upstream = values.pop("upstream", None)
        if not isinstance(upstream, str):
            raise ServingError(f"upstream: required (set {ENV_PREFIX}UPSTREAM)")
        keys = [key.strip() for key in env.get(API_KEY_ENV, "").split(",") if key.strip()]
        return cls.create(upstream=upstream, api_keys=keys, **values)


def _check_upstream(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ServingError(f"upstream: {url!r} is not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServingError(f"upstream: {url!r} must be an http:// or https:// URL with a host")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise ServingError(f"upstream: {url!r} must not carry credentials, a query or fragment")
    if port == 0:
        raise ServingError(f"upstream: {url!r} has port 0")
    return url.rstrip("/")


def _check_key(key: str) -> str:
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ServingError("api_key: must be non-empty printable ASCII without spaces")
    return key


def _check_int(name: str, value: object, *, low: int, high: int | None = None) -> None:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ServingError(f"{name}: {value!r} is not an integer {bound}")


def _check_positive(name: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ServingError(f"{name}: {value!r} is not a positive number of seconds")


def _parse_env(name: str, raw: str, annotation: object) -> object:
    kind = str(annotation)
    try:
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError as exc:
        raise ServingError(f"{name}: {raw!r} is not a number") from exc
    return raw
