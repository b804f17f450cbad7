"""`serving adapters load|list|unload` against a gateway over fake engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway.adapters.conftest import ADMIN, gateway_for
from tests.gateway.conftest import GatewayFactory
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.servers import closed_port
from tests.gateway.test_keys_command import serving

pytestmark = pytest.mark.timeout(60)


def test_load_list_unload(
    make_gateway: GatewayFactory,
    engines: tuple[FakeUpstream, FakeUpstream],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gateway = gateway_for(make_gateway, engines, tmp_path / "keys.db")
    monkeypatch.setenv("SERVING_ADMIN_KEY", ADMIN)
    where = ("adapters", "--gateway", gateway.url)
    code, out, err = serving(capsys, *where, "list")
    assert (code, out, err) == (0, "no adapters loaded at run time\n", "")
    code, out, _ = serving(capsys, *where, "load", "team-a", "/adapters/a")
    assert code == 0 and out.startswith("team-a  loaded  /adapters/a  engines: ")
    assert all(engine.address in out for engine in engines)
    code, out, _ = serving(capsys, *where, "list")
    assert code == 0 and out.startswith("team-a  loaded")
    code, out, _ = serving(capsys, *where, "unload", "team-a")
    assert code == 0 and out.startswith("team-a  removed  /adapters/a  engines: none")
    code, out, err = serving(capsys, *where, "unload", "team-a")
    assert code == 2 and out == ""
    assert err.startswith("serving adapters: error: the gateway answered 404: No adapter")


def test_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERVING_ADMIN_KEY", raising=False)
    code, _, err = serving(capsys, "adapters", "list")
    assert (
        code == 2
        and err == "serving adapters: error: SERVING_ADMIN_KEY: set it to the gateway's admin key\n"
    )
    monkeypatch.setenv("SERVING_ADMIN_KEY", ADMIN)
    url = f"http://127.0.0.1:{closed_port()}"
    code, _, err = serving(capsys, "adapters", "--gateway", url, "list")
    assert code == 2 and err.count("\n") == 1 and f"--gateway {url}" in err
