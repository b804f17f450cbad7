"""The locustfile `python -m loadtest run` hands to Locust (also usable with `locust -f`).

It reads the run's settings from the file named by LOADTEST_CONFIG (see loadtest.config).
"""

from __future__ import annotations

from loadtest.config import read_user_config
from loadtest.user import LLMUser

__all__ = ["LLMUser"]

_config = read_user_config()
if _config.users_file is not None:
    from loadtest.shapes import UsersFileShape

    __all__ += ["UsersFileShape"]
elif _config.step_ramp is not None:
    from loadtest.shapes import StepRampShape

    __all__ += ["StepRampShape"]
