"""`@run_async`: a test written as a coroutine, run on a fresh event loop of its own.

The quota store's calls are coroutines; a test that makes many of them reads best as one
`async def`. Fixtures still work: pytest reads the wrapped function's signature.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec

P = ParamSpec("P")


def run_async(test: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, None]:
    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        asyncio.run(test(*args, **kwargs))

    return run
