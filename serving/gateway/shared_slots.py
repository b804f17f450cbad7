"""The fair queue's slots shared by every gateway replica on one Redis (docs/fair-sharing.md,
across gateway replicas).

    shared = SharedSlots(client, queue, replica="…", interval_s=0.2)
    await shared.sync()        # every interval_s (a `Periodic` job): report, claim, apply

Rules:
- each replica reports its demand (seats running and waiting, per key, and the keys' weights)
  and claims slots in one atomic script (`shared_slots.lua`); the live replicas' claims never
  sum past the engines' slots, and a claim never drops below what the replica runs;
- from every replica's report each computes the same shares (`slot_shares`): its queue then
  runs at most min(claim, its share) and each key at most its share here, so a key's flood
  through one replica holds back its requests on every replica and a key new to a replica
  finds a reserved slot there;
- a replica that stops reporting is forgotten after `TTL_INTERVALS` intervals, and its slots
  go back to the others;
- Redis unreachable: the queue runs this replica's own part, the engines' slots divided by
  `--redis-replicas` (as the quota's local limits), with a metric and a log line.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from importlib import resources

from serving.gateway.fair_queue import FairQueue
from serving.gateway.quota.redis_client import LuaScript, RedisClient
from serving.gateway.quota.redis_connection import RedisError
from serving.gateway.slot_shares import share_slots

logger = logging.getLogger(__name__)

# Intervals without a report before a replica is forgotten (its slots go to the others).
TTL_INTERVALS = 20
NAMESPACE = "fq"


@functools.cache
def _script() -> LuaScript:
    source = resources.files(__package__).joinpath("shared_slots.lua").read_text("utf-8")
    return LuaScript(source)


class SharedSlots:
    def __init__(
        self,
        client: RedisClient,
        queue: FairQueue,
        *,
        interval_s: float,
        replicas: int,
        replica: str | None = None,
    ) -> None:
        self._client = client
        self._queue = queue
        self._ttl_ms = max(1, round(interval_s * TTL_INTERVALS * 1000))
        self._replicas = replicas
        self.replica = replica or uuid.uuid4().hex[:16]
        self._keys = [f"{NAMESPACE}:{{slots}}:{name}" for name in ("replicas", "claims", "demand")]
        self._target = queue.reserved
        self.up = True
        self.errors = 0
        self.claim = 0

    async def sync(self) -> None:
        """Report this replica's demand, renew its claim, and apply the shares."""
        queue = self._queue
        report = json.dumps(queue.demand(), separators=(",", ":"))
        args = (self.replica, self._ttl_ms, queue.engine_slots, queue.running, self._target, report)
        try:
            claim, flat = await self._client.run_script(_script(), self._keys, args)
        except RedisError as exc:
            self._fall_back(exc)
            return
        if not self.up:
            logger.warning("fair queue: Redis answers again; slots shared with the replicas")
        self.up = True
        demand: dict[str, dict[str, int]] = {}
        running: dict[str, dict[str, int]] = {}
        weights: dict[str, float] = {}
        for replica, text in zip(flat[::2], flat[1::2], strict=True):
            seats, runs = demand[replica], running[replica] = {}, {}
            for key, (count, now, weight) in json.loads(text).items():
                seats[key], runs[key], weights[key] = int(count), int(now), float(weight)
        shares = share_slots(
            queue.engine_slots,
            reserved=queue.reserved,
            demand=demand,
            weights=weights,
            running=running,
        )
        self._target = shares.replica(self.replica)
        self.claim = int(claim)
        queue.share(min(self.claim, self._target), dict(shares.keys.get(self.replica, {})))

    def _fall_back(self, exc: RedisError) -> None:
        self.errors += 1
        if self.up:
            logger.warning(
                "fair queue: Redis unreachable (%s); this replica runs its own part of the "
                "slots (%d of %d, --redis-replicas %d) until it answers",
                exc, self.own_part(), self._queue.engine_slots, self._replicas,
            )  # fmt: skip
        self.up = False
        self._queue.share(self.own_part(), None)

    async def close(self) -> None:
        await self._client.close()

    def own_part(self) -> int:
        """The slots this replica runs alone: the engines' divided by the replicas."""
        queue = self._queue
        return max(queue.reserved + 1, queue.engine_slots // self._replicas)
