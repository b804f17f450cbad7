"""A real uvicorn server (uvloop, as vLLM runs it) that stalls across its keep-alive timeout.

It streams chat completions the way loadtest.sse reads them. After a response it stalls its
event loop the way a process descheduled on a busy machine stalls: in the I/O phase of a loop
iteration, until the client's next request sits unread on the kept-alive connection and the
keep-alive timeout has passed. libuv runs due timers after the I/O phase and before the next
poll, so uvicorn's keep-alive timer fires first and closes the connection with the request
unread (the kernel answers it with a reset): the memory-plan test's two lost requests. A stall
elsewhere (in a task step, before the poll) would let the request be read first, which is why
the stall is a reader callback.

A stall stages the race only when the request was not yet among the events the loop is
handling: on a busy machine the loop can reach its poll late, find the stall's event and the
request's together, and read the request right after the stall (a CI run saw no resend). So
the outcome decides: a stall is staged when the next request the server reads comes on a new
connection, and until one is, the server stalls again after each response. The loop can
also read the request in the same I/O phase just before the stall's callback: nothing then
arrives unread, and the stall ends at once (it could not stage the race). It counts the
requests it read, the client addresses they came from (one per connection), the stalls it
tried, and after which request the race was staged.

Usage: `with stalling_server(keep_alive_s=1) as server: server.url; server.staged_after`.
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
from uvicorn.server import ServerState

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
    clients: set[tuple[str, int]] = field(default_factory=set)
    stalls: int = 0
    # The number of requests read before the stall that dropped the next one (None until one
    # did), and the stall whose outcome the next request tells: (requests read, their client).
    staged_after: int | None = None
    pending: tuple[int, tuple[str, int]] | None = None
    state: ServerState | None = None  # uvicorn's, set once its server exists

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
        client = tuple(scope["client"])
        self.clients.add(client)
        if self.pending is not None:
            read, previous = self.pending
            self.pending = None
            if client != previous:
                self.staged_after = read
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
        if self.staged_after is None:
            self.pending = (self.requests, client)
            self.stalls += 1
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
                if self.request_read():
                    return
                time.sleep(0.01)
            time.sleep(max(0.0, ended + self.keep_alive_s + 0.3 - time.monotonic()))

        loop.add_reader(ours, stall)
        theirs.send(b"!")

    def request_read(self) -> bool:
        """Whether uvicorn read a request it has not answered (its task waits for the loop)."""
        assert self.state is not None
        cycles = (getattr(c, "cycle", None) for c in self.state.connections)
        return any(c is not None and not c.response_complete for c in cycles)


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
    app.state = server.server_state
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
