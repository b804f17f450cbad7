"""Model directories built here and cached: a fingerprint in build-info.json marks a current build.

Builds go to a temp dir beside the target and are renamed into place, so an interrupted build
never leaves half a model; one builder per target across processes (a file lock); a target
that is not an earlier build (say `--out ~`) is never replaced.

Usage:
    path = cached_build(target, fingerprint, build, name="qwen3-tiny", progress=Progress())
where `build(partial_dir)` writes every file but build-info.json and returns the fields to
record in it; a build that trains runs in a fresh interpreter:
    record = run_child_build("serving.models.tiny_model", [out, params_json], num_threads=2,
                             name="qwen3-tiny", progress=progress)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import serving
from serving.errors import ServingError

BUILD_INFO = "build-info.json"


class Progress:
    """Build status on stderr: one line rewritten in place on a terminal, plain lines in logs.

    Usage: `Progress()`; `Progress(quiet=True)` for callers that print their own summary.
    """

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._quiet = quiet
        self._tty = self._stream.isatty()
        self._open = False  # an unfinished status line is on screen

    def status(self, text: str, *, log: bool = True) -> None:
        """Replace the status line; without a terminal write it as a line only when `log`."""
        if self._quiet:
            return
        if self._tty:
            self._stream.write(f"\r{text}\x1b[K")
            self._open = True
        elif log:
            self._stream.write(text + "\n")
        self._stream.flush()

    def line(self, text: str) -> None:
        """A line that stays, ending any status line."""
        if self._quiet:
            return
        self._stream.write(("\r\x1b[K" if self._open else "") + text + "\n")
        self._open = False
        self._stream.flush()


def inputs_fingerprint(builder_version: str, params: Mapping[str, Any], files: list[Path]) -> str:
    """The fingerprint of a build's inputs: its builder version, parameters and files."""
    digest = hashlib.sha256()
    digest.update(f"builder={builder_version}\n".encode())
    digest.update(json.dumps(params, sort_keys=True).encode())
    for path in files:
        digest.update(f"\n{path.name}\n".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_record(
    builder_version: str, name: str, params: Mapping[str, Any], corpus: list[Path]
) -> dict[str, Any]:
    """The fields every build of ours records in build-info.json besides its own."""
    return {
        "builder_version": builder_version,
        "corpus_sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in corpus},
        "model": name,
        "params": dict(params),
    }


def read_build_info(model_dir: Path) -> dict[str, Any] | None:
    """The build record of a finished build, or None when there is none (or it is unreadable)."""
    try:
        info = json.loads((model_dir / BUILD_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Sorted keys and a trailing newline: the same data always gives the same bytes."""
    path.write_text(
        json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def cached_build(
    target: Path,
    fingerprint: str,
    build: Callable[[Path], dict[str, Any]],
    *,
    name: str,
    progress: Progress,
    force: bool = False,
) -> Path:
    """Return target, building it first unless it holds a build with this fingerprint."""
    target = target.expanduser().resolve()
    if not force and _is_current(target, fingerprint):
        progress.line(f"{name}: cached in {target}")
        return target
    _check_replaceable(target)
    with _build_lock(target):
        # Another process may have finished the same build while we waited for the lock.
        if not force and _is_current(target, fingerprint):
            progress.line(f"{name}: cached in {target}")
            return target
        for leftover in target.parent.glob(f".{target.name}.*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)  # of killed builds: we hold the lock
        partial = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        )
        started = time.monotonic()
        try:
            record = build(partial)
            # Last: build-info marks a complete build.
            write_json(partial / BUILD_INFO, {"fingerprint": fingerprint, **record})
            _swap_into_place(partial, target)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        progress.line(f"{name}: built in {time.monotonic() - started:.1f}s: {target}")
    return target


def _is_current(target: Path, fingerprint: str) -> bool:
    info = read_build_info(target)
    return info is not None and info.get("fingerprint") == fingerprint


def _check_replaceable(target: Path) -> None:
    """Refuse to replace a dir that is not an earlier build: `--out ~` must not wipe home."""
    if target.exists() and not target.is_dir():
        raise ServingError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and read_build_info(target) is None:
        raise ServingError(f"{target} is not empty and holds no {BUILD_INFO}; choose another dir")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ServingError(f"cannot create {target.parent}: {exc.strerror}") from exc


@contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """One builder per target across processes (`serving up` twice, tests in parallel)."""
    try:
        handle = (target.parent / f".{target.name}.lock").open("a")
    except OSError as exc:
        raise ServingError(f"cannot write in {target.parent}: {exc.strerror}") from exc
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the handle closes
        yield


def _swap_into_place(partial: Path, target: Path) -> None:
    """Rename the finished build onto the target: readers never see a half-written model."""
    # mkdtemp (and safetensors' own temp file) made these private; vLLM may run as another user.
    partial.chmod(0o755)
    for path in partial.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    if not target.exists():
        partial.rename(target)
        return
    retired = target.parent / f".{target.name}.{os.getpid()}.retired.partial"
    target.rename(retired)
    partial.rename(target)
    shutil.rmtree(retired, ignore_errors=True)


def run_child_build(
    module: str, args: list[str], *, num_threads: int, name: str, progress: Progress
) -> dict[str, Any]:
    """Run `module.build_main(args)` in a fresh interpreter, relay its progress, return its
    record (the child prints `status TEXT`, `log TEXT` and one `result JSON` line).

    A fresh process starts from the same torch state on every build (so the same bytes),
    whatever the caller did to torch, and can set OpenMP to sleep instead of spin while it
    waits: on a busy 2-core machine spinning threads made training ten times slower.
    """
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(num_threads),
        OMP_WAIT_POLICY="PASSIVE",
        PYTHONIOENCODING="utf-8",
        TOKENIZERS_PARALLELISM="false",
    )
    # Appended, not prepended: finds this checkout when it is not installed, shadows nothing.
    code = (
        "import sys, importlib; sys.path.append(sys.argv[1]); "
        "importlib.import_module(sys.argv[2]).build_main(sys.argv[3:])"
    )
    package_root = str(Path(serving.__file__).resolve().parent.parent)
    command = [sys.executable, "-c", code, package_root, module, *args]
    record: dict[str, Any] | None = None
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, text=True, encoding="utf-8"
    ) as child:
        assert child.stdout is not None
        try:
            for message in child.stdout:
                kind, _, text = message.rstrip("\n").partition(" ")
                if kind == "result":
                    record = json.loads(text)
                else:
                    progress.status(text, log=kind == "log")
        except BaseException:
            child.kill()
            raise
    if child.returncode != 0 or record is None:
        raise ServingError(f"building {name} failed (exit {child.returncode}); see above")
    return record


def child_emit(text: str, log: bool) -> None:
    """The child's side of run_child_build: a status line (kept in logs when `log`)."""
    print("log" if log else "status", text, flush=True)


def child_result(record: Mapping[str, Any]) -> None:
    """The child's side of run_child_build: its record, last."""
    print("result", json.dumps(record), flush=True)
