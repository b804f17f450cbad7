"""`serving gateway`: flags to settings, --help from the model, the server it builds, light
imports. Every field's flag and variable is tested in test_settings.py."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic_core import PydanticUndefined
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving import cli
from serving.errors import ServingError
from serving.gateway import command
from serving.gateway.command import build_server
from serving.gateway.keys.credentials import hash_secret
from serving.gateway.setting_names import env_name, flag_name
from serving.gateway.settings import GatewaySettings
from tests.gateway.settings_env import clean_environment, from_flags  # noqa: F401

URL = "http://127.0.0.1:8001"


def test_flags_to_settings() -> None:
    settings = from_flags(
        "--upstream", URL, "--api-key", "sk-a", "--api-key", "sk-b", "--port", "9000",
        "--host", "0.0.0.0", "--upstream-idle-timeout", "60", "--max-body-bytes", "1000",
    )  # fmt: skip
    assert (settings.upstream, settings.port, settings.host) == (URL, 9000, "0.0.0.0")
    assert (settings.upstream_idle_timeout_s, settings.max_body_bytes) == (60.0, 1000)
    assert settings.api_key_digests == (hash_secret("sk-a"), hash_secret("sk-b"))


def test_command_options_that_are_not_settings() -> None:
    args = cli.build_parser().parse_args(["gateway", "--upstream", URL])
    assert args.log_level == "info" and args.access_log is False and args.api_keys is None


def test_key_stores_default_to_the_serving_home_database(tmp_path: Path) -> None:
    settings = from_flags("--upstream", URL)
    assert (settings.keys_db, settings.keys_file, settings.api_key_digests) == (
        str(tmp_path / "home" / "keys.db"),
        None,
        (),
    )
    only_file = from_flags("--upstream", URL, "--keys-file", "/etc/keys.yaml")
    assert (only_file.keys_db, only_file.keys_file) == (None, "/etc/keys.yaml")
    both = from_flags("--upstream", URL, "--keys-file", "/k.yaml", "--keys-db", "/k.db")
    assert (both.keys_db, both.keys_file) == ("/k.db", "/k.yaml")


def test_hardening_flags() -> None:
    settings = from_flags(
        "--upstream", URL, "--header-timeout", "2", "--body-timeout", "3", "--drain-delay", "0",
        "--graceful-timeout", "7", "--default-max-tokens", "64",
    )  # fmt: skip
    assert (settings.header_timeout_s, settings.body_timeout_s) == (2.0, 3.0)
    assert (settings.drain_delay_s, settings.graceful_shutdown_s) == (0.0, 7)
    assert settings.default_max_tokens == 64


def test_key_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVING_API_KEY", "sk-e")
    assert from_flags("--upstream", URL).api_key_digests == (hash_secret("sk-e"),)
    assert from_flags("--upstream", URL, "--api-key", "sk-f").api_key_digests == (
        hash_secret("sk-f"),
    )


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ((), "upstream: required"),
        (("--upstream", "localhost:8001", "--api-key", "k"), "upstream"),
        (("--upstream", URL, "--api-key", "k", "--port", "-1"), "port"),
        (("--upstream", URL, "--api-key", "k", "--upstream-idle-timeout", "0"), "idle_timeout"),
        (("--upstream", URL, "--api-key", "has space"), "api_key"),
    ],
)
def test_bad_input_names_the_field(argv: tuple[str, ...], field: str) -> None:
    with pytest.raises(ServingError, match=field):
        from_flags(*argv)


def gateway_help(capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(["gateway", "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def help_entries(text: str) -> dict[str, str]:
    """`--flag` -> its whole help entry, on one line."""
    entries: dict[str, str] = {}
    flag = None
    for line in text.splitlines():
        if line.startswith("  -"):
            flag = line.split()[0]
            entries[flag] = line.strip()
        elif flag is not None and line.startswith("   "):
            entries[flag] += " " + line.strip()
        else:
            flag = None
    return entries


def test_help_shows_each_setting_with_its_model_default_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    entries = help_entries(gateway_help(capsys))
    for name, field in GatewaySettings.model_fields.items():
        flag = flag_name(name)
        if name in ("api_key_digests", "admin_key_digests"):
            assert flag not in entries
            continue
        entry = entries[flag]
        assert f"[env: {env_name(name)}]" in entry, entry
        if field.default is PydanticUndefined:
            assert "(required)" in entry, entry
        else:
            shown = "null" if field.default is None else str(field.default)
            assert f"(default: {shown})" in entry, entry
        # argparse wraps lines at spaces and after hyphens: compare without whitespace
        assert field.description and "".join(field.description.split()) in "".join(entry.split()), (
            entry
        )
    assert "--api-key" in entries and "SERVING_API_KEY" in entries["--api-key"]


def test_help_names_the_key_store_it_defaults_to(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # argparse wraps at spaces and after hyphens (a long temporary path breaks at one):
    # compare without whitespace
    text = "".join(gateway_help(capsys).split())
    assert f"keys.dbdefaultsto{tmp_path / 'home' / 'keys.db'}" in text


def test_build_server_uses_uvloop_httptools_and_lifespan() -> None:
    settings = GatewaySettings.create(upstream=URL, api_keys=["k"], port=9001)
    config = build_server(settings, log_level="warning").config
    assert (config.loop, config.lifespan) == ("uvloop", "on")
    assert isinstance(config.http, type) and issubclass(config.http, HttpToolsProtocol)
    assert (config.port, config.access_log, config.proxy_headers) == (9001, False, False)
    assert config.server_header is False
    assert config.timeout_graceful_shutdown == settings.graceful_shutdown_s


def test_importing_the_command_is_light() -> None:
    code = (
        "import sys, serving.gateway.command; "
        "print(sorted(m for m in ('aiohttp', 'uvicorn', 'uvloop') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tune_gc_collects_less_often_and_leaves_start_up_alone() -> None:
    threshold = gc.get_threshold()
    try:
        command.tune_gc()
        assert gc.get_threshold() == (command.GC_YOUNG_THRESHOLD, *threshold[1:])
        assert gc.get_freeze_count() > 0  # what start-up built is never walked again
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
