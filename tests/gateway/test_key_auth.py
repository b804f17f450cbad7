"""Keys from the stores in a running gateway (docs/architecture.md, reliability case 17).

Missing, malformed, wrong-scheme, unknown, wrong-secret and revoked keys get byte-identical
401s; a revocation by `serving keys revoke` takes effect at once; no secret reaches a log line
or a metric.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from serving.cli import main as serving_main
from serving.gateway.keys import KeyRecord, SqliteKeyStore, render_keys_yaml
from serving.gateway.keys.credentials import hash_secret, new_secret
from serving.gateway.keys.record import KeySpec
from serving.gateway.keys.sqlite_store import DATA_VERSION_INTERVAL_S
from serving.gateway.quota import Limits
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.scrape import scrape, settled, value
from tests.gateway.servers import TEST_KEY, GatewayServer, http_client

pytestmark = pytest.mark.timeout(30)

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def log_lines() -> Iterator[list[str]]:
    """Every line the gateway and uvicorn log meanwhile, at DEBUG."""
    handler = Collect()
    loggers = [logging.getLogger(name) for name in ("serving", "uvicorn", "uvicorn.access")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield handler.lines
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


def status_and_error(
    gateway: GatewayServer, headers: dict[str, str] | httpx.Headers
) -> tuple[int, bytes]:
    with http_client(gateway.url, key=None) as http:
        response = http.post("/v1/chat/completions", json=CHAT, headers=headers)
    return response.status_code, response.content


def test_bad_keys_get_identical_401s_and_revocation_is_immediate(
    make_gateway: GatewayFactory, keys: SqliteKeyStore, log_lines: list[str]
) -> None:
    gateway = make_gateway(keys_db=str(keys.path), api_keys=(TEST_KEY,), access_log=True)
    record, secret = keys.create(KeySpec("team", limits=Limits(rpm=100)))
    revoked, revoked_secret = keys.create(KeySpec("gone"))
    keys.revoke(revoked.key_id)
    unknown_id_secret = new_secret()[1]
    wrong_secret = secret[:-4] + ("aaaa" if not secret.endswith("aaaa") else "bbbb")
    assert status_and_error(gateway, {"Authorization": f"Bearer {secret}"})[0] == 200
    answers = {
        status_and_error(gateway, headers)
        for headers in (
            {},
            {"Authorization": ""},
            {"Authorization": "Bearer"},
            {"Authorization": f"Basic {secret}"},
            {"Authorization": secret},
            {"Authorization": f"Bearer {secret} extra"},
            {"Authorization": f"Bearer {unknown_id_secret}"},
            {"Authorization": f"Bearer {wrong_secret}"},
            {"Authorization": f"Bearer {revoked_secret}"},
            httpx.Headers({"Authorization": "Bearer sk-\u00e9"}, encoding="utf-8"),
        )
    }
    assert len(answers) == 1
    status, body = answers.pop()
    assert status == 401 and b"invalid_api_key" in body

    # Revoked through the command, as an operator would, while the gateway runs.
    assert serving_main(["keys", "revoke", record.key_id, "--store", str(keys.path)]) == 0
    time.sleep(DATA_VERSION_INTERVAL_S + 0.01)  # the store checks for changes every 50 ms
    assert status_and_error(gateway, {"Authorization": f"Bearer {secret}"}) == (status, body)
    # The development key still works, with its public id `dev`.
    assert status_and_error(gateway, {"Authorization": f"Bearer {TEST_KEY}"})[0] == 200

    assert settled(gateway)
    samples = scrape(gateway)
    assert value(samples, "gateway_requests_total", key=record.key_id, model="fake", status="200")
    assert value(samples, "gateway_requests_total", key="dev", model="fake", status="200")
    assert value(samples, "gateway_requests_total", key="none", model="none", status="401") == 11
    texts = [*log_lines, repr(samples)]
    assert any(record.key_id in text for text in texts)  # ids are shown ...
    for secret_value in (secret, revoked_secret, wrong_secret, unknown_id_secret, TEST_KEY):
        assert not any(secret_value in text for text in texts)  # ... secrets never


def test_keys_file_store(
    make_gateway: GatewayFactory, tmp_path: Path, upstream: FakeUpstream
) -> None:
    key_id, secret = new_secret()
    record = KeyRecord(
        key_id=key_id,
        name="from-a-secret",
        secret_sha256=hash_secret(secret),
        created_at=datetime(2025, 1, 1, tzinfo=UTC),
        limits=Limits(max_tokens=2),
    )
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([record]))
    gateway = make_gateway(keys_file=str(path), api_keys=())
    assert status_and_error(gateway, {"Authorization": f"Bearer {secret}"})[0] == 200
    assert status_and_error(gateway, {"Authorization": f"Bearer {TEST_KEY}"})[0] == 401
    assert settled(gateway)
