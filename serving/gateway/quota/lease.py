"""A lease: one admitted request's hold on a concurrency slot and its token reservation.

A lease ends exactly once: settled (response done), aborted (client went away), failed
(upstream produced nothing) or expired (nobody ended it within its time to live, e.g. a bug
or a crashed replica). Ending an ended lease is a no-op, so cleanup paths may overlap.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from serving.gateway.quota.limits import Scope


class LeaseState(enum.Enum):
    ACTIVE = "active"
    SETTLED = "settled"
    ABORTED = "aborted"
    FAILED = "failed"
    EXPIRED = "expired"


@dataclass(slots=True, eq=False)
class Lease:
    """Owned by the store that issued it; the proxy only passes it back to end it."""

    lease_id: int
    scopes: tuple[Scope, ...]
    prompt_estimate: int
    max_tokens: int
    # Where the reservation was booked, so the settlement corrects that same bucket and period.
    bucket: int
    day: str
    month: str
    expires_at: float
    state: LeaseState = LeaseState.ACTIVE
    charged_tokens: int | None = None

    @property
    def key_id(self) -> str:
        return self.scopes[0].key_id

    @property
    def reserved_tokens(self) -> int:
        return self.prompt_estimate + self.max_tokens

    @property
    def active(self) -> bool:
        return self.state is LeaseState.ACTIVE
