"""The gateway's settings: one frozen value object, validated on construction.

    settings = GatewaySettings.create(upstream="http://127.0.0.1:8001", api_keys=["sk-dev"])
    settings = GatewaySettings.create(upstream=..., api_keys=[], keys_db="/var/serving/keys.db")
    settings = GatewaySettings.from_env()          # SERVING_GATEWAY_* and SERVING_API_KEY

Keys come from a key store (`keys_db`, `keys_file`: limits, revocation) and/or development
keys (`api_keys`: no limits, public id `dev`). Development keys are never stored: only their
SHA-256 digests, which `auth` compares in constant time.
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
    """SHA-256 digests of the accepted development API keys (keys without limits)."""
    keys_db: str | None = None
    """The SQLite key store `serving keys` writes; day/month budgets are persisted in it."""
    keys_file: str | None = None
    """A declarative keys file (YAML/JSON of hashed keys, e.g. a mounted Kubernetes Secret)."""
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
    header_timeout_s: float = 10.0
    """Time a client has to send a request's headers, from connecting or from its first
    byte (then 408 and the connection is closed)."""
    body_timeout_s: float = 30.0
    """Time a client has to send a request's whole body once its headers arrived (then 408)."""
    default_max_tokens: int = 4096
    """max_tokens sent upstream when neither the client nor the key sets one (also limited
    by the model's context window when the upstream reports it)."""
    lease_ttl_s: float = 600.0
    """A quota lease not renewed for this long is reclaimed; running requests renew theirs."""
    health_interval_s: float = 5.0
    """How often the upstream's health and model list are checked in the background."""
    drain_delay_s: float = 5.0
    """On SIGTERM, how long `/readyz` answers 503 while requests are still served, so load
    balancers stop sending traffic before the listener closes (0: close at once)."""
    graceful_shutdown_s: int = 30
    """After the drain delay, how long in-flight requests may finish before they are cut."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream", _check_upstream(self.upstream))
        if not self.api_key_digests and not self.keys_db and not self.keys_file:
            raise ServingError(
                f"api_key: a key source is required: --keys-db, --keys-file, --api-key "
                f"or {API_KEY_ENV}"
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
        _check_int("default_max_tokens", self.default_max_tokens, low=1)
        for name in (
            "upstream_connect_timeout_s",
            "upstream_idle_timeout_s",
            "upstream_keepalive_s",
            "readiness_timeout_s",
            "header_timeout_s",
            "body_timeout_s",
            "lease_ttl_s",
            "health_interval_s",
        ):
            _check_positive(name, getattr(self, name))
        delay = self.drain_delay_s
        if not isinstance(delay, int | float) or not 0 <= delay < math.inf:
            raise ServingError(f"drain_delay_s: {self.drain_delay_s!r} is not a number >= 0")
        for name in ("keys_db", "keys_file"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ServingError(f"{name}: {value!r} is not a file path")

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
