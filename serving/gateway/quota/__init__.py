"""Quota engine: per-key (and per key+model) limits that hold under concurrency and streams.

limits     what a key may use (`Limits`) and the scopes they apply to
windows    clocks, the sliding minute and calendar budgets ("per minute", exactly)
decision   what admission decides: a `Lease` or a `Refusal`, with the rate-limit state
engine     `QuotaEngine`: reserve at admission, settle with real usage (the lifecycle)
store      where counters live (`QuotaStore`; `InMemoryQuotaStore` for one process)
journal    day and month spending on disk, added up by every writer
"""

from serving.gateway.quota.decision import (
    Admission,
    Lease,
    LeaseState,
    RateLimitStatus,
    Refusal,
    RefusalReason,
    WindowStatus,
    format_reset,
    rate_limit_headers,
    rate_limit_raw_headers,
)
from serving.gateway.quota.engine import QuotaEngine
from serving.gateway.quota.journal import BudgetJournal, SqliteBudgetJournal
from serving.gateway.quota.limits import (
    Limits,
    QuotaSubject,
    Scope,
    ScopedLimits,
)
from serving.gateway.quota.store import InMemoryQuotaStore, QuotaStore, ScopeUsage
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
    "QuotaEngine",
    "QuotaStore",
    "QuotaSubject",
    "RateLimitStatus",
    "Refusal",
    "RefusalReason",
    "Scope",
    "ScopeUsage",
    "ScopedLimits",
    "SqliteBudgetJournal",
    "SystemClock",
    "WindowStatus",
    "format_reset",
    "rate_limit_headers",
    "rate_limit_raw_headers",
]
