"""A real uvicorn server (uvloop, as vLLM runs it) that stalls across its keep-alive timeout.

It streams chat completions the way loadtest.sse reads them. After the first response it
stalls its event loop the way a process descheduled on a busy machine stalls: in the I/O
phase of a loop iteration, until the client's next request sits unread on the kept-alive
connection and the keep-alive timeout has passed. libuv runs due timers after the I/O phase
and before the next poll, so uvicorn's keep-alive timer fires first and closes the
connection with the request unread (the kernel answers it with a reset): the memory-plan
test's two lost requests. A stall elsewhere (in a task step, before the poll) would let the
request be read first, which is why the stall is a reader callback. The server counts the
requests it read and the client addresses they came from (one per connection).

Usage: `with stalling_server(keep_alive_s=1) as server: server.url; server.requests`.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# The longest the stall waits for the client's next request (a stalled client, on a busy
# machine, takes a while); past it the test fails, never passes without the race.
NEXT_REQUEST_TIMEOUT_S = 120.0


@dataclass
class StallingServer:
    port: int
    keep_alive_s: int
    requests: int = 0
    stalled: bool = False
    clients: set[tuple[str, int]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests += 1
        self.clients.add(tuple(scope["client"]))
        tokens = int(json.loads(body)["max_tokens"])
        start = {"type": "http.response.start", "status": 200}
        await send(start | {"headers": [(b"content-type", b"text/event-stream")]})
        token = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
        events: list[dict[str, Any]] = [token] * tokens
        events.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}})
        for event in events:
            chunk = f"data: {json.dumps(event)}\n\n".encode()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        if not self.stalled:
            self.stalled = True
            self.stall_in_io_phase()

    def stall_in_io_phase(self) -> None:
        """Stall from a reader callback, which uvloop runs in libuv's I/O phase."""
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()

        def stall() -> None:
            loop.remove_reader(ours)
            ours.close()
            theirs.close()
            ended = time.monotonic()
            deadline = ended + NEXT_REQUEST_TIMEOUT_S
            while not unread_bytes(self.port) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(max(0.0, ended + self.keep_alive_s + 0.3 - time.monotonic()))

        loop.add_reader(ours, stall)
        theirs.send(b"!")


def unread_bytes(port: int) -> bool:
    """Whether an established connection to `port` holds received bytes nobody read yet."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            mine = int(local.rsplit(":", 1)[1], 16) == port and state == "01"  # established
            if mine and int(queues.split(":")[1], 16) > 0:
                return True
    return False


@contextmanager
def stalling_server(*, keep_alive_s: int) -> Iterator[StallingServer]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    app = StallingServer(port, keep_alive_s)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", lifespan="off",
        timeout_keep_alive=keep_alive_s, log_level="warning",
    )  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield app
    finally:
        server.should_exit = True
        thread.join(timeout=30)
