"""A response's head goes out with its first body write, or at the end of the loop's turn."""

from __future__ import annotations

import asyncio

from serving.gateway.response_head import HeadCork


class RecordingTransport:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent.append(data)

    def writelines(self, parts: tuple[bytes, ...]) -> None:
        self.sent.append(b"".join(parts))  # one send, as uvloop's writev

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def corked() -> tuple[HeadCork, RecordingTransport]:
    transport = RecordingTransport()
    return HeadCork(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


def test_a_json_answer_is_one_send() -> None:
    async def scenario() -> None:
        cork, transport = corked()
        cork.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        assert transport.sent == []  # held for the body
        cork.write(b"{}")
        assert transport.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        await asyncio.sleep(0)  # the end-of-turn flush finds nothing left
        assert len(transport.sent) == 1

    asyncio.run(scenario())


def test_a_stream_head_waits_at_most_one_turn_of_the_loop() -> None:
    async def scenario() -> None:
        cork, transport = corked()
        cork.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await asyncio.sleep(0)
        assert transport.sent == [b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"]
        cork.write(b"5\r\nhello\r\n")
        cork.write(b"0\r\n\r\n")
        assert transport.sent[1:] == [b"5\r\nhello\r\n", b"0\r\n\r\n"]

    asyncio.run(scenario())


def test_the_head_goes_out_before_the_connection_closes() -> None:
    async def scenario() -> None:
        cork, transport = corked()
        cork.write(b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\n\r\n")
        cork.close()
        assert transport.sent == [
            b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\n\r\n"
        ]
        assert transport.closed and cork.is_closing()
        await asyncio.sleep(0)
        assert len(transport.sent) == 1  # not written twice

    asyncio.run(scenario())


def test_a_closed_connection_gets_no_late_head() -> None:
    async def scenario() -> None:
        cork, transport = corked()
        cork.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        transport.closed = True  # the peer went away within the turn
        await asyncio.sleep(0)
        assert transport.sent == []

    asyncio.run(scenario())


def test_other_transport_calls_pass_through() -> None:
    async def scenario() -> None:
        cork, _ = corked()
        assert cork.get_extra_info("peername") == "info:peername"

    asyncio.run(scenario())


class Cycle:
    transport: object


def writer(cycle: Cycle) -> object:
    return cycle.transport


def test_once_the_head_is_out_the_cycle_writes_to_its_own_transport() -> None:
    async def scenario() -> None:
        for first_write_at_once in (True, False):
            cycle, transport = Cycle(), RecordingTransport()
            cork = HeadCork(transport, asyncio.get_running_loop(), cycle)  # type: ignore[arg-type]
            cycle.transport = cork
            cork.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            assert writer(cycle) is cork  # the head is held
            if first_write_at_once:
                cork.write(b"5\r\nhello\r\n")
            else:
                await asyncio.sleep(0)
            assert writer(cycle) is transport and len(transport.sent) == 1

    asyncio.run(scenario())
