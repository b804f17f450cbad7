"""What the runner tells the Locust processes: a JSON file named by LOADTEST_CONFIG.

Locust (and its forked workers) import the locustfile themselves, so the run's settings
travel as a small file in the output dir; the API key travels in LOADTEST_API_KEY only,
never written to disk.

Usage: `write_user_config(UserConfig(...), path)`; in a Locust process `read_user_config()`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from loadtest.errors import LoadTestError

CONFIG_ENV = "LOADTEST_CONFIG"
STOP_USERS = "stop"
API_KEY_ENV = "LOADTEST_API_KEY"


@dataclass(frozen=True, kw_only=True)
class StepRamp:
    """Start with `start_users`, add `step_users` every `step_s` seconds, `steps` steps."""

    start_users: int = 1
    step_users: int = 1
    step_s: float = 10.0
    steps: int = 4

    @property
    def duration_s(self) -> float:
        return self.step_s * self.steps

    def users_at(self, elapsed_s: float) -> int | None:
        """Users wanted `elapsed_s` into the run, None once the ramp is over."""
        if elapsed_s >= self.duration_s:
            return None
        return self.start_users + self.step_users * int(elapsed_s // self.step_s)


@dataclass(frozen=True, kw_only=True)
class Tenancy:
    """One tenant of a workload (loadtest.workload): its scenarios, its share of the users,
    and its bursts `(on_s, off_s)` (None: it sends all the time)."""

    scenarios: tuple[str, ...]
    share: float
    bursts: tuple[float, float] | None = None

    def sends_at(self, elapsed_s: float) -> float:
        """0 when its users may send `elapsed_s` into the run, else the seconds until they may."""
        if self.bursts is None:
            return 0.0
        on, off = self.bursts
        phase = elapsed_s % (on + off)
        return 0.0 if phase < on else on + off - phase


def tenant_key_env(tenant: str) -> str:
    """The variable holding a tenant's key: LOADTEST_API_KEY for the run's own ("")."""
    return API_KEY_ENV + ("_" + tenant.upper().replace("-", "_") if tenant else "")


@dataclass(frozen=True, kw_only=True)
class UserConfig:
    model: str
    prompts_path: str
    records_dir: str
    endpoint: str = "/v1/chat/completions"
    # Fire one Locust "ITL" sample per token gap (exact percentiles in Locust's own stats);
    # off saves load-generator CPU at high token rates (the report uses the records anyway).
    itl_events: bool = True
    step_ramp: StepRamp | None = None
    # Stop after this many requests (one process only; the cross-check sends a fixed set).
    max_requests: int | None = None
    # Send prompts in file order from the first one, instead of from a random place.
    ordered: bool = False
    # Users wanted, read from this file every second (the memory-plan ramp steps on
    # conditions it sees in the engine's metrics, not on a clock); "stop" ends the run.
    users_file: str | None = None
    # Tenant -> its scenarios, share of the users and bursts (loadtest.workload); empty: one
    # tenant, the run's own key, sending all the time.
    tenants: dict[str, Tenancy] = field(default_factory=dict)


def write_user_config(config: UserConfig, path: Path) -> None:
    path.write_text(json.dumps(asdict(config), indent=2) + "\n", encoding="utf-8")


def read_user_config(path: str | None = None) -> UserConfig:
    where = path or os.environ.get(CONFIG_ENV)
    if not where:
        raise LoadTestError(f"{CONFIG_ENV} is not set: start Locust through `python -m loadtest`")
    try:
        data = json.loads(Path(where).read_text(encoding="utf-8"))
        ramp = data.pop("step_ramp", None)
        tenants = {
            name: Tenancy(
                scenarios=tuple(entry["scenarios"]),
                share=entry["share"],
                bursts=tuple(entry["bursts"]) if entry["bursts"] else None,
            )
            for name, entry in data.pop("tenants", {}).items()
        }
        return UserConfig(**data, step_ramp=StepRamp(**ramp) if ramp else None, tenants=tenants)
    except (OSError, ValueError, TypeError) as exc:
        raise LoadTestError(f"{where}: unreadable load-test config: {exc}") from exc


def read_users(path: Path, last: int) -> int | None:
    """The users a users file asks for: None for "stop", `last` while it is unreadable."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return last
    if text == STOP_USERS:
        return None
    try:
        return max(0, int(text))
    except ValueError:
        return last


def write_users(path: Path, users: int | None) -> None:
    """Ask a running UsersFileShape for `users` (None: stop), atomically."""
    partial = path.with_suffix(".tmp")
    partial.write_text(STOP_USERS if users is None else str(users), encoding="utf-8")
    partial.replace(path)
