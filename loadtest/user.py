"""The Locust user: streamed chat completions, measured per token, validated by content.

Why FastHttpUser (measured with bench/loadtest_client.py): the load generator must not be
the bottleneck. Client CPU per streamed 64-token request, gevent-patched as under Locust:
geventhttpclient (FastHttpUser) 1.8 ms, `requests` (HttpUser) 2.8 ms (1.6x), the `openai`
SDK on httpx 21.9 ms (12.5x). FastHttpSession's `iter_content`/`iter_lines` read
1,024-byte blocks and wait until a block is full, which would batch tokens and falsify TTFT
and ITL, so the body is read line by line from the underlying response as bytes arrive.

Each request is one Locust entry `POST <scenario>` whose response time is the end-to-end
latency and whose length is the output tokens, plus custom entries fired with
`events.request.fire`: `TTFT`, `TPOT` and (per token gap) `ITL`, all in milliseconds.
A 200 whose stream carries an error event, lacks usage or `[DONE]`, or (with ignore_eos)
has the wrong number of tokens is a failure.

Users are closed-loop (no wait time): N users keep N requests in flight, like vLLM's
benchmark client at a maximum concurrency of N and an infinite request rate (the cross-check's
`BenchServe(max_concurrency=N, request_rate=math.inf)`).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser, ResponseContextManager
from locust.exception import StopUser

from loadtest.config import API_KEY_ENV, UserConfig, read_user_config
from loadtest.prompts import Prompt, read_prompts
from loadtest.records import RecordWriter, RequestRecord
from loadtest.sse import StreamMeter


class _Shared:
    """Per-process state: config, prompts, the records file, the prompt cursor."""

    def __init__(self, config: UserConfig) -> None:
        self.config = config
        self.prompts = read_prompts(Path(config.prompts_path))
        self.writer = RecordWriter(Path(config.records_dir))
        # Forked workers start at different places in the same prompt list.
        start = 0 if config.ordered else random.Random(os.getpid()).randrange(len(self.prompts))
        self.cursor = itertools.count(start)
        self.taken = itertools.count()
        self.users = 0

    def next_prompt(self) -> Prompt | None:
        """The next prompt, or None once `max_requests` have been handed out."""
        limit = self.config.max_requests
        if limit is not None and next(self.taken) >= limit:
            return None
        return self.prompts[next(self.cursor) % len(self.prompts)]


_shared: _Shared | None = None


def shared() -> _Shared:
    global _shared
    if _shared is None:
        _shared = _Shared(read_user_config())
    return _shared


def _close_records(**_: Any) -> None:
    if _shared is not None:
        _shared.writer.close()


events.quitting.add_listener(_close_records)  # type: ignore[no-untyped-call]


class LLMUser(FastHttpUser):
    wait_time = constant(0)
    network_timeout = 600.0  # long prompts on a loaded CPU engine take minutes
    connection_timeout = 30.0
    max_retries = 0

    def on_start(self) -> None:
        self.state = shared()
        self.state.users += 1
        key = os.environ.get(API_KEY_ENV, "")
        self.headers = {"Accept": "text/event-stream", "Accept-Encoding": "identity"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    def body(self, prompt: Prompt) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.state.config.model,
            "messages": [{"role": "user", "content": prompt.prompt}],
            "max_tokens": prompt.output_tokens,
            "temperature": prompt.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if prompt.ignore_eos:
            body["ignore_eos"] = True
        return body

    @task
    def chat(self) -> None:
        prompt = self.state.next_prompt()
        if prompt is None:
            self.state.users -= 1
            if self.state.users == 0 and self.environment.runner is not None:
                # The last user out ends the run (from another greenlet: quit kills users).
                gevent.spawn(self.environment.runner.quit)
            raise StopUser
        wall = time.time()
        start = time.perf_counter()
        meter = StreamMeter(start)
        with self.client.post(
            self.state.config.endpoint,
            json=self.body(prompt),
            headers=self.headers,
            name=prompt.scenario,
            stream=True,
            catch_response=True,
        ) as response:
            status = response.status_code
            if status == 200:
                read_stream(response, meter)
                result = meter.finish(
                    expected_output_tokens=prompt.output_tokens if prompt.ignore_eos else None
                )
                error = result.error
            else:
                result = meter.finish()
                error = failure_text(response)
            response.request_meta["response_time"] = (time.perf_counter() - start) * 1000
            response.request_meta["response_length"] = result.output_tokens
            if error is None:
                response.success()
            else:
                response.failure(error)
        record = RequestRecord.of(wall, prompt.scenario, status, result, error)
        self.state.writer.write(record)
        if record.ok:
            self.fire_timings(record)

    def fire_timings(self, record: RequestRecord) -> None:
        fire = self.environment.events.request.fire
        name = record.scenario
        common: dict[str, Any] = {"exception": None, "context": {}, "response_length": 0}
        if record.ttft_s is not None:
            fire(request_type="TTFT", name=name, response_time=record.ttft_s * 1000, **common)
        if record.tpot_s is not None:
            fire(request_type="TPOT", name=name, response_time=record.tpot_s * 1000, **common)
        if self.state.config.itl_events:
            for gap in record.itl_s:
                fire(request_type="ITL", name=name, response_time=gap * 1000, **common)


def read_stream(response: ResponseContextManager, meter: StreamMeter) -> None:
    """Feed the meter each line as it arrives (see the module docstring for why not iter_*)."""
    raw = response._response
    if raw is None:
        return
    try:
        while line := raw.readline(b"\n"):
            meter.feed(line, time.perf_counter())
    except OSError:
        return  # a reset mid-stream: the meter reports the missing [DONE]


def failure_text(response: ResponseContextManager) -> str:
    if response.status_code == 0:
        return f"connection error: {getattr(response, 'error', None)!r}"
    try:
        body = (response.content or b"")[:300].decode("utf-8", "replace")
    except OSError as exc:
        body = repr(exc)
    return f"HTTP {response.status_code}: {body}"
