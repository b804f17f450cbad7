"""One batch line through a stand-in for `Completions.handle`: its answer captured, its
record observed once, refusals for now marked to retry, and its turns in the lowest class."""

from __future__ import annotations

import asyncio
import json
from typing import cast

from serving.gateway.auth import Principal
from serving.gateway.batches.line_call import LineResult, call_line
from serving.gateway.completions import Completions
from serving.gateway.errors import EngineBusyError, GatewayError, InvalidRequestError
from serving.gateway.fair_queue import in_lowest_class
from serving.gateway.metrics import RequestRecord
from serving.gateway.proxy import ProxyRequest
from serving.gateway.quota import QuotaStoreUnavailable
from serving.gateway.types import Receive, Send

CHAT = "/v1/chat/completions"
BODY = b'{"model":"m","messages":[]}'


class Handler:
    """Answers as `Completions.handle` does: a response sent, or a `GatewayError` raised."""

    def __init__(self, *, raises: Exception | None = None) -> None:
        self.raises = raises
        self.seen: list[tuple[str, bytes, bytes, bool]] = []

    async def handle(
        self,
        kind: str,
        caller: Principal,
        request: ProxyRequest,
        receive: Receive,
        send: Send,
        record: RequestRecord,
    ) -> None:
        self.seen.append((kind, request.target, request.body, in_lowest_class()))
        assert request.request_id == b"run-1"  # the run's id, as the runner kept it
        gone = asyncio.ensure_future(receive())
        await asyncio.sleep(0.01)
        assert not gone.done()  # a line has no client to go away
        gone.cancel()
        if self.raises is not None:
            raise self.raises
        record.status = 200
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"id":', "more_body": True})
        await send({"type": "http.response.body", "body": b'"x"}', "more_body": False})


def line(handler: Handler) -> tuple[LineResult, list[RequestRecord]]:
    observed: list[RequestRecord] = []
    result = asyncio.run(
        call_line(
            cast(Completions, handler),
            "chat",
            Principal("k1"),
            BODY,
            CHAT,
            request_id="run-1",
            observe=observed.append,
            retry_after_s=2.5,
        )
    )
    return result, observed


def test_the_answer_is_captured_and_observed_once_in_the_lowest_class() -> None:
    handler = Handler()
    result, observed = line(handler)
    assert (result.status, result.retry_after_s) == (200, None)
    assert json.loads(result.body) == {"id": "x"}
    assert result.request_id == "run-1" and handler.seen == [("chat", CHAT.encode(), BODY, True)]
    assert [(record.key, record.status) for record in observed] == [("k1", 200)]
    assert not in_lowest_class()  # only the line's own task


def test_a_refusal_of_the_request_is_its_result() -> None:
    result, observed = line(Handler(raises=InvalidRequestError("bad", param="max_tokens")))
    assert (result.status, result.retry_after_s) == (400, None)
    assert json.loads(result.body)["error"]["param"] == "max_tokens"
    assert [record.status for record in observed] == [400]


def test_a_refusal_for_now_is_retried_after_its_retry_after() -> None:
    class Limited(GatewayError):
        status = 429

    result, _ = line(Handler(raises=Limited("slow down", retry_after_s=7)))
    assert (result.status, result.retry_after_s) == (429, 7)
    busy, _ = line(Handler(raises=EngineBusyError("busy")))  # no Retry-After of its own
    assert (busy.status, busy.retry_after_s) == (503, 2.5)


def test_a_quota_store_that_does_not_answer_is_retried() -> None:
    result, observed = line(Handler(raises=QuotaStoreUnavailable("down")))
    assert (result.status, result.retry_after_s) == (503, 2.5)
    assert len(observed) == 1
