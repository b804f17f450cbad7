"""Quota engine: per-key (and per key+model) limits that hold under concurrency and streams.

`QuotaEngine` reserves at admission and settles with real usage; counters live behind a
`QuotaStore` (`InMemoryQuotaStore` for one process). See `engine` for the request lifecycle,
`windows` for what "per minute" means exactly.
"""

from serving.gateway.quota.admission import Admission, Refusal, RefusalReason
from serving.gateway.quota.clock import Clock, ManualClock, SystemClock
from serving.gateway.quota.engine import QuotaEngine
from serving.gateway.quota.headers import (
    RateLimitStatus,
    WindowStatus,
    format_reset,
    rate_limit_headers,
    rate_limit_raw_headers,
)
from serving.gateway.quota.journal import BudgetJournal, SqliteBudgetJournal
from serving.gateway.quota.lease import Lease, LeaseState
from serving.gateway.quota.limits import (
    InvalidParam,
    Limits,
    QuotaSubject,
    Scope,
    ScopedLimits,
    check_max_tokens,
)
from serving.gateway.quota.memory import InMemoryQuotaStore
from serving.gateway.quota.store import QuotaStore, ScopeUsage

__all__ = [
    "Admission",
    "BudgetJournal",
    "Clock",
    "InMemoryQuotaStore",
    "InvalidParam",
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
    "check_max_tokens",
    "format_reset",
    "rate_limit_headers",
    "rate_limit_raw_headers",
]
