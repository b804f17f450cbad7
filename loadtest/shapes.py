"""Load shapes beyond "N users for T seconds" (which needs none: `--users N --duration T`).

The step ramp is a Locust `LoadTestShape`: the locustfile imports it only when the run asks
for it, since Locust uses every shape class it finds in the locustfile. The concurrency
sweep is not a shape but a series of constant-user runs (`loadtest.sweep`), so each level
gets its own steady state, statistics and verdict.
"""

from __future__ import annotations

from locust import LoadTestShape

from loadtest.config import StepRamp, read_user_config


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
