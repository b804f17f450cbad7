"""Revocation fails closed across stores: a key revoked in any store is refused everywhere,
and readiness fails only when no key store is left working."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from serving.gateway.auth import KeyStoreAuthenticator, StaticKeyAuthenticator
from serving.gateway.errors import AuthenticationError
from serving.gateway.keys import FileKeyStore, SqliteKeyStore
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.keys.file_store import render_keys_yaml
from serving.gateway.keys.record import KeySpec
from tests.gateway.conftest import GatewayFactory, eventually
from tests.gateway.keys.test_file_store import break_keys_file, make_record
from tests.gateway.scrape import scrape, value
from tests.gateway.servers import http_client


def bearer(secret: str) -> bytes:
    return f"Bearer {secret}".encode()


def test_a_key_revoked_in_one_store_is_refused_though_another_holds_it_active(
    tmp_path: Path,
) -> None:
    record, secret = make_record("team-a")
    active = tmp_path / "active.yaml"
    active.write_text(render_keys_yaml([record]))
    revoked = tmp_path / "revoked.yaml"
    revoked.write_text(render_keys_yaml([dataclasses.replace(record, revoked=True)]))
    for order in ((active, revoked), (revoked, active)):
        authenticator = KeyStoreAuthenticator([FileKeyStore(path) for path in order])
        with pytest.raises(AuthenticationError):
            authenticator.authenticate(bearer(secret))
    both_active = KeyStoreAuthenticator([FileKeyStore(active), FileKeyStore(active)])
    assert both_active.authenticate(bearer(secret)).key_id == record.key_id


def test_a_revocation_in_the_key_database_holds_over_a_keys_file(tmp_path: Path) -> None:
    store = SqliteKeyStore(tmp_path / "keys.db")
    created, secret = store.create(KeySpec("team-b"))
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([created]))
    authenticator = KeyStoreAuthenticator([store, FileKeyStore(path)])
    assert authenticator.authenticate(bearer(secret)).key_id == created.key_id
    store.revoke(created.key_id)
    with pytest.raises(AuthenticationError):
        authenticator.authenticate(bearer(secret))
    store.close()


def test_readiness_fails_only_when_no_key_store_works(tmp_path: Path) -> None:
    record, _ = make_record("team-c")
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([record]))
    broken = FileKeyStore(path, check_interval=0)
    break_keys_file(path)
    broken.reload_if_changed()
    assert broken.broken is not None
    alone = KeyStoreAuthenticator([broken])
    assert alone.unready_reason is not None and "keys.yaml" in alone.unready_reason
    other = tmp_path / "other.yaml"
    other.write_text(render_keys_yaml([make_record("team-d")[0]]))
    assert KeyStoreAuthenticator([broken, FileKeyStore(other)]).unready_reason is None
    dev = StaticKeyAuthenticator([hash_secret("sk-dev-key")])
    assert KeyStoreAuthenticator([broken], dev=dev).unready_reason is None


def test_a_gateway_whose_only_keys_file_breaks_refuses_its_keys_and_says_so(
    make_gateway: GatewayFactory, tmp_path: Path
) -> None:
    record, secret = make_record("team-e")
    path = tmp_path / "keys.yaml"
    path.write_text(render_keys_yaml([dataclasses.replace(record, models=())]))
    gateway = make_gateway(keys_file=str(path), api_keys=())
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    with http_client(gateway.url, key=secret) as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 200
        assert value(scrape(gateway), "gateway_keys_file_up") == 1
        # A revocation written badly: the file no longer parses.
        path.write_text(render_keys_yaml([record]).replace("revoked: false", "revoked: [true"))
        assert eventually(lambda: value(scrape(gateway), "gateway_keys_file_up") == 0)
        assert http.post("/v1/chat/completions", json=body).status_code == 401
        ready = http.get("/readyz")
        assert ready.status_code == 503 and "no key store loads" in ready.json()["reason"]
        assert secret not in ready.text
        path.write_text(render_keys_yaml([dataclasses.replace(record, models=())]))
        assert eventually(lambda: value(scrape(gateway), "gateway_keys_file_up") == 1)
        assert http.post("/v1/chat/completions", json=body).status_code == 200
