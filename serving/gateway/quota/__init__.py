"""Quota engine: per-key (and per key+model) limits that hold under concurrency and streams.

limits        what a key may use (`Limits`) and the scopes they apply to
windows       clocks, the sliding minute and calendar budgets ("per minute", exactly)
decision      what admission decides (`decide`, pure): a `Lease` or a `Refusal`, with the
              rate-limit state
headers       the rate-limit state as OpenAI's `x-ratelimit-*` headers
engine        `QuotaEngine`: reserve at admission, settle with real usage (the lifecycle)
store         the `QuotaStore` interface: where counters live, as async atomic operations
memory_store  `InMemoryQuotaStore`: counters in this process, for one gateway
redis_store   `RedisQuotaStore`: counters in Redis, shared by gateway replicas
settle_queue  its lease endings, queued to ride on its next call (one round trip a request)
redis_scripts its server-side scripts (Lua in `lua/`), one per operation
redis_codec   their wire format: store values as arguments, replies as store values
redis_client  its lean pipelined Redis client (URL, hello, reconnect, scripts)
redis_connection  one connection of that client: RESP over an asyncio Protocol, hiredis
failure_policy  `GuardedQuotaStore`: what happens while Redis cannot answer
journal       day and month spending on disk, added up by every writer
"""

from serving.gateway.quota.decision import (
    Admission,
    Lease,
    LeaseState,
    MinuteUsage,
    RateLimitStatus,
    Refusal,
    RefusalReason,
    ScopeState,
    WindowStatus,
    decide,
    rate_limit_status,
)
from serving.gateway.quota.engine import QuotaEngine
from serving.gateway.quota.headers import format_reset, rate_limit_headers, rate_limit_raw_headers
from serving.gateway.quota.journal import BudgetJournal, SqliteBudgetJournal
from serving.gateway.quota.limits import (
    Limits,
    QuotaSubject,
    Scope,
    ScopedLimits,
)
from serving.gateway.quota.memory_store import InMemoryQuotaStore
from serving.gateway.quota.store import QuotaStore, QuotaStoreUnavailable, ScopeUsage
from serving.gateway.quota.windows import Clock, ManualClock, SystemClock

__all__ = [
    "Admission",
    "BudgetJournal",
    "Clock",
    "InMemoryQuotaStore",
    "Lease",
    "LeaseState",
    "Limits",
    "ManualClock",
    "MinuteUsage",
    "QuotaEngine",
    "QuotaStore",
    "QuotaStoreUnavailable",
    "QuotaSubject",
    "RateLimitStatus",
    "Refusal",
    "RefusalReason",
    "Scope",
    "ScopeState",
    "ScopeUsage",
    "ScopedLimits",
    "SqliteBudgetJournal",
    "SystemClock",
    "WindowStatus",
    "decide",
    "format_reset",
    "rate_limit_headers",
    "rate_limit_raw_headers",
    "rate_limit_status",
]
