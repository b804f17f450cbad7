"""`serving keys ... --redis-url`: every action as against a key database, on a real
redis-server, and one-line errors naming the flag (never the URL's password)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from serving import cli
from serving.gateway.keys.redis_store import BlockingRedisKeyStore
from serving.gateway.keys.sqlite_store import SqliteKeyStore
from serving.gateway.keys.store import WritableKeyStore
from serving.gateway.quota import Limits
from tests.gateway.quota.redis_server import RedisServer, free_port

SECRET = re.compile(r"sk-[0-9a-f]{8}-[A-Za-z0-9]{40}")

# (flags that choose the store, a store reading the same keys as they are now)
Where = tuple[list[str], Callable[[], WritableKeyStore]]


def serving(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def redis_reader(url: str) -> WritableKeyStore:
    store = BlockingRedisKeyStore.from_url(url)
    store.refresh()
    return store


@pytest.fixture(params=["store", pytest.param("redis-url", marks=pytest.mark.redis)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    if request.param == "store":
        path = tmp_path / "keys.db"
        return ["--store", str(path)], lambda: SqliteKeyStore(path)
    url: str = request.getfixturevalue("default_namespace")
    return ["--redis-url", url], lambda: redis_reader(url)


def test_create_list_show_revoke(where: Where, capsys: pytest.CaptureFixture[str]) -> None:
    flags, reader = where
    code, out, _ = serving(
        capsys, "keys", "create", *flags, "--name", "team-a", "--rpm", "60",
        "--max-concurrency", "4", "--models", "m1, m2", "--model-limit", "m1:rpm=10",
    )  # fmt: skip
    assert code == 0
    (secret,) = SECRET.findall(out)
    key_id = "key_" + secret[3:11]
    store = reader()
    record = store.authenticate(secret)
    store.close()
    assert record is not None and record.key_id == key_id
    assert record.limits == Limits(rpm=60, max_concurrency=4)
    assert record.models == ("m1", "m2") and record.model_limits == {"m1": Limits(rpm=10)}

    code, out, _ = serving(capsys, "keys", "list", *flags)
    assert code == 0
    assert key_id in out and "team-a" in out and "active" in out and "m1,m2" in out
    assert not SECRET.search(out)

    code, out, _ = serving(capsys, "keys", "show", key_id, *flags)
    assert code == 0
    assert re.search(rf"^id:\s+{key_id}$", out, re.MULTILINE)
    assert re.search(r"limits for m1:\s+rpm=10", out)

    code, out, _ = serving(capsys, "keys", "revoke", key_id, *flags)
    assert (code, out) == (0, f"revoked {key_id} (team-a)\n")
    store = reader()
    assert store.authenticate(secret) is None
    store.close()
    assert "revoked" in serving(capsys, "keys", "list", *flags)[1]


def test_create_says_where_the_key_is_without_the_password(
    default_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = serving(
        capsys, "keys", "create", "--redis-url", default_namespace, "--name", "a"
    )
    port = urlsplit(default_namespace).port
    assert code == 0
    assert re.search(
        rf"^created key_[0-9a-f]{{8}} \(a\) in Redis at 127.0.0.1:{port}/0$", out, re.M
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["show", "key_00000000"], "KEY_ID 'key_00000000': no such key in"),
        (["revoke", "key_00000000"], "key id 'key_00000000': no such key in"),
        (["revoke", "team-a"], "KEY_ID 'team-a' is not a key id"),
        (["create", "--name", "a", "--rpm", "-5"], "--rpm must be a non-negative integer"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(
    where: Where, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    flags, _ = where
    code, out, err = serving(capsys, "keys", *argv, *flags)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("serving keys: error: ")
    assert message in err


def test_an_unreachable_redis_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()  # nothing listens there
    for action in (["list"], ["show", "key_00000000"], ["revoke", "key_00000000"]):
        argv = ["keys", *action, "--redis-url", f"redis://:hunter2@127.0.0.1:{port}/0"]
        code, out, err = serving(capsys, *argv)
        assert (code, out) == (2, "")
        assert err == (
            f"serving keys: error: --redis-url: Redis at 127.0.0.1:{port}/0 is unavailable "
            "(RedisConnectError: cannot connect to Redis (ConnectionRefusedError))\n"
        )


def test_a_wrong_password_or_a_bad_url_is_one_line_without_the_password(
    own_redis: RedisServer, capsys: pytest.CaptureFixture[str]
) -> None:
    password = str(urlsplit(own_redis.url).password)
    wrong = own_redis.url.replace(password, "hunter2")
    for url, message in (
        (wrong, "--redis-url: Redis at 127.0.0.1:"),
        ("redis://:hunter2", "--redis-url: not a valid Redis URL (expected redis://"),
        ("http://:hunter2@127.0.0.1:6379/0", "--redis-url: not a valid Redis URL"),
    ):
        code, out, err = serving(capsys, "keys", "create", "--name", "a", "--redis-url", url)
        assert (code, out) == (2, "")
        assert err.startswith("serving keys: error: " + message), err
        assert err.count("\n") == 1 and "hunter2" not in err
    assert "WRONGPASS" in serving(capsys, "keys", "list", "--redis-url", wrong)[2]


def test_store_and_redis_url_are_one_or_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["keys", "list", "--store", str(tmp_path / "k.db"), "--redis-url", "redis://x"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_the_sqlite_path_does_not_import_redis(tmp_path: Path) -> None:
    probe = (
        "import sys\nfrom serving import cli\n"
        f"cli.main(['keys', 'list', '--store', {str(tmp_path / 'k.db')!r}])\n"
        "print('redis' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines() == ["no keys", "False"]


def test_the_readme_redis_key_commands_work_as_printed(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """docs/scale-out.md's "Several gateways" block, run as printed with the reader's
    `REDIS_URL` pointing at a real redis-server (the block's `export` line is the reader's own)."""
    page = Path(__file__).resolve().parents[3] / "docs" / "scale-out.md"
    text = page.read_text(encoding="utf-8")
    section = text[text.index("## Several gateways") :]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block is not None
    lines = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    commands = [line for line in lines if line and not line.startswith("export ")]
    assert [c.split()[2] for c in commands] == ["create", "list"]
    repo = Path(__file__).resolve().parents[3]
    outputs = []
    for command in commands:
        done = subprocess.run(
            command, shell=True, cwd=repo, capture_output=True, text=True, timeout=60,
            env={**os.environ, "REDIS_URL": own_redis.url},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    (secret,) = SECRET.findall(outputs[0])
    store = redis_reader(own_redis.url)
    record = store.authenticate(secret)
    store.close()
    assert record is not None and record.name == "team-a" and record.limits.rpm == 60
    assert "team-a" in outputs[1] and secret not in outputs[1]
