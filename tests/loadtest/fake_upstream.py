"""A fake OpenAI-compatible upstream for load-test tests: streamed chat completions + /metrics.

It streams one SSE chunk per output token (a role chunk first, as vLLM does), a usage chunk
and `[DONE]`, and exports `vllm:*` series (token counters, running/waiting, KV usage,
preemptions) plus a `gateway_requests_total` counter. Timing is set per server: the first
token after `ttft_s`, the next ones every `itl_s`. A prompt containing `FAIL_INBAND` gets a
200 with an in-band SSE error event after two tokens; `FAIL_STATUS` gets a 500.

Usage: `with serve_fake(FakeConfig(ttft_s=0.02)) as fake: fake.url` (a real socket in a
thread, so streaming timing is real), or `python -m tests.loadtest.fake_upstream --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from serving.models.tiny_model import MODEL_NAME as MODEL

MAX_NUM_SEQS = 16


@dataclass(frozen=True, kw_only=True)
class FakeConfig:
    ttft_s: float = 0.01
    itl_s: float = 0.002
    api_key: str | None = None
    # More keys it accepts (tenants' keys); requests are counted per key in FakeState.keys.
    other_keys: tuple[str, ...] = ()
    # Without ignore_eos, stop after this many tokens (an "EOS"); None: always max_tokens.
    eos_after: int | None = None
    # A paged KV cache of `kv_blocks` blocks (one is vLLM's null block) where each request
    # holds `blocks_per_request`: requests beyond what fits wait, as in vLLM's scheduler.
    kv_blocks: int | None = None
    blocks_per_request: int = 1


@dataclass
class FakeState:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    requests: int = 0
    preemptions: int = 0
    waiting: int = 0
    keys: dict[str, int] = field(default_factory=dict)  # requests per key presented
    succeeded: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    running_served: list[int] = field(default_factory=list)
    """The running gauge as served to each engine scrape (not `?source=gateway` ones)."""


def count_prompt_tokens(body: dict[str, Any]) -> int:
    """The fake's "tokenizer": one token per whitespace-separated word, +4 per message."""
    messages = body.get("messages", [])
    return sum(len(str(m.get("content", "")).split()) + 4 for m in messages)


def chunk(delta: dict[str, str], *, finish: str | None = None) -> bytes:
    data = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data)}\n\n".encode()


def fits(config: FakeConfig) -> int:
    """Requests the fake's KV cache holds at once."""
    if config.kv_blocks is None:
        return 1 << 30
    return (config.kv_blocks - 1) // config.blocks_per_request


def kv_usage(config: FakeConfig, state: FakeState) -> float:
    if config.kv_blocks is None:
        return state.running / MAX_NUM_SEQS
    return state.running * config.blocks_per_request / (config.kv_blocks - 1)


def build_app(config: FakeConfig, state: FakeState) -> web.Application:
    admitted = asyncio.Condition()

    async def admit() -> None:
        """Wait while the KV cache is full (the request counts as waiting meanwhile)."""
        state.waiting += 1
        try:
            async with admitted:
                await admitted.wait_for(lambda: state.running < fits(config))
                state.running += 1
        finally:
            state.waiting -= 1

    async def release() -> None:
        async with admitted:
            state.running -= 1
            admitted.notify_all()

    async def chat(request: web.Request) -> web.StreamResponse:
        keys = (config.api_key, *config.other_keys) if config.api_key else ()
        presented = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if keys and presented not in keys:
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        body = await request.json()
        state.keys[presented] = state.keys.get(presented, 0) + 1
        state.bodies.append(body)
        state.requests += 1
        prompt = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        if "FAIL_STATUS" in prompt:
            return web.json_response({"error": {"message": "boom", "type": "x"}}, status=500)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        n_out = max_tokens
        if config.eos_after is not None and not body.get("ignore_eos"):
            n_out = min(max_tokens, config.eos_after)
        n_prompt = count_prompt_tokens(body)
        state.prompt_tokens += n_prompt
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await admit()
        try:
            await asyncio.sleep(config.ttft_s)
            await response.write(chunk({"role": "assistant", "content": ""}))
            for index in range(n_out):
                if index:
                    await asyncio.sleep(config.itl_s)
                state.generation_tokens += 1
                if "FAIL_INBAND" in prompt and index == 2:
                    error = {"error": {"message": "engine died", "type": "server_error"}}
                    await response.write(f"data: {json.dumps(error)}\n\n".encode())
                    return response
                finish = (
                    ("length" if n_out == max_tokens else "stop") if index == n_out - 1 else None
                )
                await response.write(chunk({"content": f" w{index}"}, finish=finish))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": n_prompt,
                    "completion_tokens": n_out,
                    "total_tokens": n_prompt + n_out,
                }
                data = {"id": "chatcmpl-fake", "choices": [], "usage": usage}
                await response.write(f"data: {json.dumps(data)}\n\n".encode())
            await response.write(b"data: [DONE]\n\n")
            state.succeeded += 1
        except ConnectionResetError:
            pass  # the client went away (Locust stops users mid-stream at the end of a run)
        finally:
            await release()
        return response

    async def metrics(request: web.Request) -> web.Response:
        label = f'{{model_name="{MODEL}",engine="0"}}'
        if request.query.get("source") != "gateway":
            state.running_served.append(state.running)
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {state.running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {state.waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{label} {kv_usage(config, state)}",
            "# TYPE vllm:request_success counter",
            f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="length"}} '
            f"{state.succeeded}",
            "# TYPE vllm:num_preemptions counter",
            f"vllm:num_preemptions_total{label} {state.preemptions}",
            "# TYPE vllm:prompt_tokens counter",
            f"vllm:prompt_tokens_total{label} {state.prompt_tokens}",
            "# TYPE vllm:generation_tokens counter",
            f"vllm:generation_tokens_total{label} {state.generation_tokens}",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{num_gpu_blocks="{config.kv_blocks or 0}"}} 1',
            "# TYPE gateway_requests counter",
            f'gateway_requests_total{{status="200"}} {state.requests}',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


@dataclass
class RunningFake:
    url: str
    state: FakeState


@contextmanager
def serve_fake(config: FakeConfig | None = None) -> Iterator[RunningFake]:
    """Run the fake on 127.0.0.1 (a free port) in a background thread with its own loop."""
    state = FakeState()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(build_app(config or FakeConfig(), state), access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield RunningFake(f"http://127.0.0.1:{port}", state)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--ttft", type=float, default=0.01)
    parser.add_argument("--itl", type=float, default=0.002)
    args = parser.parse_args()
    app = build_app(FakeConfig(ttft_s=args.ttft, itl_s=args.itl), FakeState())
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None)


if __name__ == "__main__":
    main()
