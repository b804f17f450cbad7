"""What `QuotaEngine.admit` returns: an `Admission` to proceed with, or a `Refusal` (a 429).

A refusal maps to OpenAI's error shape (DESIGN.md section 5): minute limits and concurrency
are `requests`/`tokens` + `rate_limit_exceeded`; spent day/month budgets are
`insufficient_quota`. Every refusal has a finite `Retry-After`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

from serving.gateway.quota.headers import RateLimitStatus
from serving.gateway.quota.lease import Lease
from serving.gateway.quota.limits import Scope
from serving.gateway.quota.windows import WINDOW_SECONDS


class RefusalReason(enum.StrEnum):
    RPM = "rpm"
    TPM = "tpm"
    CONCURRENCY = "concurrency"
    DAILY = "daily"
    MONTHLY = "monthly"


# When several limits refuse at once the longest wait is reported; on a tie, the more
# lasting reason wins (a spent budget says more than a busy minute).
REASON_RANK = {
    RefusalReason.MONTHLY: 4,
    RefusalReason.DAILY: 3,
    RefusalReason.TPM: 2,
    RefusalReason.RPM: 1,
    RefusalReason.CONCURRENCY: 0,
}

_ERROR_TYPES = {
    RefusalReason.RPM: "requests",
    RefusalReason.TPM: "tokens",
    RefusalReason.CONCURRENCY: "requests",
    RefusalReason.DAILY: "insufficient_quota",
    RefusalReason.MONTHLY: "insufficient_quota",
}


_NO_STATUS = RateLimitStatus()  # immutable, so one shared default is safe


@dataclass(frozen=True, slots=True)
class Refusal:
    """One limit that said no. Nothing was consumed: not this limit, nor any other."""

    reason: RefusalReason
    scope: Scope
    limit: int
    used: int  # what the limit's counter holds now
    requested: int  # what this request needed: 1 request, a slot, or tokens
    retry_after: float  # seconds; math.inf when the request can never fit
    rate_limit: RateLimitStatus = _NO_STATUS

    status: ClassVar[int] = 429

    @property
    def error_type(self) -> str:
        return _ERROR_TYPES[self.reason]

    @property
    def code(self) -> str:
        if self.reason in (RefusalReason.DAILY, RefusalReason.MONTHLY):
            return "insufficient_quota"
        return "rate_limit_exceeded"

    @property
    def too_large(self) -> bool:
        """The request alone exceeds the limit: waiting will not help, a smaller one might."""
        return self.requested > self.limit

    @property
    def retry_after_header(self) -> str:
        """Whole seconds, at least 1; a request that never fits is told to wait one window."""
        if math.isinf(self.retry_after):
            return str(WINDOW_SECONDS)
        return str(max(1, math.ceil(self.retry_after)))

    @property
    def sort_key(self) -> tuple[float, int]:
        return self.retry_after, REASON_RANK[self.reason]

    @property
    def message(self) -> str:
        where = f"key {self.scope.key_id}"
        if self.scope.model is not None:
            where += f" for model {self.scope.model}"
        retry = f"Please try again in {self.retry_after_header}s."
        if self.reason is RefusalReason.CONCURRENCY:
            return f"Too many concurrent requests on {where}: limit {self.limit}. {retry}"
        if self.reason is RefusalReason.RPM:
            return (
                f"Rate limit reached for requests per minute on {where}: "
                f"limit {self.limit}, used {self.used}. {retry}"
            )
        what = {
            RefusalReason.TPM: "tokens per minute",
            RefusalReason.DAILY: "tokens per day (UTC)",
            RefusalReason.MONTHLY: "tokens per month (UTC)",
        }[self.reason]
        if self.too_large:
            return (
                f"Request too large for {what} on {where}: it needs {self.requested} tokens "
                f"(prompt estimate + max_tokens), the limit is {self.limit}. "
                "Lower max_tokens or shorten the prompt."
            )
        if self.reason is RefusalReason.TPM:
            return (
                f"Rate limit reached for {what} on {where}: limit {self.limit}, "
                f"used {self.used}, requested {self.requested}. {retry}"
            )
        return (
            f"Quota of {what} spent on {where}: limit {self.limit}, used {self.used}, "
            f"requested {self.requested}. {retry}"
        )


@dataclass(frozen=True, slots=True)
class Admission:
    """Go ahead: send `max_tokens` upstream (it may be lower than the client asked for)."""

    lease: Lease
    max_tokens: int
    rate_limit: RateLimitStatus
