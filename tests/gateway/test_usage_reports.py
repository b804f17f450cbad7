"""GET /admin/v1/usage on a real gateway in front of the fake upstream: admin keys only, bad
queries named, and the numbers equal to `gateway_tokens_total` and to the usage in each
response, per key and model, in keys.db and in Redis shared by two replicas."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import uuid
from datetime import date
from typing import Any

import httpx
import pytest

from serving import cli
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.usage_ledger import recorder
from serving.gateway.usage_ledger import report as report_module
from serving.gateway.usage_ledger.days import DAY_S, utc_day
from serving.gateway.usage_ledger.sqlite_store import read_usage_file
from serving.gateway.usage_reports import USAGE_PATH
from tests.gateway.batches.helpers import run_batch
from tests.gateway.conftest import GatewayFactory
from tests.gateway.quota.redis_server import RedisServer
from tests.gateway.scrape import scrape, settled
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client

pytestmark = pytest.mark.timeout(120)

ADMIN_KEY = "adm-usage-test-key"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# (key id, model) -> [prompt, completion]
Usage = dict[tuple[str, str], list[int]]


def report(gateway: GatewayServer, query: str, key: str = ADMIN_KEY) -> httpx.Response:
    with http_client(gateway.url, key=key) as http:
        return http.get(f"{USAGE_PATH}?{query}")


def today_query() -> str:
    """Yesterday to tomorrow: every row of a test's fresh ledger, even across midnight."""
    now = time.time()
    return f"from={utc_day(now - DAY_S)}&to={utc_day(now + DAY_S)}"


def traffic(gateway: GatewayServer, key: str, seen: dict[str, list[int]]) -> None:
    """Requests of each charged kind, adding up the usage each response reported per key."""
    key_id = key_id_of(gateway, key)
    with http_client(gateway.url, key=key) as http:
        for body in (
            CHAT,
            {**CHAT, "model": "nope"},  # a model the engine does not list
            {**CHAT, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}},
        ):
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            usage = reported_usage(response, body)
            counts = seen.setdefault(key_id, [0, 0])
            counts[0] += usage["prompt_tokens"]
            counts[1] += usage["completion_tokens"]


def reported_usage(response: httpx.Response, body: dict[str, Any]) -> dict[str, int]:
    if body.get("stream"):
        events = [line[6:] for line in response.text.splitlines() if line.startswith("data: {")]
        usage: dict[str, int] = json.loads(events[-1])["usage"]
    else:
        usage = response.json()["usage"]
    return usage


def key_id_of(gateway: GatewayServer, key: str) -> str:
    return gateway.in_loop(
        lambda: gateway.app.authenticator.authenticate(f"Bearer {key}".encode()).key_id
    )


def counters(*gateways: GatewayServer) -> Usage:
    """gateway_tokens_total by (key, model), summed over the gateways."""
    found: Usage = {}
    for gateway in gateways:
        for (name, labels), count in scrape(gateway).items():
            if name == "gateway_tokens_total":
                tags = dict(labels)
                index = 0 if tags["kind"] == "prompt" else 1
                found.setdefault((tags["key"], tags["model"]), [0, 0])[index] += int(count)
    return found


def per_key(document: dict[str, Any]) -> dict[str, list[int]]:
    return {
        key["key_id"]: [key["prompt_tokens"], key["completion_tokens"]] for key in document["keys"]
    }


def cli_json(capsys: pytest.CaptureFixture[str], document: dict[str, Any], *where: str) -> Any:
    """`serving usage report --format json` over the same days as `document`."""
    days = ["--from", document["from"], "--to", document["to"]]
    assert cli.main(["usage", "report", *days, "--format", "json", *where]) == 0
    return json.loads(capsys.readouterr().out)


def per_key_and_model(document: dict[str, Any]) -> Usage:
    return {
        (key["key_id"], model["model"]): [model["prompt_tokens"], model["completion_tokens"]]
        for key in document["keys"]
        for model in key["models"]
    }


def test_without_an_admin_key_the_route_does_not_exist(make_gateway: GatewayFactory) -> None:
    gateway = make_gateway()
    response = report(gateway, today_query(), key=TEST_KEY)
    assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_url"


def test_a_tenant_key_gets_401_and_bad_queries_a_400_naming_the_parameter(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    _, tenant = keys.create(KeySpec("team-a"))
    gateway = make_gateway(keys_db=str(keys.path), admin_keys=(ADMIN_KEY,))
    for key in (TEST_KEY, tenant):
        response = report(gateway, today_query(), key=key)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    for query, param, words in (
        ("from=2026-13-01&to=2026-03-01", "from", "'2026-13-01' is not a day"),
        ("from=2999-01-01", "from", "from: 2999-01-01 is after today"),
        ("from=2026-03-02&to=2026-03-01", "to", "before the first day"),
        ("from=2026-03-01&to=2026-03-01&key=team-a", "key", "is not a key id"),
        ("from=2026-03-01&to=2026-03-01&format=csv", "format", "Unknown query parameter"),
    ):
        response = report(gateway, query)
        error = response.json()["error"]
        assert (response.status_code, error["param"]) == (400, param), query
        assert words in error["message"], error
    assert report(gateway, "from=2026-03-01&to=2026-03-01").json()["rows"] == []


def test_without_from_and_to_the_report_is_the_current_utc_month_so_far(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    today = date.fromisoformat(utc_day(time.time()))
    # Pinned, so that a midnight between the request and the report moves neither end.
    monkeypatch.setattr(report_module, "utc_today", lambda: today)
    gateway = make_gateway(keys_db=str(keys.path), admin_keys=(ADMIN_KEY,))
    with http_client(gateway.url) as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert settled(gateway)
    for query in ("", f"to={today}", "key=dev"):
        response = report(gateway, query)
        assert response.status_code == 200, response.text
        document = response.json()
        assert (document["from"], document["to"]) == (today.replace(day=1).isoformat(), str(today))
    assert report(gateway, "").json()["keys"] == report(gateway, today_query()).json()["keys"]


def test_a_gateway_with_nowhere_durable_records_nothing_and_says_so(
    make_gateway: GatewayFactory,
) -> None:
    gateway = make_gateway(admin_keys=(ADMIN_KEY,))  # development keys only: no keys.db
    with http_client(gateway.url) as http:
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    response = report(gateway, today_query())
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "usage_not_recorded"


def test_the_report_equals_the_counters_and_the_reported_usage(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, capsys: pytest.CaptureFixture[str]
) -> None:
    _, team_a = keys.create(KeySpec("team-a"))
    _, team_b = keys.create(KeySpec("team-b"))
    gateway = make_gateway(keys_db=str(keys.path), admin_keys=(ADMIN_KEY,))
    seen: dict[str, list[int]] = {}
    for key in (team_a, team_b, TEST_KEY, team_a):
        traffic(gateway, key, seen)
    with http_client(gateway.url, key=team_b) as http:  # usage not asked for: charged all the same
        assert http.post("/v1/chat/completions", json={**CHAT, "stream": True}).status_code == 200
    seen[key_id_of(gateway, team_b)][0] += 3  # what the fake engine counts for it
    seen[key_id_of(gateway, team_b)][1] += 4
    assert settled(gateway)
    response = report(gateway, today_query())
    assert response.status_code == 200, response.text
    document = response.json()
    counted = counters(gateway)
    assert per_key_and_model(document) == counted
    assert per_key(document) == seen
    names = {key["key_id"]: key["key_name"] for key in document["keys"]}
    assert names["dev"] is None and sorted(n for n in names.values() if n) == ["team-a", "team-b"]
    total = document["total"]
    assert total["prompt_tokens"] == sum(counts[0] for counts in counted.values())
    assert total["completion_tokens"] == sum(counts[1] for counts in counted.values())
    assert cli_json(capsys, document, "--keys-db", str(keys.path)) == document
    one_key = report(gateway, f"{today_query()}&key=dev").json()
    assert [key["key_id"] for key in one_key["keys"]] == ["dev"] and one_key["key_id"] == "dev"


def test_batch_lines_count_in_the_keys_totals_and_apart(
    make_gateway: GatewayFactory, keys: SqliteKeyStore
) -> None:
    """A Batch API line is charged to its key like an interactive request, and the report
    shows the part of the key's total that its batch lines used: what their output lines
    say vLLM counted."""
    record, secret = keys.create(KeySpec("offline"))
    gateway = make_gateway(keys_db=str(keys.path), admin_keys=(ADMIN_KEY,))
    seen: dict[str, list[int]] = {}
    traffic(gateway, secret, seen)
    batch = run_batch(gateway, secret, uuid.uuid4().hex)
    assert batch["request_counts"]["completed"] == 2
    with http_client(gateway.url, key=secret) as http:
        output = http.get(f"/v1/files/{batch['output_file_id']}/content").text
    in_batch = [0, 0]
    for line in output.splitlines():
        usage = json.loads(line)["response"]["body"]["usage"]
        in_batch[0] += usage["prompt_tokens"]
        in_batch[1] += usage["completion_tokens"]
    assert in_batch[0] > 0 and in_batch[1] > 0
    assert settled(gateway)
    document = report(gateway, today_query()).json()
    (key,) = document["keys"]
    interactive = seen[record.key_id]
    assert [key["prompt_tokens"], key["completion_tokens"]] == [
        interactive[0] + in_batch[0],
        interactive[1] + in_batch[1],
    ]
    assert [key["batch"]["prompt_tokens"], key["batch"]["completion_tokens"]] == in_batch
    assert document["total"]["batch"] == key["batch"]
    assert per_key_and_model(document) == counters(gateway)  # batch lines in the counters too


def test_a_gateway_that_stops_writes_what_it_recorded(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder, "FLUSH_INTERVAL_S", 3600.0)  # only shutdown writes
    gateway = make_gateway(keys_db=str(keys.path))
    with http_client(gateway.url) as http:
        for _ in range(3):
            assert http.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert settled(gateway)
    counted = counters(gateway)
    now = time.time()
    assert read_usage_file(keys.path, utc_day(now - DAY_S), utc_day(now + DAY_S), None) == []
    gateway.stop()
    rows = read_usage_file(keys.path, utc_day(now - DAY_S), utc_day(now + DAY_S), None)
    assert {
        (row.key_id, row.model): [row.prompt_tokens, row.completion_tokens] for row in rows
    } == counted


def test_replicas_sharing_redis_add_into_one_report(
    make_gateway: GatewayFactory,
    keys: SqliteKeyStore,
    redis_server: RedisServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    redis_server.flush()
    _, team_a = keys.create(KeySpec("team-a"))
    replicas = [
        make_gateway(keys_db=str(keys.path), redis_url=redis_server.url, admin_keys=(ADMIN_KEY,))
        for _ in range(2)
    ]
    seen: dict[str, list[int]] = {}
    for gateway in replicas:
        traffic(gateway, team_a, seen)
        traffic(gateway, TEST_KEY, seen)
    for gateway in replicas:
        assert settled(gateway)
        # Each replica's own usage is written before it answers a report: flush both.
        assert report(gateway, today_query()).status_code == 200
    document = report(replicas[0], today_query()).json()
    assert per_key_and_model(document) == counters(*replicas)
    assert report(replicas[1], today_query()).json() == document
    assert per_key(document) == seen
    with redis_server.admin() as admin:
        assert admin.keys("{qwen-serving:usage}:day:*")
    with contextlib.closing(sqlite3.connect(keys.path)) as conn:  # Redis, not keys.db
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
    assert "usage_days" not in tables
    # Names come from the keys kept in that Redis: these keys are in keys.db.
    unnamed = cli_json(capsys, document, "--redis-url", redis_server.url)
    assert {key["key_name"] for key in unnamed["keys"]} == {None}
    for entry in (*document["rows"], *document["keys"]):
        entry["key_name"] = None
    assert unnamed == document
