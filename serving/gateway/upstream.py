"""The hop to vLLM: one pooled aiohttp session per gateway app.

    client = UpstreamClient(settings)
    await client.start()      # at ASGI lifespan startup, inside the serving event loop
    ...client.session.request(method, client.url(b"/v1/models"), ...)
    await client.close()      # at lifespan shutdown

DESIGN.md section 8 measured aiohttp's client as the cheap choice for this hop. The session
passes bytes through untouched: no automatic decompression, and no default headers the
client did not send (Accept, Accept-Encoding, User-Agent, Content-Type).
"""

from __future__ import annotations

import aiohttp
from yarl import URL

from serving.gateway.errors import UPSTREAM_FAILURES
from serving.gateway.settings import GatewaySettings

# Headers aiohttp would otherwise add on its own; the client's own values are forwarded.
_SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


class UpstreamClient:
    """The session to one upstream base URL; routing over replicas builds on this."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        self._base = settings.upstream
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the session; must run inside the event loop that serves requests."""
        if self._session is not None:
            return
        settings = self._settings
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
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("UpstreamClient used before start() (is ASGI lifespan on?)")
        return self._session

    def url(self, target: bytes) -> URL:
        """The upstream URL for a raw, already percent-encoded `path?query` target."""
        return URL(self._base + target.decode("latin-1"), encoded=True)

    async def fetch_models(self) -> dict[str, int | None] | None:
        """The upstream's served models and their context windows (vLLM's `max_model_len`),
        or None when `/v1/models` cannot be read."""
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
        models: dict[str, int | None] = {}
        for entry in entries:
            if isinstance(entry, dict) and isinstance(entry.get("id"), str):
                window = entry.get("max_model_len")
                valid = isinstance(window, int) and not isinstance(window, bool) and window > 0
                models[entry["id"]] = window if valid else None
        return models

    async def probe_health(self) -> str | None:
        """None when the upstream's `/health` answers 200, else a short reason."""
        timeout = aiohttp.ClientTimeout(total=self._settings.readiness_timeout_s)
        try:
            async with self.session.get(self.url(b"/health"), timeout=timeout) as response:
                await response.read()
                if response.status == 200:
                    return None
                return f"upstream /health answered {response.status}"
        except UPSTREAM_FAILURES as exc:
            return f"upstream /health failed ({type(exc).__name__})"
