"""`serving gateway`: flags to settings, the uvicorn server it builds, light imports."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.errors import ServingError
from serving.gateway.command import add_arguments, build_server, settings_from_args
from serving.gateway.settings import GatewaySettings, digest_key

URL = "http://127.0.0.1:8001"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_to_settings() -> None:
    args = parse(
        "--upstream",
        URL,
        "--api-key",
        "sk-a",
        "--api-key",
        "sk-b",
        "--port",
        "9000",
        "--host",
        "0.0.0.0",
        "--upstream-idle-timeout",
        "60",
        "--max-body-bytes",
        "1000",
    )
    settings = settings_from_args(args, environ={})
    assert (settings.upstream, settings.port, settings.host) == (URL, 9000, "0.0.0.0")
    assert (settings.upstream_idle_timeout_s, settings.max_body_bytes) == (60.0, 1000)
    assert settings.api_key_digests == (digest_key("sk-a"), digest_key("sk-b"))
    assert args.log_level == "info" and args.access_log is False


def test_key_stores_default_to_the_serving_home_database() -> None:
    settings = settings_from_args(parse("--upstream", URL), environ={"SERVING_HOME": "/srv/x"})
    assert (settings.keys_db, settings.keys_file, settings.api_key_digests) == (
        "/srv/x/keys.db",
        None,
        (),
    )
    only_file = settings_from_args(
        parse("--upstream", URL, "--keys-file", "/etc/keys.yaml"), environ={}
    )
    assert (only_file.keys_db, only_file.keys_file) == (None, "/etc/keys.yaml")
    both = settings_from_args(
        parse("--upstream", URL, "--keys-file", "/k.yaml", "--keys-db", "/k.db"), environ={}
    )
    assert (both.keys_db, both.keys_file) == ("/k.db", "/k.yaml")


def test_hardening_flags() -> None:
    args = parse(
        "--upstream", URL, "--header-timeout", "2", "--body-timeout", "3", "--drain-delay", "0",
        "--graceful-timeout", "7", "--default-max-tokens", "64",
    )  # fmt: skip
    settings = settings_from_args(args, environ={})
    assert (settings.header_timeout_s, settings.body_timeout_s) == (2.0, 3.0)
    assert (settings.drain_delay_s, settings.graceful_shutdown_s) == (0.0, 7)
    assert settings.default_max_tokens == 64


def test_key_from_environment() -> None:
    settings = settings_from_args(parse("--upstream", URL), environ={"SERVING_API_KEY": "sk-e"})
    assert settings.api_key_digests == (digest_key("sk-e"),)


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ((), "--upstream"),
        (("--upstream", "localhost:8001", "--api-key", "k"), "upstream"),
        (("--upstream", URL, "--api-key", "k", "--port", "-1"), "port"),
        (("--upstream", URL, "--api-key", "k", "--upstream-idle-timeout", "0"), "idle_timeout"),
    ],
)
def test_bad_input_names_the_field(argv: tuple[str, ...], field: str) -> None:
    args = parse(*argv)
    args.upstream = args.upstream if "--upstream" in argv else None  # ignore the caller's env
    with pytest.raises(ServingError, match=field):
        settings_from_args(args, environ={})


def test_build_server_uses_uvloop_httptools_and_lifespan() -> None:
    settings = GatewaySettings.create(upstream=URL, api_keys=["k"], port=9001)
    config = build_server(settings, log_level="warning").config
    assert (config.loop, config.lifespan) == ("uvloop", "on")
    assert isinstance(config.http, type) and issubclass(config.http, HttpToolsProtocol)
    assert (config.port, config.access_log) == (9001, False)
    assert config.timeout_graceful_shutdown == settings.graceful_shutdown_s


def test_importing_the_command_is_light() -> None:
    code = (
        "import sys, serving.gateway.command; "
        "print(sorted(m for m in ('aiohttp', 'uvicorn', 'uvloop') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
