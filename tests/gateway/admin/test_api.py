"""The admin API's own keys and routing: 404 when off, 401 for tenant keys, OpenAI errors."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from serving.gateway.admin.api import AdminApi, AdminRequest
from serving.gateway.errors import InvalidRequestError
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.types import Receive, Scope, Send
from tests.gateway.conftest import GatewayFactory
from tests.gateway.servers import TEST_KEY, http_client

ADMIN_KEY = "adm-test-key"


def _client(api: AdminApi) -> httpx.AsyncClient:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        authorization = dict(scope["headers"]).get(b"authorization")
        await api.serve(scope, receive, send, request_id=b"r1", authorization=authorization)

    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gw",
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
    )


def _api(*, max_body_bytes: int = 1000) -> AdminApi:
    api = AdminApi((hash_secret(ADMIN_KEY),), max_body_bytes=max_body_bytes)

    async def echo(request: AdminRequest) -> tuple[int, object]:
        if request.query.get("fail") == "bad":
            raise InvalidRequestError("fail is bad", param="fail")
        if request.query.get("fail") == "bug":
            raise RuntimeError("a bug")
        return 200, {"tail": request.tail, "query": request.query, "body": request.body.decode()}

    api.add("GET", "/admin/v1/echo", echo)
    api.add("POST", "/admin/v1/echo", echo)
    api.add("DELETE", "/admin/v1/things/", echo, prefix=True)
    return api


def _run(api: AdminApi, method: str, path: str, **kwargs: object) -> httpx.Response:
    async def go() -> httpx.Response:
        async with _client(api) as client:
            return await client.request(method, path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(go())


def test_routes_answer_with_query_body_and_tail() -> None:
    api = _api()
    assert _run(api, "GET", "/admin/v1/echo?a=1").json() == {
        "tail": "",
        "query": {"a": "1"},
        "body": "",
    }
    assert _run(api, "POST", "/admin/v1/echo", content=b"x").json()["body"] == "x"
    assert _run(api, "DELETE", "/admin/v1/things/team-a").json()["tail"] == "team-a"


def test_refusals_are_openai_errors() -> None:
    api = _api(max_body_bytes=4)
    wrong_method = _run(api, "PUT", "/admin/v1/echo")
    assert wrong_method.status_code == 403
    assert wrong_method.json()["error"]["code"] == "endpoint_not_allowed"
    assert _run(api, "GET", "/admin/v1/nothing").json()["error"]["code"] == "unknown_url"
    bad = _run(api, "GET", "/admin/v1/echo?fail=bad")
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "fail")
    bug = _run(api, "GET", "/admin/v1/echo?fail=bug")
    assert bug.status_code == 500 and bug.json()["error"]["type"] == "server_error"
    twice = _run(api, "GET", "/admin/v1/echo?a=1&a=2")
    assert (twice.status_code, twice.json()["error"]["param"]) == (400, "a")
    assert _run(api, "POST", "/admin/v1/echo", content=b"12345").status_code == 413


@pytest.mark.parametrize("key", [None, TEST_KEY, ADMIN_KEY + "x"])
def test_anything_but_an_admin_key_gets_401_before_the_path_is_looked_up(
    key: str | None,
) -> None:
    api = _api()
    headers = {"Authorization": f"Bearer {key}"} if key else {"Authorization": ""}
    for path in ("/admin/v1/echo", "/admin/v1/nothing"):
        response = _run(api, "GET", path, headers=headers)
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "invalid_api_key"


def test_the_gateway_hides_the_admin_api_without_an_admin_key(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway()
    with http_client(gateway.url, key=TEST_KEY) as http:
        response = http.get("/admin/v1/usage")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_url"


def test_the_gateway_keeps_tenant_and_admin_keys_apart(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway(admin_keys=(ADMIN_KEY,))
    with http_client(gateway.url, key=TEST_KEY) as tenant:
        assert tenant.get("/admin/v1/usage").status_code == 401
    with http_client(gateway.url, key=ADMIN_KEY) as admin:
        assert admin.get("/v1/models").status_code == 401  # not a tenant key
        assert admin.get("/admin/v1/no-such-route").status_code == 404
