"""The gateway's settings: one pydantic-settings model, the one place their names, defaults,
help texts and checks are written (docs/gateway.md, settings).

    settings = GatewaySettings.create(upstream="http://127.0.0.1:8001", api_keys=["sk-dev"])
    settings = GatewaySettings.from_env()            # SERVING_GATEWAY_<FIELD>, SERVING_API_KEY
    settings = GatewaySettings.load(cli_source(parser)(parsed_args=args))   # + flags

Rules:
- each field is the flag `--<field-name>` (older spellings kept as `FlagAlias`) and the
  variable `SERVING_GATEWAY_<FIELD>`; its docstring is its help; a flag beats the
  environment, which beats the default;
- development keys are hashed as they are read and only the digests are kept, out of the repr;
- `load` and `from_env` open `serving.paths.keys_db_path()` when neither `keys_db` nor
  `keys_file` is set; `create` reads no environment and defaults nothing;
- every validation failure is a `ServingError` naming the field, the value, its flag and its
  variable.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    CliSuppress,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from serving import paths
from serving.errors import ServingError
from serving.gateway.addresses import DNS_PREFIX, check_upstream, parse_nameserver
from serving.gateway.quota.engine import DEFAULT_LEASE_TTL, DEFAULT_MAX_TOKENS
from serving.gateway.quota.redis_store import DEFAULT_TIMEOUT_S
from serving.gateway.setting_names import ENV_PREFIX, settings_error
from serving.gateway.usage_ledger.days import DEFAULT_RETENTION_DAYS
from serving.ports import GATEWAY_PORT
from serving.vllm_limits import DEFAULT_STREAM_INTERVAL

API_KEY_ENV = "SERVING_API_KEY"
ADMIN_KEY_ENV = "SERVING_ADMIN_KEY"
REDIS_SCHEMES = ("redis", "rediss", "unix")


@dataclass(frozen=True, slots=True)
class FlagAlias:
    """Another spelling of a field's flag that callers use, kept working:
    `drain_delay_s: Annotated[float, FlagAlias("--drain-delay")] = 5.0`."""

    flag: str


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


class GatewaySettings(BaseSettings):
    """What one gateway process needs; see the module docstring for how to build one."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        frozen=True,
        extra="forbid",
        use_attribute_docstrings=True,
        cli_kebab_case=True,
        cli_hide_none_type=True,
        cli_show_env_vars=True,
    )

    upstream: str
    """Base URL of the vLLM OpenAI server, e.g. http://127.0.0.1:8001; several engines
    serving the same model: their URLs comma-separated (see --routing); engines that come and
    go: dns+http://NAME:PORT, a name (a Kubernetes headless Service) resolved every few
    seconds to the engines' addresses (docs/scale-out.md, "Engine discovery")."""
    dns_nameserver: NonEmpty | None = None
    """With a dns+ upstream: the DNS server asked, IP[:PORT]; unset, /etc/resolv.conf's."""
    discovery_interval_s: Seconds = 5.0
    """With a dns+ upstream: the longest time between two lookups of the name (sooner when
    its answer's TTL runs out first; at least one second)."""
    discovery_max_engines: int = Field(default=64, ge=1)
    """With a dns+ upstream: the most engines taken from one answer (the lowest addresses;
    the other records are dropped with a warning)."""
    discovery_allow_local: bool = False
    """With a dns+ upstream: keep loopback, link-local, unspecified and the gateway's own
    addresses (engines on this machine, as in tests); off, they are dropped with a warning."""
    api_key_digests: CliSuppress[tuple[Sha256Hex, ...]] = Field(default=(), repr=False)
    """`hash_secret` digests of the development keys (no limits, public id `dev`); set them
    with --api-key or SERVING_API_KEY, never as digests."""
    admin_key_digests: CliSuppress[tuple[Sha256Hex, ...]] = Field(default=(), repr=False)
    """`hash_secret` digests of the operator's admin keys (the /admin/ API: usage reports,
    runtime adapters; never a tenant key); set them with --admin-key or SERVING_ADMIN_KEY.
    None: the admin API answers 404."""
    keys_db: NonEmpty | None = None
    """The SQLite key store `serving keys` writes; day/month budgets are persisted in it.
    Unset: keys.db in the serving home (the same file `serving keys` uses; see below), unless
    --keys-file is given."""
    keys_file: NonEmpty | None = None
    """A declarative keys file (YAML/JSON of hashed keys, e.g. a mounted Kubernetes Secret),
    re-read when it changes."""
    host: NonEmpty = "127.0.0.1"
    """Address to listen on."""
    port: int = Field(default=GATEWAY_PORT, ge=0, le=65535)
    """Port to listen on."""
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    """Every series of /metrics on this port (same host), the per-key ones (spend, quota
    rejections, queue waits) here alone: the API port's has the aggregate ones only."""
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1)
    """Largest request body accepted; larger ones get 413 before anything is forwarded.
    32 MiB holds a realistic set of base64 images (base64 is 4/3 of the file: four 6 MB
    phone photos, or one large PNG screenshot), below OpenAI's 50 MB per request because
    the gateway holds each body in memory until its request ends, about three copies
    (the bytes, the parsed JSON, the body sent on): budget ~100 MiB per image upload in
    flight, or lower this."""
    max_pooling_inputs: int = Field(default=2048, ge=1)
    """Inputs (or rerank pairs) a request may hold, OpenAI's 2048; more: 400, nothing reserved."""
    max_images_per_request: int = Field(default=8, ge=0)
    """Images one chat request may carry (more: 400 before anything is reserved); 0 refuses
    images (a text-only model). `serving up` sets the profile's limit_mm_per_prompt.image."""
    image_patch_size: int = Field(default=14, ge=1)
    """The vision encoder's patch side in pixels (the model's vision_config.patch_size):
    with image_merge_size and the pixel bounds, what an image costs in prompt tokens."""
    image_merge_size: int = Field(default=2, ge=1)
    """Patches merged into one token along each side (vision_config.spatial_merge_size)."""
    image_min_pixels: int = Field(default=56 * 56, ge=1)
    """Smallest image area the processor resizes to (preprocessor_config.json min_pixels,
    or size.shortest_edge)."""
    image_max_pixels: int = Field(default=16384 * 28 * 28, ge=1)
    """Largest image area the processor resizes to (preprocessor_config.json max_pixels, or
    size.longest_edge). The default is what Qwen2-VL and Qwen2.5-VL checkpoints ship
    (12845056; transformers' own default is 1003520): the larger of the two, so the token
    estimate stays an upper bound when the model's value is not known."""
    upstream_connect_timeout_s: Annotated[Seconds, FlagAlias("--upstream-connect-timeout")] = 5.0
    """Time allowed to open a TCP connection to the upstream (then 503)."""
    upstream_idle_timeout_s: Annotated[Seconds, FlagAlias("--upstream-idle-timeout")] = 300.0
    """Longest silence allowed from the upstream, before headers or between chunks (then
    504). There is no total timeout, so long streams live; a non-streaming request sends
    nothing until it is done, so this bounds its generation time too."""
    upstream_keepalive_s: Seconds = 4.0
    """How long an idle pooled upstream connection is kept; below vLLM's 5 s keep-alive so
    the gateway never reuses a connection the upstream is closing."""
    upstream_max_connections: int = Field(default=0, ge=0)
    """Cap on pooled upstream connections; 0 means no cap (vLLM schedules for itself)."""
    upstream_max_connection_age_s: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    """An upstream connection this old is closed after its response instead of being reused
    (0: no limit). Behind a Service with several engine replicas (Kubernetes), set it so that
    a draining replica stops getting requests on kept-alive connections."""
    readiness_timeout_s: Seconds = 2.0
    """Total time /readyz gives the upstream's /health."""
    retry_after_s: int = Field(default=1, ge=0)
    """Retry-After sent with 503 responses."""
    header_timeout_s: Annotated[Seconds, FlagAlias("--header-timeout")] = 10.0
    """Time a client has to send a request's headers, from connecting or from its first
    byte (then 408 and the connection is closed)."""
    body_timeout_s: Annotated[Seconds, FlagAlias("--body-timeout")] = 30.0
    """Time a client has to send a request's whole body once its headers arrived (then 408)."""
    keepalive_timeout_s: Annotated[int, FlagAlias("--keepalive-timeout")] = Field(default=75, ge=1)
    """How long an idle client connection is kept open for its next request. Longer than the
    clients' own pools keep one (aiohttp 15 s, httpx 5 s) and a cloud load balancer's idle
    timeout (60 s), so a client never sends a request on a connection the gateway is closing
    (an error a POST is not retried on)."""
    default_max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    """max_tokens sent upstream when neither the client nor the key sets one (also limited
    by the model's context window when the upstream reports it)."""
    lease_ttl_s: Seconds = DEFAULT_LEASE_TTL
    """A quota lease not renewed for this long is reclaimed (with its whole reservation
    charged); running requests renew theirs. With Redis, also how long the requests of a
    replica that died hold their slots."""
    health_interval_s: Seconds = 5.0
    """How often the upstream's health and model list are checked in the background."""
    drain_delay_s: Annotated[float, FlagAlias("--drain-delay")] = Field(
        default=5.0, ge=0, allow_inf_nan=False
    )
    """On SIGTERM, how long /readyz answers 503 while requests are still served, so load
    balancers stop sending traffic before the listener closes (0: close at once)."""
    graceful_shutdown_s: Annotated[int, FlagAlias("--graceful-timeout")] = Field(default=30, ge=0)
    """After the drain delay, how long in-flight requests may finish before they are cut."""
    routing: Literal["affinity", "least-loaded", "round-robin"] = "affinity"
    """How requests are spread over several upstream engines: `affinity` sends a prompt to
    the engine that served its longest prefix (a conversation stays where vLLM's prefix
    cache holds it) unless that engine is overloaded, else least-loaded; `least-loaded`, the
    engine with the fewest requests in flight; `round-robin`, each in turn."""
    routing_overload: int = Field(default=8, ge=0)
    """With `affinity`: a prompt's engine is passed over while it has this many more requests
    in flight (from this gateway) than the least-loaded engine."""
    engine_slots: int | None = Field(default=None, ge=1)
    """Sequences one engine runs well at once (vLLM's max_num_seqs; `serving up` sets the
    profile's). Set, the gateway lets at most this many requests per engine run and the rest
    wait in it, per key, for a fair turn (`scheduling`); unset, every admitted request goes
    straight to vLLM's own first-come-first-served queue."""
    scheduling: Literal["fair", "fcfs"] = "fair"
    """With engine_slots: `fair`, a free slot goes to the waiting key that has been served
    the fewest tokens (per its weight), so one key's flood delays that key, not the others;
    `fcfs`, no gateway queue, vLLM's order (as without engine_slots)."""
    reserved_slots: int = Field(default=1, ge=0)
    """With fair scheduling: slots no single key may take (of engine_slots x engines), so
    that a key arriving while another floods finds one free at once instead of waiting for
    one of the flood's requests to end (vLLM never preempts a running sequence for it).
    The default comes from `make bench-fairness`'s curve (docs/fair-sharing.md)."""
    queue_timeout_s: Seconds = 30.0
    """Longest a request waits for a slot; then 503 `engine_overloaded` with Retry-After,
    nothing charged."""
    stream_interval: int = Field(default=DEFAULT_STREAM_INTERVAL, ge=1, le=64)
    """Tokens vLLM gathers into one event of a chat or completion stream (its per-request
    `stream_interval`; a stream's first token still comes at once). Fewer events cost vLLM's
    API server less per token, which every other request on a busy engine feels
    (docs/fair-sharing.md); 1: an event per token, vLLM's default."""
    engine_priority: bool = False
    """Send each key's priority class to vLLM as the request's `priority`, for engines run
    with priority scheduling (a profile's scheduling_policy); clients never can."""
    serve_routes: tuple[Literal["tokenize"], ...] = ()
    """Opt-in vLLM routes served besides the metered ones, all free of charge: `tokenize`
    (vLLM's /tokenize and /detokenize, at the root as vLLM serves them). Every other route
    vLLM has is refused (see docs/gateway.md, "Routes")."""
    runtime_adapters: bool = False
    """Let the admin API load and unload LoRA adapters on every engine (kept in keys.db, or in
    Redis with --redis-url; the engines need VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)."""
    redis_url: NonEmpty | None = Field(default=None, repr=False)
    """Redis holding the quota counters that gateway replicas share, so each key's limits hold
    across all of them (redis://, rediss:// or unix://; may carry a password, so it is never
    shown). Unset: each gateway counts in its own process (day/month budgets in keys.db)."""
    redis_timeout_s: Seconds = DEFAULT_TIMEOUT_S
    """Longest a quota call waits for Redis; past it (or at once if Redis is unreachable),
    --redis-failure-policy answers instead."""
    redis_failure_policy: Literal["closed", "local"] = "closed"
    """What a request gets while Redis cannot answer: `closed`, a 503 with Retry-After (and
    /readyz fails until Redis answers again); `local`, admission against counters in this
    process with each limit divided by --redis-replicas (rounded down)."""
    redis_replicas: int = Field(default=1, ge=1)
    """How many gateway replicas share Redis: the `local` failure policy grants each one
    this share of every limit, so replicas that all lost Redis together stay within it (and
    the fair queue this share of the engines' slots while Redis is away)."""
    slot_sync_interval_s: Seconds = 0.2
    """With --redis-url and fair scheduling: how often a replica reports its queue to Redis
    and renews its claim on the engines' slots, which the replicas share (a replica silent
    for 20 intervals is forgotten and its slots go to the others)."""
    usage_retention_days: int = Field(default=DEFAULT_RETENTION_DAYS, ge=1, le=36_600)
    """Days the tokens of each key, model and day are kept for usage reports (in keys.db,
    or in Redis with --redis-url); older days are pruned."""
    batch_db: NonEmpty | None = None
    """The Batch API's SQLite file (files and batches of each key). Unset: batches.db beside
    keys.db; with neither, the Batch API is not served (404)."""
    batch_files_dir: NonEmpty | None = None
    """Where uploaded and output files' contents are kept. Unset: batch-files beside batch_db."""
    max_batch_file_bytes: int = Field(default=200 * 1000 * 1000, ge=1)
    """Largest file `POST /v1/files` takes (OpenAI's 200 MB for batch input); larger: 413."""
    max_batch_lines: int = Field(default=50_000, ge=1)
    """Most request lines a batch's input file may hold (OpenAI's 50,000)."""
    batch_concurrency: int = Field(default=4, ge=1)
    """Lines of one batch in flight at once; each still waits behind every interactive request."""

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        return check_upstream(value)

    @field_validator("dns_nameserver")
    @classmethod
    def _check_nameserver(cls, value: str | None) -> str | None:
        if value is not None:
            parse_nameserver(value)
        return value

    @model_validator(mode="after")
    def _check_reserved_slots(self) -> GatewaySettings:
        slots = self.queue_slots
        if slots is not None and self.reserved_slots >= slots:
            raise ValueError(
                f"reserved_slots: {self.reserved_slots} is not below engine_slots x engines "
                f"({slots}), so no key could run"
            )
        return self

    @property
    def queue_slots(self) -> int | None:
        """Sequences the fair queue lets run with every listed engine in the rotation (it
        follows the engines that are: `Fleet.size_queue`); None without a queue."""
        if self.engine_slots is None or self.scheduling != "fair":
            return None
        return self.engine_slots * len(self.upstream_urls)

    @property
    def upstream_urls(self) -> tuple[str, ...]:
        """The engines' base URLs, in the order given (with discovery: the one template)."""
        return tuple(self.upstream.removeprefix(DNS_PREFIX).split(","))

    @property
    def discovered(self) -> bool:
        """Whether the engines come from DNS (a dns+ upstream) rather than a fixed list."""
        return self.upstream.startswith(DNS_PREFIX)

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, url: str | None) -> str | None:
        if url is None:
            return None
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 (raises on a bad port)
        except ValueError as exc:
            # Not the URL itself in the message: it may carry a password.
            raise ValueError(f"not a valid URL ({type(exc).__name__})") from None
        if parts.scheme not in REDIS_SCHEMES or not (parts.hostname or parts.path):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return url

    @model_validator(mode="after")
    def _check_image_pixels(self) -> GatewaySettings:
        if self.image_max_pixels < self.image_min_pixels:
            raise ValueError(
                f"image_max_pixels: {self.image_max_pixels} is below image_min_pixels "
                f"{self.image_min_pixels}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_key_store(cls, data: Any) -> Any:
        # Only values that were set reach here (pydantic-settings leaves defaults out), and
        # `create` always sets both, so this applies to loaded settings alone.
        if isinstance(data, dict) and "keys_db" not in data and "keys_file" not in data:
            return {**data, "keys_db": str(paths.keys_db_path())}
        return data

    @model_validator(mode="after")
    def _adapters_need_a_store(self) -> GatewaySettings:
        if self.runtime_adapters and not (self.keys_db or self.redis_url):
            raise ValueError("runtime_adapters: needs --keys-db or --redis-url to keep them in")
        return self

    @model_validator(mode="after")
    def _require_a_key_source(self) -> GatewaySettings:
        if not self.api_key_digests and not self.keys_db and not self.keys_file:
            raise ValueError(
                f"keys: a key source is required: --keys-db, --keys-file, --api-key or "
                f"{API_KEY_ENV}"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments, then the environment; no .env or secrets files."""
        return init_settings, _Environment(settings_cls)

    @classmethod
    def create(cls, *, upstream: str, api_keys: Iterable[str], **fields: object) -> GatewaySettings:
        """Settings from exactly these values (plain `api_keys`, and `admin_keys` if given,
        hashed here; the other fields by name), ignoring the environment."""
        admin_keys = fields.pop("admin_keys", ())
        if not isinstance(admin_keys, list | tuple) or not all(
            isinstance(key, str) for key in admin_keys
        ):
            raise ServingError("admin_keys: must be a list of keys")
        values = {"keys_db": None, "keys_file": None, **fields}
        values.update(
            upstream=upstream,
            api_key_digests=hash_keys(api_keys),
            admin_key_digests=hash_keys(admin_keys),
        )
        settings = cls.__new__(cls)
        try:
            # BaseModel's own __init__ validates the values alone: BaseSettings' would merge
            # in the environment.
            BaseModel.__init__(settings, **values)
        except ValidationError as exc:
            raise settings_error(exc, cls.model_fields) from exc
        return settings

    @classmethod
    def load(
        cls,
        cli: CliSettingsSource[GatewaySettings] | None = None,
        *,
        api_keys: Sequence[str] = (),
        admin_keys: Sequence[str] = (),
        **fields: Any,
    ) -> GatewaySettings:
        """Settings as `serving gateway` reads them: the flags in `cli` and `fields`, then
        `SERVING_GATEWAY_*`, then the defaults. Development keys: `api_keys`, else
        `SERVING_API_KEY`; admin keys: `admin_keys`, else `SERVING_ADMIN_KEY`."""
        options: dict[str, Any] = {"_cli_settings_source": cli, **fields}
        if api_keys:
            options["api_key_digests"] = hash_keys(api_keys)
        if admin_keys:
            options["admin_key_digests"] = hash_keys(admin_keys)
        try:
            return cls(**options)
        except ValidationError as exc:
            raise settings_error(exc, cls.model_fields) from exc
        except SettingsError as exc:
            raise ServingError(f"gateway settings: {exc}") from exc

    @classmethod
    def from_env(cls, **fields: Any) -> GatewaySettings:
        """Settings from `SERVING_GATEWAY_<FIELD>` and `SERVING_API_KEY`; `fields` win."""
        return cls.load(**fields)


class _Environment(EnvSettingsSource):
    """`SERVING_GATEWAY_<FIELD>` for each field but the development and admin keys: those
    come from `SERVING_API_KEY` and `SERVING_ADMIN_KEY`, plain and comma-separated, and are
    hashed here."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        if field_name in ("api_key_digests", "admin_key_digests"):
            return None, field_name, False
        return super().get_field_value(field, field_name)

    def __call__(self) -> dict[str, Any]:
        values = super().__call__()
        keys = split_dev_keys(os.environ.get(API_KEY_ENV, ""))
        if keys:
            values["api_key_digests"] = hash_keys(keys)
        admin = split_dev_keys(os.environ.get(ADMIN_KEY_ENV, ""), where=ADMIN_KEY_ENV)
        if admin:
            values["admin_key_digests"] = hash_keys(admin)
        return values


def cli_source(parser: argparse.ArgumentParser | None = None) -> CliSettingsSource[GatewaySettings]:
    """The flags generated from `GatewaySettings`, added to `parser` (or a parser of its own);
    load parsed arguments with `source(parsed_args=namespace)`."""
    return CliSettingsSource(GatewaySettings, root_parser=parser, cli_shortcuts=flag_aliases())


def flag_aliases() -> dict[str, list[str]]:
    """Generated flag name -> the older spellings kept for it (from `FlagAlias` metadata)."""
    aliases: dict[str, list[str]] = {}
    for name, field in GatewaySettings.model_fields.items():
        kept = [
            item.flag.removeprefix("--") for item in field.metadata if isinstance(item, FlagAlias)
        ]
        if kept:
            aliases[name.replace("_", "-")] = kept
    return aliases


def split_dev_keys(text: str, *, where: str = API_KEY_ENV) -> list[str]:
    """The keys in a `SERVING_API_KEY` (or `SERVING_ADMIN_KEY`) value: comma-separated, blanks
    ignored."""
    return [check_key(key.strip(), where=where) for key in text.split(",") if key.strip()]


def check_key(key: str, *, where: str = "api_key") -> str:
    if not key or not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise ServingError(f"{where}: a key must be non-empty printable ASCII without spaces")
    return key


def hash_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """Development keys as the digests the settings keep (the keys themselves are dropped)."""
    # Imported here: the keys package loads its stores, which `serving --help` does not need.
    from serving.gateway.keys.credentials import hash_secret

    return tuple(hash_secret(check_key(key)) for key in keys)
