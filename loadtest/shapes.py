"""Load shapes beyond "N users for T seconds" (which needs none: `--users N --duration T`).

The step ramp is a Locust `LoadTestShape`: the locustfile imports it only when the run asks
for it, since Locust uses every shape class it finds in the locustfile. The concurrency
sweep is not a shape but a series of constant-user runs (`loadtest.sweep`), so each level
gets its own steady state, statistics and verdict.
"""

from __future__ import annotations

from pathlib import Path

from locust import LoadTestShape

from loadtest.config import StepRamp, read_user_config, read_users


class StepRampShape(LoadTestShape):
    abstract = False

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        ramp = read_user_config().step_ramp
        self.ramp = ramp or StepRamp()

    def tick(self) -> tuple[int, float] | None:
        users = self.ramp.users_at(self.get_run_time())  # type: ignore[no-untyped-call]
        if users is None:
            return None
        # Spawn each step at once: the step, not the spawn rate, is what is measured.
        return users, float(max(users, 1))


class UsersFileShape(LoadTestShape):
    """As many users as the run's users file says (`loadtest.memory` writes it per step)."""

    abstract = False

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        path = read_user_config().users_file
        assert path is not None
        self.path = Path(path)
        self.users = 0

    def tick(self) -> tuple[int, float] | None:
        users = read_users(self.path, self.users)
        if users is None:
            return None
        self.users = users
        return users, float(max(users, 1))
