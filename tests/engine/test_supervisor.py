"""Supervisor and process-group handling, against a small real HTTP server process."""

from __future__ import annotations

import http.server
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from serving.engine.process import EngineProcess, Stopped
from serving.engine.supervisor import RestartPolicy, Supervisor
from serving.errors import ServingError
from serving.vllm_flags import EngineCommand
from tests.ports import free_port

FAKE = str(Path(__file__).with_name("fake_engine.py"))


def fake_process(tmp_path: Path, port: int, *extra: str) -> EngineProcess:
    command = EngineCommand(argv=[sys.executable, FAKE, str(port), *extra])
    return EngineProcess(command, f"http://127.0.0.1:{port}", tmp_path / "engine.log")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_stop_leaves_no_worker_behind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    process = fake_process(tmp_path, free_port(), "--worker")
    process.start()
    process.wait_healthy(timeout=20)
    pgid = process.pid
    assert pgid is not None and group_alive(pgid)
    process.stop(grace=5)
    assert not group_alive(pgid)
    assert f"vLLM (PID {pgid}) and its workers stopped by SIGTERM in " in capsys.readouterr().err
    assert "listening" in (tmp_path / "engine.log").read_text()


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stops: list[Stopped] = []
    supervisor = Supervisor(
        make_process=lambda: fake_process(tmp_path, free_port(), "--ignore-term"),
        on_stopped=stops.append,
    )
    supervisor.start()
    process = supervisor.current
    assert process is not None and process.pid is not None
    pgid = process.pid
    stopped = process.stop(grace=1)
    assert stopped is not None and stopped.killed and stopped.seconds >= 1
    assert not group_alive(pgid)
    said = capsys.readouterr().err
    assert f"(PID {pgid}) and its workers stopped by SIGKILL after 1 s in " in said
    assert process.stop(grace=1) is None  # no longer running: nothing to say
    supervisor.stop()
    assert stops == []  # the supervisor reports the stops it made itself, once


def test_the_supervisor_reports_how_its_stop_went(tmp_path: Path) -> None:
    stops: list[Stopped] = []
    supervisor = Supervisor(
        make_process=lambda: fake_process(tmp_path, free_port()), on_stopped=stops.append
    )
    supervisor.start()
    supervisor.stop()
    assert len(stops) == 1 and not stops[0].killed


def test_a_health_answer_from_a_process_not_started_here_is_refused(tmp_path: Path) -> None:
    """An engine left on the port by an earlier start answers /health: the launcher must not
    take it for the vLLM it started (which is still loading, or failed to bind)."""

    class Healthy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    stale = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthy)
    threading.Thread(target=stale.serve_forever, daemon=True).start()
    try:
        port = stale.server_address[1]
        loading = EngineCommand(argv=[sys.executable, "-c", "import time; time.sleep(60)"])
        process = EngineProcess(loading, f"http://127.0.0.1:{port}", tmp_path / "engine.log")
        process.start()
        with pytest.raises(ServingError) as refused:
            process.wait_healthy(timeout=20)
        assert f"answered by PID {os.getpid()} (" in str(refused.value)
        assert process.exit_code() is not None  # and what it started was stopped
    finally:
        stale.shutdown()
        stale.server_close()


def test_exit_before_healthy_names_the_log(tmp_path: Path) -> None:
    command = EngineCommand(argv=[sys.executable, "-c", "print('bad flag'); raise SystemExit(2)"])
    process = EngineProcess(command, "http://127.0.0.1:9", tmp_path / "engine.log")
    process.start()
    with pytest.raises(ServingError, match="code 2") as excinfo:
        process.wait_healthy(timeout=20)
    assert "bad flag" in str(excinfo.value)
    assert str(tmp_path / "engine.log") in str(excinfo.value)


def test_crashed_engine_is_restarted(tmp_path: Path) -> None:
    port = free_port()
    events: list[str] = []
    supervisor = Supervisor(
        make_process=lambda: fake_process(tmp_path, port),
        policy=RestartPolicy(initial_backoff_s=0.1, start_timeout_s=20),
        on_event=events.append,
    )
    supervisor.start()
    first_pid = supervisor.current.pid if supervisor.current else None
    watcher = threading.Thread(target=supervisor.watch, kwargs={"poll_s": 0.1}, daemon=True)
    watcher.start()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/crash", timeout=5).close()
        deadline = time.monotonic() + 20
        while supervisor.restarts < 1 or not (supervisor.current and supervisor.current.healthy()):
            assert time.monotonic() < deadline, events
            time.sleep(0.1)
        assert supervisor.current is not None and supervisor.current.pid != first_pid
        assert any("code 3" in event for event in events)
    finally:
        supervisor.stop()
        watcher.join(timeout=10)
    assert not watcher.is_alive()


def test_crash_loop_gives_up_with_a_clear_message(tmp_path: Path) -> None:
    port = free_port()
    supervisor = Supervisor(
        make_process=lambda: fake_process(tmp_path, port, "--die-after", "1.5"),
        policy=RestartPolicy(initial_backoff_s=0.05, max_restarts=2, start_timeout_s=20),
        on_event=lambda _: None,
    )
    supervisor.start()
    try:
        with pytest.raises(ServingError, match="giving up"):
            supervisor.watch(poll_s=0.05)
    finally:
        supervisor.stop()
    assert supervisor.restarts == 2


def test_root_cause_prefers_the_exception_over_the_wrapper(tmp_path: Path) -> None:
    from serving.engine.process import root_cause

    log = tmp_path / "engine.log"
    log.write_text(
        "(EngineCore pid=1) INFO 11-29 10:56:40 [core.py:1] starting\n"
        "(EngineCore pid=1) ERROR 11-29 10:56:41 [core.py:1510]     raise RuntimeError(\n"
        "(EngineCore pid=1) ERROR 11-29 10:56:41 [core.py:1510] RuntimeError: FP8 needs AVX-512\n"
        "(EngineCore pid=1) ERROR 11-29 10:56:43 [executor.py:315] Worker proc died unexpectedly\n"
        "Traceback (most recent call last):\n"
        "RuntimeError: Engine core initialization failed. See root cause above.\n"
    )
    assert root_cause(log) == "RuntimeError: FP8 needs AVX-512"
    log.write_text("no errors here\n")
    assert root_cause(log) == ""


def test_stop_ends_what_the_server_ran_on_after_the_server(tmp_path: Path) -> None:
    """A Ray head the launcher started (`on_stop`) goes after vLLM, never before it."""
    port = free_port()
    events: list[str] = []
    process = fake_process(tmp_path, port)

    def gone() -> None:
        events.append("server gone" if process.exit_code() is not None else "server alive")

    supervisor = Supervisor(make_process=lambda: process, on_stop=gone)
    supervisor.start()
    supervisor.stop()
    assert events == ["server gone"]
