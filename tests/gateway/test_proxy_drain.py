"""What the proxy reads, unrelayed, from an upstream whose client stopped reading and left."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import cast

import pytest

from serving.gateway import proxy
from serving.gateway.hop_connection import HopDisconnectedError, HopResponse
from serving.gateway.usage import ResponseMeter, Usage
from tests.gateway.test_usage import FINAL, RUNNING


class ScriptedResponse:
    """An upstream body read from a script: bytes, a pause in seconds, or an exception."""

    def __init__(self, script: list[bytes | float | Exception]) -> None:
        self._script: Iterator[bytes | float | Exception] = iter(script)
        self.reads = 0

    async def read(self) -> bytes:
        self.reads += 1
        for step in self._script:
            if isinstance(step, float):
                await asyncio.sleep(step)
            elif isinstance(step, Exception):
                raise step
            else:
                return step
        return b""


def drain(script: list[bytes | float | Exception]) -> tuple[ResponseMeter, float]:
    meter = ResponseMeter(strip_usage=True, chunk_usage=True, strip_chunk_usage=True)
    started = time.monotonic()
    asyncio.run(proxy._drain(cast(HopResponse, ScriptedResponse(script)), meter))
    return meter, time.monotonic() - started


def test_what_was_sent_is_read_to_the_end_of_the_stream() -> None:
    meter, _ = drain([*RUNNING, FINAL, b"data: [DONE]\n\n"])
    assert meter.usage == Usage(3, 5)  # vLLM finished: its own final count
    assert not meter.overtaken


def test_the_drain_stops_when_nothing_more_comes() -> None:
    meter, took = drain([RUNNING[0], RUNNING[1], 60.0, RUNNING[2]])
    assert meter.running_usage == Usage(14, 4) and meter.usage is None
    assert took < proxy.DRAIN_S  # gave up after DRAIN_IDLE_S of silence, not the deadline
    assert not meter.overtaken and meter.streamed_tokens(1) == 4  # caught up: vLLM's count


def test_the_drain_stops_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy, "DRAIN_S", 0.3)
    endless: list[bytes | float | Exception] = [RUNNING[0], 0.01] * 1000
    meter, took = drain(endless)
    assert 0.3 <= took < 0.3 + proxy.DRAIN_IDLE_S
    assert meter.running_usage == Usage(14, 1) and meter.events > 1
    # vLLM was still sending: it ran past the last count read, which bounds nothing
    assert meter.overtaken and meter.streamed_tokens(1) is None


def test_an_upstream_failure_ends_the_drain_quietly() -> None:
    failure = HopDisconnectedError("reset", before_response=False)
    meter, _ = drain([RUNNING[0], failure, RUNNING[1]])
    assert meter.running_usage == Usage(14, 1)
    assert meter.overtaken  # where vLLM got to is unknown
