"""A kept-alive connection that the server closes under a request does not fail the request.

Real Locust users against a real uvicorn (uvloop) server that stalls past its keep-alive
timeout right after a response, the way vLLM's server stalls on a busy 2-core machine: the
user's next request is dropped unread, and the user sends it again on a new connection.
"""

from __future__ import annotations

from pathlib import Path

from loadtest.prompts import Prompt, write_prompts
from loadtest.runner import LocustRun, run_locust
from tests.loadtest.keepalive_server import stalling_server

# Room for the server to stall again when the client's next request was read anyway.
REQUESTS = 6
TOKENS = 4


def test_request_on_a_connection_closed_under_it_is_resent(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    write_prompts(
        [Prompt("chat", f"prompt {i}", 5, TOKENS, True, 0.0) for i in range(REQUESTS)], prompts
    )
    with stalling_server(keep_alive_s=1) as server:
        data = run_locust(
            LocustRun(
                host=server.url, model="m", prompts_path=prompts, out=tmp_path / "run",
                users=1, duration_s=300, max_requests=REQUESTS, ordered=True,
            )
        )  # fmt: skip
    records = data.records
    assert [r.error for r in records] == [None] * REQUESTS
    assert all(r.output_tokens == TOKENS for r in records)
    # The request after the staged stall met the closed connection and went out again on a
    # new one; the server read each request once (the dropped attempt never reached it).
    staged = server.staged_after
    assert staged is not None, f"no request dropped in {server.stalls} stalls"
    assert [r.resends for r in records] == [int(i == staged) for i in range(REQUESTS)]
    assert server.requests == REQUESTS and len(server.clients) == 2
