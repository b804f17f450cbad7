"""The ledger in Redis: one hash per UTC day, shared by every gateway replica
(docs/usage-reports.md).

    store = RedisUsageStore.from_url("redis://redis:6379/0", retention_days=400)
    await store.write(writer, number, batch)    # one script: HINCRBY per field, EXPIREAT
    rows = await store.read("2026-03-01", "2026-03-31", None)

Rules:
- keys live under a namespace written in braces (a hash tag: one Redis Cluster slot per
  script): `{NS}:day:DAY`, a hash `KEY_ID|MODEL|KIND` -> tokens that replicas add into and
  that expires with the retention; KIND `prompt` and `completion` count every request,
  `batch_prompt` and `batch_completion` the Batch API lines' part of them (a hash without
  them has no batch part; a reader that does not know them skips them and reads totals);
  `{NS}:writer:WRITER`, the writer's last batch number, kept a day past its last write (a
  recorder retries for seconds, not days);
- a batch is one script (`SCRIPT`): in whole or not at all, and not again once its mark is in;
- key ids never hold `|` and the kind is the last field, so a model name holding one reads
  back whole;
- calls use a connection of their own, so quota requests never queue behind a report.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from urllib.parse import quote

from serving.gateway.keys.redis_store import DEFAULT_TIMEOUT_S
from serving.gateway.quota.redis_client import Arg, LuaScript, RedisClient
from serving.gateway.usage_ledger.days import DAY_S, DEFAULT_RETENTION_DAYS, days_from, expires_at
from serving.gateway.usage_ledger.tally import Batch, UsageRow

DEFAULT_NAMESPACE = "qwen-serving:usage"
MARK_TTL_S = DAY_S
KINDS = ("prompt", "completion", "batch_prompt", "batch_completion")

SCRIPT = LuaScript(
    """
-- KEYS[1]: the writer's mark; KEYS[2..]: one usage hash per day.
-- ARGV[1]: the batch number; ARGV[2]: the mark's lifetime (s); ARGV[i + 1]: KEYS[i]'s
-- EXPIREAT; then, per day hash in order, a count n and n (field, tokens) pairs.
local done = tonumber(redis.call('GET', KEYS[1]) or '0')
if done >= tonumber(ARGV[1]) then
  return 0
end
local at = #KEYS + 2
for i = 2, #KEYS do
  local count = tonumber(ARGV[at])
  at = at + 1
  for _ = 1, count do
    redis.call('HINCRBY', KEYS[i], ARGV[at], ARGV[at + 1])
    at = at + 2
  end
  redis.call('EXPIREAT', KEYS[i], ARGV[i + 1])
end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
return 1
"""
)


class RedisUsageStore:
    """A `recorder.LedgerStore` in Redis. Nothing is opened until the first call."""

    def __init__(
        self,
        client: RedisClient,
        *,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        namespace: str = DEFAULT_NAMESPACE,
    ) -> None:
        self._client = client
        self._retention_days = retention_days
        self._prefix = "{" + namespace + "}:"

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        retention_days: int = DEFAULT_RETENTION_DAYS,
        namespace: str = DEFAULT_NAMESPACE,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> RedisUsageStore:
        """Raises ValueError for a URL it cannot use; the message never quotes the URL."""
        client = RedisClient.from_url(url, timeout_s=timeout_s)
        return cls(client, retention_days=retention_days, namespace=namespace)

    def day_key(self, day: str) -> str:
        return f"{self._prefix}day:{day}"

    async def write(self, writer: str, number: int, batch: Batch) -> None:
        fields: dict[str, list[Arg]] = defaultdict(list)
        for (day, key_id, model), counts in batch.items():
            for kind, tokens in zip(KINDS, counts, strict=True):
                if tokens:
                    fields[day] += (f"{key_id}|{model}|{kind}", tokens)
        days = sorted(fields)
        keys = [f"{self._prefix}writer:{quote(writer, safe='')}"]
        keys += [self.day_key(day) for day in days]
        args: list[Arg] = [number, MARK_TTL_S]
        args += [expires_at(day, self._retention_days) for day in days]
        for day in days:
            args += [len(fields[day]) // 2, *fields[day]]
        await self._client.run_script(SCRIPT, keys, args)

    async def read(self, first: str, last: str, key_id: str | None) -> list[UsageRow]:
        days = days_from(first, last)
        # Sent together: one pipelined write, the replies in order.
        replies = await asyncio.gather(
            *(self._client.call("HGETALL", self.day_key(day)) for day in days)
        )
        rows: list[UsageRow] = []
        for day, reply in zip(days, replies, strict=True):
            counts: dict[tuple[str, str], list[int]] = {}
            pairs = list(reply or ())
            for field, value in zip(pairs[::2], pairs[1::2], strict=True):
                key, _, rest = str(field).partition("|")
                model, _, kind = rest.rpartition("|")
                if kind not in KINDS or (key_id is not None and key != key_id):
                    continue
                counts.setdefault((key, model), [0] * len(KINDS))[KINDS.index(kind)] += int(value)
            rows += [UsageRow(day, *row, *tokens) for row, tokens in sorted(counts.items())]
        return rows

    async def close(self) -> None:
        await self._client.close()
