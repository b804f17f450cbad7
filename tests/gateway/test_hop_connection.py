"""One upstream connection: framing, backpressure, the idle timeout and failures."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web

from serving.gateway.hop_connection import (
    HIGH_WATER,
    HopDisconnectedError,
    HopPayloadError,
    HopProtocolError,
    HopTimeoutError,
)
from serving.gateway.hop_pool import HopPool
from tests.gateway.raw_upstream import RawUpstream, Request, aiohttp_upstream


def pool_for(url: str, *, idle_timeout_s: float = 5.0) -> HopPool:
    return HopPool(url, connect_timeout_s=2.0, idle_timeout_s=idle_timeout_s, keepalive_s=4.0)


def answering(*chunks: bytes, then: float | None = None) -> Callable[..., Awaitable[None]]:
    """An answer that writes `chunks`, then sleeps `then` seconds (if given) and closes."""

    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        for chunk in chunks:
            writer.write(chunk)
            await writer.drain()
        if then is not None:
            await asyncio.sleep(then)
            writer.close()

    return answer


def test_content_length_and_chunked_bodies_from_aiohttp() -> None:
    async def whole(request: web.Request) -> web.StreamResponse:
        return web.json_response({"ok": True})

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for index in range(5):
            await response.write(b"data: %d\n\n" % index)
            await asyncio.sleep(0.001)
        await response.write_eof()
        return response

    async def scenario() -> None:
        app = web.Application()
        app.router.add_get("/whole", whole)
        app.router.add_get("/chunked", chunked)
        async with aiohttp_upstream(app) as url:
            pool = pool_for(url)
            response = await pool.request("GET", b"/whole", b"")
            assert (response.status, response.content_length) == (200, 12)
            assert response.content_type == b"application/json"
            assert await response.read_all() == b'{"ok": true}'
            response.close()
            response = await pool.request("GET", b"/chunked", b"")
            assert response.content_length is None and not response.until_close
            assert response.content_type == b"text/event-stream"
            body = await response.read_all()
            assert body == b"".join(b"data: %d\n\n" % index for index in range(5))
            response.close()
            assert pool.idle_connections == 1
            await pool.close()

    asyncio.run(scenario())


def test_a_body_without_length_ends_when_the_upstream_closes() -> None:
    answer = answering(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it", then=0.01)

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)
            response = await pool.request("GET", b"/x", b"")
            assert response.until_close
            assert await response.read_all() == b"all of it"
            response.close()
            assert pool.idle_connections == 0

    asyncio.run(scenario())


def test_a_body_cut_short_fails_after_the_bytes_that_came() -> None:
    answer = answering(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial", then=0.01)

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)
            response = await pool.request("GET", b"/x", b"")
            assert await response.read() == b"partial"
            with pytest.raises(HopPayloadError):
                await response.read()
            response.close()

    asyncio.run(scenario())


def test_garbage_is_a_protocol_error() -> None:
    async def scenario() -> None:
        async with RawUpstream(answering(b"this is not http\r\n\r\n")) as upstream:
            with pytest.raises(HopProtocolError):
                await pool_for(upstream.url).request("GET", b"/x", b"")

    asyncio.run(scenario())


def test_a_close_before_the_headers_is_a_disconnect() -> None:
    async def scenario() -> None:
        async with RawUpstream(answering(then=0)) as upstream:
            with pytest.raises(HopDisconnectedError):
                await pool_for(upstream.url).request("POST", b"/x", b"", b"{}")
            assert len(upstream.requests) == 1  # a new connection is never retried

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "sent", [b"", b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"]
)
def test_silence_longer_than_the_idle_timeout(sent: bytes) -> None:
    async def scenario() -> None:
        async with RawUpstream(answering(sent)) as upstream:  # then silence
            pool = pool_for(upstream.url, idle_timeout_s=0.2)
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(HopTimeoutError):
                response = await pool.request("GET", b"/x", b"")
                assert await response.read() == b"first"
                await response.read()
            assert 0.15 < loop.time() - started < 1.0
            await asyncio.wait_for(upstream.client_closed.wait(), 1)

    asyncio.run(scenario())


def test_chunks_spaced_below_the_idle_timeout_never_time_out() -> None:
    chunks = [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]

    async def answer(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(chunks[0])
        for _ in range(6):  # 1.5 s in all, past the timeout; each gap 0.75 s inside it
            await asyncio.sleep(0.25)
            writer.write(b"1\r\nx\r\n")
        writer.write(b"0\r\n\r\n")

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url, idle_timeout_s=1.0)
            response = await pool.request("GET", b"/x", b"")
            assert await response.read_all() == b"x" * 6
            response.close()

    asyncio.run(scenario())


def test_a_slow_reader_pauses_the_upstream() -> None:
    size = 8 * 1024 * 1024
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size

    async def scenario() -> None:
        async with RawUpstream(answering(head, b"x" * size)) as upstream:
            pool = pool_for(upstream.url, idle_timeout_s=0.1)
            response = await pool.request("GET", b"/x", b"")
            await asyncio.sleep(0.3)  # longer than the idle timeout: paused is not idle
            first = await response.read()
            assert 0 < len(first) <= HIGH_WATER + 256 * 1024
            rest = await response.read_all()
            assert len(first) + len(rest) == size
            response.close()
            assert pool.idle_connections == 1

    asyncio.run(scenario())


def test_a_head_response_has_no_body() -> None:
    answer = answering(b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n")

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)
            response = await pool.request("HEAD", b"/x", b"")
            assert (response.status, response.content_length) == (200, 50)
            assert await response.read_all() == b""
            response.close()

    asyncio.run(scenario())


def test_an_interim_response_is_skipped() -> None:
    answer = answering(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok"
    )

    async def scenario() -> None:
        async with RawUpstream(answer) as upstream:
            pool = pool_for(upstream.url)
            response = await pool.request("POST", b"/x", b"", b"{}")
            assert response.status == 201
            assert await response.read_all() == b"ok"
            response.close()

    asyncio.run(scenario())
