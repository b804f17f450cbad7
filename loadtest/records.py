"""One line per finished request, written by each Locust process, read by the report.

Locust's own statistics keep histograms rounded to a few significant digits and lose time;
these records keep every request's timings so percentiles over time and the cross-check
with vLLM's benchmark are computed exactly. Each process appends to its own file
(`records-<pid>.jsonl`), line-buffered, so a crashed worker loses at most one line.

Usage: `with RecordWriter(dir) as w: w.write(record)`; `records = read_records(dir)`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import TextIO

from loadtest.sse import StreamResult


@dataclass(frozen=True)
class RequestRecord:
    start: float  # wall clock (time.time()), comparable across processes and the scraper
    scenario: str
    ok: bool
    error: str | None
    status: int
    ttft_s: float | None
    e2e_s: float | None
    itl_s: list[float]
    prompt_tokens: int
    output_tokens: int
    # Sent again after a kept-alive connection closed under it unread (loadtest.user).
    resends: int = 0

    @property
    def end(self) -> float:
        return self.start + (self.e2e_s or 0.0)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @classmethod
    def of(
        cls,
        start: float,
        scenario: str,
        status: int,
        result: StreamResult,
        error: str | None,
        *,
        resends: int = 0,
    ) -> RequestRecord:
        """`error` overrides the stream's verdict (a non-200 has no stream to judge)."""
        return cls(
            start=start,
            scenario=scenario,
            ok=error is None,
            error=error,
            status=status,
            ttft_s=result.ttft_s,
            e2e_s=result.e2e_s,
            itl_s=[round(gap, 6) for gap in result.itl_s],
            prompt_tokens=result.prompt_tokens,
            output_tokens=result.output_tokens,
            resends=resends,
        )


class RecordWriter:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._sink: TextIO = (directory / f"records-{os.getpid()}.jsonl").open(
            "a", encoding="utf-8", buffering=1
        )

    def write(self, record: RequestRecord) -> None:
        self._sink.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._sink.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def read_records(directory: Path) -> list[RequestRecord]:
    """All records of a run, in start order; a torn last line (killed process) is skipped."""
    records: list[RequestRecord] = []
    for path in sorted(directory.glob("records-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                records.append(RequestRecord(**json.loads(line)))
            except (ValueError, TypeError):
                continue
    records.sort(key=lambda r: r.start)
    return records
