"""One replica in a race (`test_redis_store`): its own process and `RedisQuotaStore`.

    python -m tests.gateway.quota.racer URL KEY_ID LIMITS_JSON TRIES

Loads the scripts, says it is ready (INCR race:ready), waits for the start (BLPOP race:go),
then sends TRIES reservations at once and prints {"admitted": N}. Admitted leases are held,
never ended: a racer for concurrency must keep its slots.
"""

from __future__ import annotations

import asyncio
import json
import sys

import redis

from serving.gateway.quota import Lease, Limits, Scope, ScopedLimits
from serving.gateway.quota.redis_store import RedisQuotaStore

# Generous: a busy machine may take long to start all racers; never waited out.
WAIT_S = 120
TIMEOUT_S = 30.0


async def main(url: str, key_id: str, limits: Limits, tries: int) -> int:
    store = RedisQuotaStore.from_url(url, timeout_s=TIMEOUT_S)
    scopes = (ScopedLimits(Scope(key_id), limits),)
    await store.usage(Scope(f"{key_id}-warm-up"))  # a connection and a script loaded first
    # The start signal on a client of its own (a blocking BLPOP), off the loop.
    with redis.Redis.from_url(url) as signals:
        signals.incr("race:ready")
        await asyncio.to_thread(signals.blpop, ["race:go"], WAIT_S)
    # All at once, pipelined on the store's one connection.
    outcomes = await asyncio.gather(*(store.try_reserve(scopes, 1, 2, 600) for _ in range(tries)))
    await store.close()
    return sum(isinstance(outcome, Lease) for outcome, _ in outcomes)


if __name__ == "__main__":
    url, key_id, limits, tries = sys.argv[1:]
    admitted = asyncio.run(main(url, key_id, Limits.from_mapping(json.loads(limits)), int(tries)))
    print(json.dumps({"admitted": admitted}))
