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

A kept-alive connection the server closed under a request is not a failed request. Uvicorn
(vLLM's server and our gateway) closes a connection idle for its keep-alive timeout (5 s);
when its process stalls past that (a busy 2-core machine stalls processes for seconds),
uvloop runs the expired timer before reading what arrived meanwhile, so a request sent on a
connection that looked alive is dropped unread: geventhttpclient raises
HTTPConnectionClosed (nothing of a response came back) and, rightly, never resends a POST
by itself. The server never read that request, so the user sends it once more on a new
connection, as browsers do for a reused connection that closed before any response byte.
Only then: a fresh connection closed that way, or one that received any byte, stays a
failure. A check of the connection's idle time could not prevent this (the client sent at
once; the server was the one that stalled), and geventhttpclient already drops a pooled
connection that the server closed while it sat idle.
"""

from __future__ import annotations

import gc
import itertools
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
from gevent.threadpool import ThreadPool
from geventhttpclient.response import HTTPConnectionClosed
from locust import constant, events, task
from locust.contrib.fasthttp import FastHttpUser, ResponseContextManager
from locust.exception import StopUser

from loadtest.config import UserConfig, read_user_config, tenant_key_env
from loadtest.prompts import Prompt, read_prompts
from loadtest.records import RecordWriter, RequestRecord
from loadtest.sse import StreamMeter


class _Shared:
    """Per-process state: config, prompts, the records file, the prompt cursor."""

    def __init__(self, config: UserConfig) -> None:
        self.config = config
        self.prompts = read_prompts(Path(config.prompts_path))
        self.writer = RecordWriter(Path(config.records_dir))
        # One real OS thread writes the records. A write() can block (the kernel throttles a
        # writer while a busy disk catches up: 100 ms and more measured on the shared 2-core
        # machine), and on the gevent loop that would stop every user of this process between
        # two requests: the cross-check saw our users idle 20% of a round this way, while
        # vLLM's client writes nothing until its run ends.
        self.disk = ThreadPool(1)
        # Forked workers start at different places in the same prompt list.
        start = 0 if config.ordered else random.Random(os.getpid()).randrange(len(self.prompts))
        self.cursor = itertools.count(start)
        self.taken = itertools.count()
        self.users = 0
        # Tenants (loadtest.workload): each user sends one tenant's prompts with its key.
        self.tenant_prompts = {
            tenant: [p for p in self.prompts if p.scenario in tenancy.scenarios]
            for tenant, tenancy in config.tenants.items()
        }
        self.tenant_users: dict[str, int] = dict.fromkeys(config.tenants, 0)
        self.started = time.monotonic()

    def record(self, record: RequestRecord) -> None:
        self.disk.spawn(self.writer.write, record)

    def close(self) -> None:
        """Wait for the records still queued, then close the file."""
        self.disk.join()
        self.disk.kill()
        self.writer.close()

    def next_prompt(self, tenant: str | None = None) -> Prompt | None:
        """The next prompt (of `tenant`'s scenarios), or None once `max_requests` have been
        handed out."""
        limit = self.config.max_requests
        if limit is not None and next(self.taken) >= limit:
            return None
        prompts = self.prompts if tenant is None else self.tenant_prompts[tenant]
        return prompts[next(self.cursor) % len(prompts)]

    def join_tenant(self) -> str | None:
        """The tenant a new user sends for: the one furthest below its share of the users
        (None without tenants)."""
        if not self.config.tenants:
            return None
        total = sum(self.tenant_users.values()) + 1
        tenant = min(
            self.config.tenants,
            key=lambda name: (
                (self.tenant_users[name] + 1) / total / self.config.tenants[name].share
            ),
        )
        self.tenant_users[tenant] += 1
        return tenant


_shared: _Shared | None = None


def shared() -> _Shared:
    global _shared
    if _shared is None:
        _shared = _Shared(read_user_config())
    return _shared


def _close_records(**_: Any) -> None:
    if _shared is not None:
        _shared.close()


events.quitting.add_listener(_close_records)  # type: ignore[no-untyped-call]


def _freeze_heap(**_: Any) -> None:
    """Keep the imported heap (Locust, gevent, Flask) out of the garbage collector's reach.

    A full collection walks every object the process holds, and it stops all users while
    it runs; what Locust imported lives until exit anyway (Locust does the same before it
    forks workers).
    """
    gc.collect()
    gc.freeze()


events.init.add_listener(_freeze_heap)  # type: ignore[no-untyped-call]


class LLMUser(FastHttpUser):
    wait_time = constant(0)
    network_timeout = 600.0  # long prompts on a loaded CPU engine take minutes
    connection_timeout = 30.0
    max_retries = 0

    def on_start(self) -> None:
        self.state = shared()
        # Whether the last response was read to its end, so its connection went back to the
        # pool and the next request reuses it (see the module docstring).
        self.kept_alive = False
        self.state.users += 1
        self.tenant = self.state.join_tenant()
        key = os.environ.get(tenant_key_env(self.tenant or ""), "")
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
        if self.tenant is not None:  # a bursty tenant's users wait out its quiet phases
            pause = self.state.config.tenants[self.tenant].sends_at(
                time.monotonic() - self.state.started
            )
            if pause:
                gevent.sleep(pause)
        prompt = self.state.next_prompt(self.tenant)
        if prompt is None:
            self.state.users -= 1
            if self.state.users == 0 and self.environment.runner is not None:
                # The last user out ends the run (from another greenlet: quit kills users).
                gevent.spawn(self.environment.runner.quit)
            raise StopUser
        wall = time.time()
        start = time.perf_counter()
        meter = StreamMeter(start)
        sent, resends = self.post(prompt)
        with sent as response:
            status = response.status_code
            self.kept_alive = False
            if status == 200:
                self.kept_alive = read_stream(response, meter)
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
        record = RequestRecord.of(wall, prompt.scenario, status, result, error, resends=resends)
        self.state.record(record)
        if record.ok:
            self.fire_timings(record)

    def post(self, prompt: Prompt) -> tuple[ResponseContextManager, int]:
        """The streamed request, sent again once when a reused connection closed under it.

        The dropped attempt is never entered as a context, so Locust never reports it; the
        request's timings still start at the first attempt (the wait was the user's).
        """
        resends = 0
        while True:
            response = self.client.post(
                self.state.config.endpoint,
                json=self.body(prompt),
                headers=self.headers,
                name=prompt.scenario,
                stream=True,
                catch_response=True,
            )
            if resends or not self.kept_alive or not closed_unread(response):
                return response, resends
            self.kept_alive = False
            resends += 1

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


def closed_unread(response: ResponseContextManager) -> bool:
    """The connection closed (FIN or reset) before a single byte of a response arrived."""
    return response.status_code == 0 and isinstance(
        getattr(response, "error", None), HTTPConnectionClosed
    )


def read_stream(response: ResponseContextManager, meter: StreamMeter) -> bool:
    """Feed the meter each line as it arrives (see the module docstring for why not iter_*).

    True when the body was read to its end (its connection then goes back to the pool).
    """
    raw = response._response
    if raw is None:
        return False
    try:
        while line := raw.readline(b"\n"):
            meter.feed(line, time.perf_counter())
    except OSError:
        return False  # a reset mid-stream: the meter reports the missing [DONE]
    return True


def failure_text(response: ResponseContextManager) -> str:
    if response.status_code == 0:
        return f"connection error: {getattr(response, 'error', None)!r}"
    try:
        body = (response.content or b"")[:300].decode("utf-8", "replace")
    except OSError as exc:
        body = repr(exc)
    return f"HTTP {response.status_code}: {body}"
