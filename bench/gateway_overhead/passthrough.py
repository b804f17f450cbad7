"""The minimal passthrough: the floor any gateway on this stack is compared with.

    python -m bench.gateway_overhead.passthrough --upstream http://127.0.0.1:8101 --port 8102

A plain ASGI app on uvicorn (uvloop, httptools) forwarding every request to the upstream with
one pooled aiohttp session and relaying the response chunk by chunk: no auth, no quota, no
metrics, no error mapping. The gateway's throughput targets (docs/architecture.md,
performance targets) are shares of this one's, measured in the same run.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import aiohttp
import uvicorn

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}


class Passthrough:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: Message, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                self.session = aiohttp.ClientSession(auto_decompress=False)
                await send({"type": "lifespan.startup.complete"})
            if self.session is not None:
                await self.session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        assert self.session is not None
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k not in HOP_BY_HOP}
        url = self.upstream + scope["path"]
        async with self.session.request(scope["method"], url, data=body, headers=headers) as r:
            out = [(k, v) for k, v in r.raw_headers if k.lower() not in HOP_BY_HOP]
            await send({"type": "http.response.start", "status": r.status, "headers": out})
            async for chunk in r.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    app = Passthrough(args.upstream.rstrip("/"))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        ws="none",
        lifespan="on",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
