"""Where the Batch API keeps its state, and a line body's checks for a key: the interactive
route's field checks, then a model the key may use that an engine lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.gateway.auth import Principal
from serving.gateway.batches.install import batch_paths, body_checks
from serving.gateway.catalog import ModelCatalog, ModelInfo
from serving.gateway.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    UpstreamUnavailableError,
)
from serving.gateway.images import ImagePolicy
from serving.gateway.settings import GatewaySettings

UPSTREAM = "http://127.0.0.1:9"


def _settings(**fields: object) -> GatewaySettings:
    return GatewaySettings.create(upstream=UPSTREAM, api_keys=("sk-dev-key-0123456789",), **fields)


def test_the_state_lives_beside_keys_db_unless_set() -> None:
    beside = _settings(keys_db="/data/keys.db")
    assert batch_paths(beside) == (Path("/data/batches.db"), Path("/data/batch-files"))
    chosen = _settings(batch_db="/b/x.db")
    assert batch_paths(chosen) == (Path("/b/x.db"), Path("/b/batch-files"))
    both = _settings(batch_db="/b/x.db", batch_files_dir="/f")
    assert batch_paths(both) == (Path("/b/x.db"), Path("/f"))
    assert batch_paths(_settings()) is None


def _catalog(*models: str) -> ModelCatalog:
    catalog = ModelCatalog()
    if models:
        catalog.update(0, {m: ModelInfo(window=64, parent=None, entry={"id": m}) for m in models})
    return catalog


def _body(**fields: object) -> bytes:
    return json.dumps(
        {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], **fields}
    ).encode()


def _check(catalog: ModelCatalog, caller: Principal, body: bytes) -> None:
    checks = body_checks(catalog, images=ImagePolicy.defaults(), max_inputs=8, retry_after_s=3)
    checks(caller)("chat", body)


def test_a_body_the_interactive_route_takes_passes() -> None:
    _check(_catalog("qwen", "other"), Principal("k"), _body(max_tokens=8))


def test_a_bad_field_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequestError) as refused:
        _check(_catalog("qwen"), Principal("k"), _body(max_tokens=-1))
    assert refused.value.param == "max_tokens"


def test_a_model_no_engine_lists_or_the_key_may_not_use_is_not_found() -> None:
    with pytest.raises(ModelNotFoundError):
        _check(_catalog("qwen"), Principal("k"), _body(model="nope"))
    with pytest.raises(ModelNotFoundError):
        _check(_catalog("qwen", "other"), Principal("k", models=("other",)), _body())


def test_before_any_engine_list_the_check_waits() -> None:
    with pytest.raises(UpstreamUnavailableError) as later:
        _check(_catalog(), Principal("k"), _body())
    assert later.value.retry_after_s == 3
