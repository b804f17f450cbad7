"""Image input against the real engine: one `serving up --profile cpu-tiny-vl` (vLLM on the
tiny Qwen2.5-VL behind the gateway) for this package, started by the first test that needs
it and stopped by SIGHUP to its group (a closed terminal) when the package is done, so its
three modules (the tokens an image costs, the gateway's pricing and refusals, the playground's
upload) pay for one engine start, not three.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest

from tests.integration.conftest import Stack, serving_up

PROFILE = "cpu-tiny-vl"


@pytest.fixture(scope="package")
def vl_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The first run builds the model (seconds) and vLLM compiles nothing (eager).
    with serving_up(
        tmp_path_factory.mktemp("vl-stack"),
        profile=PROFILE,
        timeout=1200,
        stop=signal.SIGHUP,  # to the group, as when its terminal closes
        to_group=True,
    ) as stack:
        yield stack
