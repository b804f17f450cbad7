"""Where the gateway's time goes: py-spy samples of the running process under load.

    report = await profile_process(pid, seconds=6, load=drive_load, workdir=tmp)

py-spy samples the live process from outside (no instrumentation, `--nonblocking`, idle
samples left out), so the profile shows the gateway exactly as measured. Samples are
summarised by package of the innermost Python frame (where CPU is spent), by function
(self), by gateway module (self), and, for the gateway's own functions, including their
callees (inclusive).
Time spent in C below the event loop (socket I/O, uvloop, httptools) shows as its innermost
Python frame, the loop's `run` call.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NotRequired, TypedDict

TOP = 12
RATE_HZ = 250
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
# First matching fragment of the file path names the area.
AREAS = (
    # The quota store's own Redis client, apart from the rest of the gateway's code.
    ("serving/gateway/quota/redis_c", "Redis client (serving/gateway/quota/redis_c*)"),
    ("serving/gateway/", "gateway code (serving/gateway)"),
    ("serving/", "serving (other)"),
    ("aiohttp/", "aiohttp (upstream client)"),
    ("yarl/", "yarl (URLs)"),
    ("multidict/", "multidict (headers)"),
    ("uvicorn/", "uvicorn (HTTP server)"),
    ("prometheus_client/", "prometheus_client (metrics)"),
    ("sqlite3/", "sqlite3 (key store)"),
    ("redis/", "redis-py"),
    ("json/", "json"),
    ("logging/", "logging"),
    ("asyncio/runners.py", "event loop + C I/O (uvloop, httptools)"),
    ("asyncio/", "asyncio"),
)


class Share(TypedDict):
    name: str
    share: float


class ProfileSummary(TypedDict):
    samples: NotRequired[int]
    by_area: NotRequired[list[Share]]
    self: NotRequired[list[Share]]
    gateway_files: NotRequired[list[Share]]
    inclusive: NotRequired[list[Share]]
    tool: NotRequired[str]
    skipped: NotRequired[str]
    """Why there is no profile."""


def find_py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def area_of(file: str) -> str:
    for fragment, area in AREAS:
        if fragment in file:
            return area
    return "other"


def summarise(raw: str) -> ProfileSummary:
    """Shares of the samples by area, by function (self) and by function (inclusive)."""
    by_area: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    gateway_files: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_parse(frame) for frame in stack.split(";")]
        if not frames:
            continue
        total += count
        func, file = frames[-1]
        by_area[area_of(file)] += count
        self_time[f"{func} ({file})"] += count
        if _is_gateway(file):
            gateway_files[file] += count
        for name in {f"{func} ({file})" for func, file in _below_loop(frames) if _is_gateway(file)}:
            inclusive[name] += count

    def shares(counter: Counter[str], top: int) -> list[Share]:
        return [
            {"name": name, "share": round(count / total, 4)}
            for name, count in counter.most_common(top)
        ]

    return {
        "samples": total,
        "by_area": shares(by_area, len(by_area)),
        "self": shares(self_time, TOP),
        "gateway_files": shares(gateway_files, TOP),
        "inclusive": shares(inclusive, TOP),
    }


def _is_gateway(file: str) -> bool:
    return "serving/gateway/" in file


def _below_loop(frames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The frames the event loop called (request handling), not those that started it."""
    cut = -1
    for index, (func, file) in enumerate(frames):
        if file.endswith("asyncio/runners.py") or func in ("run_forever", "run_until_complete"):
            cut = index
    return frames[cut + 1 :]


def _parse(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip(), ""
    return match["func"], match["file"]


async def profile_process(
    pid: int,
    *,
    seconds: float,
    load: Callable[[], Awaitable[object]],
    workdir: Path,
    name: str = "gateway",
) -> ProfileSummary:
    """Sample `pid` (the process `name`) with py-spy for `seconds` while `load()` runs."""
    py_spy = find_py_spy()
    if py_spy is None:
        return {"skipped": "py-spy not found: install it (pip install py-spy) to get a profile"}
    output = workdir / f"{name}-profile.txt"
    command = [
        py_spy,
        *("record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))),
        *("--rate", str(RATE_HZ), "--format", "raw", "--nonblocking", "-o", str(output)),
    ]
    proc = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    await asyncio.sleep(0.5)  # py-spy attaches before the load starts
    await load()
    stdout, _ = await asyncio.wait_for(proc.communicate(), timeout=seconds + 30)
    if proc.returncode != 0 or not output.exists():
        message = stdout.decode(errors="replace").strip().splitlines()[-3:]
        return {"skipped": f"py-spy failed ({proc.returncode}): {' | '.join(message)}"}
    summary = summarise(output.read_text(errors="replace"))
    summary["tool"] = f"py-spy record --rate {RATE_HZ} --nonblocking (idle samples excluded)"
    return summary
