"""A gateway's `RedisKeyStore` kept fresh from the event loop.

    refresh = RedisKeyRefresh.from_url(settings.redis_url)   # refresh.store: for the auth
    await refresh.load()      # lifespan startup, before traffic; `KeyStoreUnavailable` if not
    refresh.start() ... await refresh.stop()                  # stop: the connection too
    refresh.loaded            # False until a load or round succeeded: /readyz fails meanwhile

Every `REFRESH_INTERVAL_S` (1 s) one round awaits `RedisKeyStore.refresh` on the event loop
(at most two round trips, each bounded by the store's timeout), so a slow or black-holed
Redis holds up the next round, never a request; rounds do not overlap. A key created or
revoked anywhere therefore takes effect in this gateway within about a second: the
interval, plus one round trip, plus one reload if something changed.

Redis unreachable: the round fails, the snapshot stays as it was (known keys keep working,
revocations wait) and the gateway logs it once, then once again when Redis answers. The
log line is the store's message: Redis's address and the client's reason, never a password
or a key. At startup there is no snapshot to keep: the gateway starts all the same (its other
key sources work, and Redis may be back in a second), but `loaded` stays False, so /readyz
fails and a load balancer sends it nothing until a round has loaded the keys; a request that
reaches it meanwhile with a key kept only in Redis gets a 401.
"""

from __future__ import annotations

import logging

from serving.gateway.keys.redis_store import KeyStoreUnavailable, RedisKeyStore
from serving.gateway.periodic import Periodic

log = logging.getLogger(__name__)

REFRESH_INTERVAL_S = 1.0


class RedisKeyRefresh:
    def __init__(self, store: RedisKeyStore, *, interval_s: float = REFRESH_INTERVAL_S) -> None:
        self.store = store
        self._job = Periodic("API key refresh", self.refresh, interval_s=interval_s)
        self._failing = False
        self.loaded = False
        """True once the keys were read from Redis (by `load` or a round)."""

    @classmethod
    def from_url(cls, url: str, *, interval_s: float = REFRESH_INTERVAL_S) -> RedisKeyRefresh:
        return cls(RedisKeyStore.from_url(url), interval_s=interval_s)

    async def load(self) -> None:
        """The first snapshot; raises `KeyStoreUnavailable` naming what went wrong."""
        try:
            await self.store.refresh()
        except KeyStoreUnavailable as exc:
            raise KeyStoreUnavailable(f"cannot load the API keys: {exc}") from None
        self.loaded = True

    async def refresh(self) -> None:
        """One round: reload if the keys changed; a failure is logged, never raised."""
        try:
            changed = await self.store.refresh()
        except KeyStoreUnavailable as exc:
            if not self._failing:
                keys = len(self.store.list_keys())
                log.warning("keeping the last %d API keys: %s", keys, exc)
            self._failing = True
            return
        if self._failing:
            log.warning("API keys refreshed from Redis again")
        self._failing = False
        self.loaded = True
        if changed:
            log.info("API keys reloaded from Redis: %d keys", len(self.store.list_keys()))

    def start(self) -> None:
        self._job.start()

    async def stop(self) -> None:
        """Stop the rounds and close the connection to Redis (at shutdown); the snapshot
        stays, so lookups keep answering."""
        await self._job.stop()
        await self.store.aclose()
