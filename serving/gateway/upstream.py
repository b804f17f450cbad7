"""The hop to one vLLM engine: one connection pool per engine (`routing` picks the engine).

    client = UpstreamClient(settings, "http://127.0.0.1:8001")
    await client.start()      # at ASGI lifespan startup, inside the serving event loop
    response = await client.pool.request("POST", b"/v1/completions", header_lines, body)
    await client.close()      # at lifespan shutdown

Requests are relayed through `hop_pool.HopPool`, a lean keep-alive HTTP/1.1 client (cheaper
in CPU than aiohttp's; see `hop_pool`). The background calls (the upstream's `/health` and
`/v1/models`, off the request path) use an aiohttp session. Both pass bytes through
untouched: no automatic decompression, and no default headers the client did not send
(Accept, Accept-Encoding, User-Agent, Content-Type).
"""

from __future__ import annotations

import json
from typing import NamedTuple

import aiohttp
from yarl import URL

from serving.gateway.catalog import ModelInfo
from serving.gateway.errors import UPSTREAM_FAILURES
from serving.gateway.hop_pool import HopPool
from serving.gateway.settings import GatewaySettings

# Loading reads the adapter's weights from disk and allocates nothing new: seconds at most.
ADAPTER_TIMEOUT_S = 60.0
# Headers aiohttp would otherwise add on its own; the client's own values are forwarded.
_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


class UpstreamClient:
    """The session to one upstream base URL."""

    def __init__(self, settings: GatewaySettings, base_url: str) -> None:
        self._settings = settings
        self._base = base_url
        self._base_bytes = base_url.encode("latin-1")
        self._session: aiohttp.ClientSession | None = None
        self._pool: HopPool | None = None

    async def start(self) -> None:
        """Open the pool and the session; must run inside the event loop that serves
        requests."""
        if self._session is not None:
            return
        settings = self._settings
        self._pool = HopPool(
            self._base,
            connect_timeout_s=settings.upstream_connect_timeout_s,
            idle_timeout_s=settings.upstream_idle_timeout_s,
            keepalive_s=settings.upstream_keepalive_s,
            max_connections=settings.upstream_max_connections,
            max_age_s=settings.upstream_max_connection_age_s,
        )
        connector = aiohttp.TCPConnector(
            limit=settings.upstream_max_connections,
            keepalive_timeout=settings.upstream_keepalive_s,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=None,
                sock_connect=settings.upstream_connect_timeout_s,
                sock_read=settings.upstream_idle_timeout_s,
            ),
            auto_decompress=False,
            skip_auto_headers=_SKIP_AUTO_HEADERS,
        )

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def address(self) -> str:
        """host:port of the engine (the metric label, the name in logs)."""
        url = URL(self._base)
        host = f"[{url.host}]" if url.host and ":" in url.host else url.host
        return f"{host}:{url.port}"

    @property
    def pool(self) -> HopPool:
        if self._pool is None:
            raise RuntimeError("UpstreamClient used before start() (is ASGI lifespan on?)")
        return self._pool

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient used before start() (is ASGI lifespan on?)")
        return self._session

    def gateway_location(self, location: bytes) -> bytes:
        """A redirect target as the client may see it: relative (through the gateway) when
        it points at the upstream, unchanged otherwise."""
        base = self._base_bytes
        if location[: len(base)].lower() == base.lower() and location[
            len(base) : len(base) + 1
        ] in (b"/", b"?", b""):
            return location[len(base) :] or b"/"
        return location

    def url(self, target: bytes) -> URL:
        """The upstream URL for a raw, already percent-encoded `path?query` target."""
        return URL(self._base + target.decode("latin-1"), encoded=True)

    async def fetch_models(self) -> dict[str, ModelInfo] | None:
        """The upstream's served models and adapters (vLLM's `/v1/models`: `max_model_len`,
        an adapter's `parent`), or None when it cannot be read."""
        timeout = aiohttp.ClientTimeout(total=self._settings.readiness_timeout_s)
        try:
            async with self.session.get(self.url(b"/v1/models"), timeout=timeout) as response:
                if response.status != 200:
                    await response.read()
                    return None
                data = await response.json(content_type=None)
        except UPSTREAM_FAILURES:
            return None
        except ValueError:  # not JSON
            return None
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            return None
        models: dict[str, ModelInfo] = {}
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                window = entry.get("max_model_len")
                valid = isinstance(window, int) and not isinstance(window, bool) and window > 0
                parent = entry.get("parent")
                models[entry["id"]] = ModelInfo(
                    window=window if valid else None,
                    parent=parent if isinstance(parent, str) and parent else None,
                    entry=entry,
                )
        return models

    async def load_adapter(self, name: str, path: str) -> str | None:
        """Load LoRA adapter `name` from `path` on this engine (vLLM's runtime LoRA route,
        on with VLLM_ALLOW_RUNTIME_LORA_UPDATING); None when it holds it now, else why not."""
        return await self._adapter_call(
            b"/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}, "already"
        )

    async def unload_adapter(self, name: str) -> str | None:
        """Unload adapter `name`; None when the engine no longer holds it, else why not."""
        return await self._adapter_call(
            b"/v1/unload_lora_adapter", {"lora_name": name}, "cannot be found"
        )

    async def _adapter_call(self, path: bytes, body: dict[str, str], done: str) -> str | None:
        timeout = aiohttp.ClientTimeout(total=ADAPTER_TIMEOUT_S)
        try:
            # The session skips aiohttp's automatic Content-Type; vLLM requires this one.
            headers = {"Content-Type": "application/json"}
            async with self.session.post(
                self.url(path), data=json.dumps(body), headers=headers, timeout=timeout
            ) as response:
                text = (await response.read()).decode(errors="replace")
        except UPSTREAM_FAILURES as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.status == 200:
            return None
        message = _error_message(text)
        # Loaded (or gone) already, e.g. by another gateway replica: what was asked holds.
        if done in message:
            return None
        if response.status == 404 and "Not Found" in message:
            return "the engine has no runtime LoRA routes (VLLM_ALLOW_RUNTIME_LORA_UPDATING)"
        return f"status {response.status}: {message[:300]}"

    async def probe_health(self) -> HealthProbe:
        """Whether the upstream's `/health` answered 200 within `readiness_timeout_s`."""
        timeout = aiohttp.ClientTimeout(total=self._settings.readiness_timeout_s)
        try:
            async with self.session.get(self.url(b"/health"), timeout=timeout) as response:
                await response.read()
                if response.status == 200:
                    return HealthProbe(None)
                return HealthProbe(f"upstream /health answered {response.status}")
        except TimeoutError:
            return HealthProbe("upstream /health timed out", timed_out=True)
        except UPSTREAM_FAILURES as exc:
            return HealthProbe(f"upstream /health failed ({type(exc).__name__})")


def _error_message(text: str) -> str:
    """vLLM's error message out of its JSON error body, else the text itself."""
    try:
        data = json.loads(text)
    except ValueError:
        return text
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    if isinstance(data, dict) and isinstance(data.get("detail"), str):
        return str(data["detail"])
    return text


class HealthProbe(NamedTuple):
    reason: str | None
    """None when healthy, else why not."""
    timed_out: bool = False
    """No answer in time: a busy engine or a hung one (vLLM's /health waits for its engine
    core, which on a loaded CPU host took up to 10 s)."""
