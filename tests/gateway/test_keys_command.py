"""`serving keys ...` end to end through `serving.cli.main`, with a temporary store."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from serving import cli
from serving.gateway.command import settings_from_args
from serving.gateway.keys import FileKeyStore, SqliteKeyStore
from serving.gateway.quota import Limits
from serving.paths import keys_db_path

SECRET = re.compile(r"sk-[0-9a-f]{8}-[A-Za-z0-9]{40}")


def serving(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_create_list_show_revoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = str(tmp_path / "keys.db")
    code, out, _ = serving(
        capsys,
        "keys", "create", "--store", store, "--name", "team-a",
        "--rpm", "60", "--tpm", "20000", "--tokens-per-day", "100000",
        "--tokens-per-month", "2000000", "--max-concurrency", "4", "--max-tokens", "512",
        "--models", "m1, m2", "--model-limit", "m1:rpm=10,max-tokens=64", "--weight", "3",
        "--default-adapter", "m2", "--priority", "-3",
    )  # fmt: skip
    assert code == 0
    secrets = SECRET.findall(out)
    assert len(secrets) == 1
    key_id = "key_" + secrets[0][3:11]
    assert key_id in out

    record = SqliteKeyStore(Path(store)).authenticate(secrets[0])
    assert record is not None and record.key_id == key_id
    assert record.limits == Limits(
        rpm=60,
        tpm=20_000,
        tokens_per_day=100_000,
        tokens_per_month=2_000_000,
        max_concurrency=4,
        max_tokens=512,
    )
    assert record.models == ("m1", "m2")
    assert record.model_limits == {"m1": Limits(rpm=10, max_tokens=64)}
    assert record.weight == 3
    assert record.default_adapter == "m2"
    assert record.priority == -3

    code, out, _ = serving(capsys, "keys", "list", "--store", store)
    assert code == 0
    assert key_id in out and "team-a" in out and "active" in out and "m1,m2" in out
    assert not SECRET.search(out)

    code, out, _ = serving(capsys, "keys", "show", key_id, "--store", store)
    assert code == 0
    assert re.search(rf"^id:\s+{key_id}$", out, re.MULTILINE)
    assert re.search(r"max_concurrency:\s+4", out)
    assert re.search(r"limits for m1:\s+rpm=10, max_tokens=64", out)
    assert re.search(r"^weight:\s+3$", out, re.MULTILINE)
    assert re.search(r"^default adapter:\s+m2$", out, re.MULTILINE)
    assert re.search(r"^priority:\s+-3$", out, re.MULTILINE)
    assert not SECRET.search(out)

    code, out, _ = serving(capsys, "keys", "revoke", key_id, "--store", store)
    assert code == 0
    assert f"revoked {key_id}" in out
    assert SqliteKeyStore(Path(store)).authenticate(secrets[0]) is None
    _, out, _ = serving(capsys, "keys", "list", "--store", store)
    assert "revoked" in out


def test_list_of_an_empty_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert serving(capsys, "keys", "list", "--store", str(tmp_path / "k.db")) == (
        0,
        "no keys\n",
        "",
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["create", "--name", "a", "--rpm", "-5"],
            "--rpm must be a non-negative integer, got '-5'",
        ),
        (["create", "--name", "a", "--tpm", "1.5"], "--tpm must be a non-negative integer"),
        (["create", "--name", "a", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["create", "--name", ""], "--name must be a non-empty string"),
        (["create", "--name", "a", "--model-limit", "m1"], "--model-limit 'm1': expected MODEL:"),
        (
            ["create", "--name", "a", "--model-limit", "m1:rps=3"],
            "--model-limit m1: unknown limit 'rps'",
        ),
        (
            ["create", "--name", "a", "--models", "m2", "--model-limit", "m1:rpm=3"],
            "--model-limit: model 'm1' is not in the key's models",
        ),
        (["create", "--name", "a", "--weight", "0"], "--weight must be an integer from 1 to 1000"),
        (["create", "--name", "a", "--priority", "101"], "--priority must be an integer from -100"),
        (
            ["create", "--name", "a", "--models", "m1", "--default-adapter", "m2"],
            "--default-adapter: 'm2' is not in the key's models",
        ),
        (["show", "key_00000000"], "KEY_ID 'key_00000000': no such key in"),
        (["revoke", "key_00000000"], "no such key"),
        (["revoke", "team-a"], "KEY_ID 'team-a' is not a key id"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = serving(capsys, "keys", *argv, "--store", str(tmp_path / "keys.db"))
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("serving keys: error: ")
    assert message in err


def test_emit_yaml_prints_a_keys_file_entry_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "keys.db"
    code, out, err = serving(
        capsys,
        "keys",
        "create",
        "--store",
        str(store),
        "--name",
        "k8s",
        "--rpm",
        "5",
        "--weight",
        "2",
        "--default-adapter",
        "team-a",
        "--emit-yaml",
    )
    assert code == 0
    assert not store.exists()
    assert not SECRET.search(out)  # stdout is the file content: hash only
    (secret,) = SECRET.findall(err)
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(out)
    # Appending more entries keeps the file valid (one YAML document per entry).
    for name in ("second", "third"):
        _, more, _ = serving(capsys, "keys", "create", "--name", name, "--emit-yaml")
        with keys_file.open("a") as handle:
            handle.write(more)
    loaded = FileKeyStore(keys_file)
    record = loaded.authenticate(secret)
    assert record is not None and record.name == "k8s" and record.limits == Limits(rpm=5)
    assert record.weight == 2 and "weight: 2" in out
    assert record.default_adapter == "team-a" and "default_adapter: team-a" in out
    assert sorted(r.name for r in loaded.list_keys()) == ["k8s", "second", "third"]


def test_default_store_is_in_serving_home(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVING_HOME", str(tmp_path / "home"))
    code, _, _ = serving(capsys, "keys", "create", "--name", "a")
    assert code == 0
    assert len(SqliteKeyStore(tmp_path / "home" / "keys.db").list_keys()) == 1


def test_importing_the_command_stays_light() -> None:
    probe = (
        "import sys, serving.gateway.keys_command\n"
        "print(sorted(m for m in ('yaml', 'sqlite3', 'serving.gateway.keys') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


def test_keys_and_the_gateway_share_one_default_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's `serving keys create` writes the file `serving gateway`/`serving up` read."""
    monkeypatch.delenv("SERVING_GATEWAY_KEYS_DB", raising=False)
    monkeypatch.delenv("SERVING_GATEWAY_KEYS_FILE", raising=False)
    monkeypatch.setenv("SERVING_HOME", str(tmp_path / "home"))
    code, out, _ = serving(capsys, "keys", "create", "--name", "a")
    assert code == 0
    written = re.search(r"^created key_[0-9a-f]{8} \(a\) in (\S+)$", out, re.MULTILINE)
    assert written is not None, out
    args = cli.build_parser().parse_args(["gateway", "--upstream", "http://127.0.0.1:1"])
    assert written.group(1) == str(keys_db_path()) == settings_from_args(args).keys_db
