"""The hop client's pool: keep-alive reuse, stale connections, expiry, cancellation, caps."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from serving.gateway.hop_connection import HopConnectError, HopDisconnectedError
from serving.gateway.hop_pool import HopPool
from tests.gateway.raw_upstream import RawUpstream, Request, aiohttp_upstream
from tests.gateway.servers import closed_port

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


def pool_for(
    url: str, *, keepalive_s: float = 4.0, max_connections: int = 0, max_age_s: float = 0.0
) -> HopPool:
    return HopPool(
        url,
        connect_timeout_s=2.0,
        idle_timeout_s=5.0,
        keepalive_s=keepalive_s,
        max_connections=max_connections,
        max_age_s=max_age_s,
    )


async def fetch(pool: HopPool, method: str = "GET", body: bytes = b"") -> bytes:
    response = await pool.request(method, b"/x", b"", body)
    try:
        return await response.read_all()
    finally:
        response.close()


def test_keep_alive_connections_are_reused_with_aiohttp() -> None:
    peers: list[object] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        peers.append(request.transport.get_extra_info("peername"))
        return web.Response(body=await request.read())

    async def scenario() -> None:
        app = web.Application()
        app.router.add_route("*", "/x", handler)
        async with aiohttp_upstream(app) as url:
            pool = pool_for(url)
            assert await fetch(pool, "POST", b"one") == b"one"
            assert await fetch(pool, "POST", b"two") == b"two"
            assert await fetch(pool) == b""
            await pool.close()

    asyncio.run(scenario())
    assert len(peers) == 3 and len(set(peers)) == 1


def test_the_request_line_host_and_headers() -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(OK)

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url + "/base")
            response = await pool.request("POST", b"/v1/x?a=1", b"x-one: 1\r\n", b"{}")
            response.close()
            await fetch(pool)
            port = upstream.url.rsplit(":", 1)[1]
            assert upstream.requests[0].head == (
                b"POST /base/v1/x?a=1 HTTP/1.1\r\nhost: 127.0.0.1:%s\r\nx-one: 1\r\n"
                b"content-length: 2\r\n\r\n" % port.encode()
            )
            assert upstream.requests[0].body == b"{}"
            assert upstream.requests[1].head.startswith(b"GET /base/x HTTP/1.1\r\n")
            assert b"content-length" not in upstream.requests[1].head

    asyncio.run(scenario())


def test_a_connection_closed_while_idle_is_retried_once_on_a_new_one() -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(OK)
        await writer.drain()
        writer.close()  # after answering, without saying so: the client's copy goes stale

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)
            assert await fetch(pool) == b"ok"
            await asyncio.sleep(0.05)
            assert await fetch(pool, "POST", b"{}") == b"ok"
            assert [request.connection for request in upstream.requests] == [0, 1]

    asyncio.run(scenario())


def test_a_stale_retry_happens_once_and_only_before_any_response_byte() -> None:
    answers = [OK]

    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        if answers:
            writer.write(answers.pop())
        else:
            writer.close()  # every later request: the connection closes unanswered

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)
            assert await fetch(pool) == b"ok"
            with pytest.raises(HopDisconnectedError):
                await fetch(pool, "POST", b"{}")
            # the pooled connection, then one new one; never a third
            assert [request.connection for request in upstream.requests] == [0, 0, 1]

    asyncio.run(scenario())


def test_idle_connections_expire_after_keepalive() -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(OK)

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url, keepalive_s=0.05)
            await fetch(pool)
            assert pool.idle_connections == 1
            await asyncio.sleep(0.2)
            assert pool.idle_connections == 0  # closed by the pool's sweep
            await asyncio.wait_for(upstream.client_closed.wait(), 1)
            await fetch(pool)
            assert [request.connection for request in upstream.requests] == [0, 1]

    asyncio.run(scenario())


def test_a_connection_past_its_max_age_is_not_reused() -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(OK)

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url, max_age_s=0.2)
            await fetch(pool)
            await fetch(pool)  # young: reused
            await asyncio.sleep(0.3)
            await fetch(pool)  # past its age when this response ends: closed, not pooled
            assert pool.idle_connections == 0
            await fetch(pool)
            await pool.close()
            assert [request.connection for request in upstream.requests] == [0, 0, 0, 1]

    asyncio.run(scenario())


@pytest.mark.parametrize("started", [False, True])
def test_cancelling_a_request_closes_its_connection(started: bool) -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        if started:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)

            async def exchange() -> None:
                response = await pool.request("POST", b"/x", b"", b"{}")
                try:
                    assert await response.read() == b"first"
                    await response.read()
                finally:
                    response.close()

            task = asyncio.create_task(exchange())
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.wait_for(upstream.client_closed.wait(), 1)
            assert pool.idle_connections == 0

    asyncio.run(scenario())


def test_a_refused_connection_is_a_connect_error() -> None:
    async def scenario() -> None:
        with pytest.raises(HopConnectError):
            await fetch(pool_for(f"http://127.0.0.1:{closed_port()}"))

    asyncio.run(scenario())


def test_max_connections_makes_requests_wait_for_a_connection() -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.02)
        writer.write(OK)

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url, max_connections=1)
            assert await asyncio.gather(*(fetch(pool) for _ in range(4))) == [b"ok"] * 4
            assert upstream.connections == 1

    asyncio.run(scenario())


def test_a_closed_pool_refuses_requests() -> None:
    async def scenario() -> None:
        pool = pool_for("http://127.0.0.1:9")
        await pool.close()
        with pytest.raises(HopConnectError):
            await fetch(pool)

    asyncio.run(scenario())


def test_a_request_lost_on_a_stale_connection_succeeds_on_a_new_one() -> None:
    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        if request.connection == 0 and len(upstream.requests) > 1:
            writer.close()  # the race: it was closing just as the request went out
        else:
            writer.write(OK)

    async def scenario() -> None:
        async with upstream:
            pool = pool_for(upstream.url)
            assert await fetch(pool) == b"ok"
            assert await fetch(pool, "POST", b"{}") == b"ok"
            assert [request.connection for request in upstream.requests] == [0, 0, 1]

    upstream = RawUpstream(answer)
    asyncio.run(scenario())
