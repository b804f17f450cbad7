"""The client side of the scale-out tests: a stopwatch that leaves scheduler stalls out,
held SSE streams, a steady load of short requests and a burst of concurrent ones
(re-exported by `scale_out`)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
import openai

from tests.integration.conftest import MODEL, eventually

if TYPE_CHECKING:
    from tests.integration.scale_out import Gateway

T = TypeVar("T")

# A short chat request: the steady load's, and what a test sends to check a gateway answers.
SHORT: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about the weather."}],
    "max_tokens": 4,
}


class Stopwatch:
    """Wall time less this process's scheduling stalls.

    On this shared 2-core machine every process is sometimes not scheduled for seconds (see
    `eventually`). A ticker thread notices each stall (a tick that overslept by over a
    second) and `measure` leaves those out, so a bound checks the system's own delay.
    """

    TICK_S = 0.05

    def __init__(self) -> None:
        self._stalled = 0.0
        self._lock = threading.Lock()
        threading.Thread(target=self._tick, name="stopwatch", daemon=True).start()

    def _tick(self) -> None:
        last = time.monotonic()
        while True:
            time.sleep(self.TICK_S)
            now = time.monotonic()
            if now - last > self.TICK_S + 1.0:
                with self._lock:
                    self._stalled += now - last - self.TICK_S
            last = now

    def stalled(self) -> float:
        with self._lock:
            return self._stalled

    def measure(self, call: Callable[[], T]) -> tuple[T, float]:
        """`call()` and the seconds it took, stalls left out."""
        started, stalled = time.monotonic(), self.stalled()
        result = call()
        return result, time.monotonic() - started - (self.stalled() - stalled)


_STOPWATCH: list[Stopwatch] = []


def stopwatch() -> Stopwatch:
    if not _STOPWATCH:
        _STOPWATCH.append(Stopwatch())
    return _STOPWATCH[0]


# -- clients ----------------------------------------------------------------------------


@dataclass
class SseStream:
    """A chat stream read raw in a thread of its own: every SSE `data:` payload as it came.

    `then` runs in the reader's thread as soon as `after` events arrived, before anything
    else can get in the way (e.g. `EngineControl.freeze`, to hold the stream mid-way).
    `stop()` makes the reader leave after its next event: its client goes away."""

    url: str
    secret: str
    body: dict[str, Any]
    then: Callable[[], None] | None = None
    after: int = 3
    status: int | None = None
    events: list[str] = field(default_factory=list)
    failure: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> SseStream:
        threading.Thread(target=self._read, name="sse-stream", daemon=True).start()
        return self

    def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self.secret}"}
        try:
            with (
                httpx.Client(timeout=120) as http,
                http.stream("POST", f"{self.url}/v1/chat/completions", json=self.body,
                            headers=headers) as response,
            ):  # fmt: skip
                self.status = response.status_code
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line.removeprefix("data: "))
                        if self.then is not None and len(self.events) == self.after:
                            self.then()
                    if self._stop.is_set():
                        return
        except httpx.HTTPError as exc:
            self.failure = exc
        finally:
            self.done.set()

    def stop(self) -> None:
        self._stop.set()

    @property
    def chunks(self) -> list[dict[str, Any]]:
        """The chat chunks received (not `[DONE]`, not an error event)."""
        parsed = [json.loads(event) for event in self.events if event != "[DONE]"]
        return [chunk for chunk in parsed if "error" not in chunk]

    @property
    def error(self) -> dict[str, Any] | None:
        """The in-band error event, if the stream ended with one."""
        if not self.events or self.events[-1] == "[DONE]":
            return None
        last: dict[str, Any] = json.loads(self.events[-1])
        return last if "error" in last else None

    def wait_events(self, count: int, budget_s: float = 60) -> None:
        eventually(lambda: len(self.events) >= count or self.done.is_set(), budget_s)
        assert len(self.events) >= count, (
            f"stream ended after {len(self.events)} events (status {self.status}, "
            f"failure {self.failure!r}): {self.events[-2:]}"
        )


@dataclass(frozen=True)
class Outcome:
    """One request of a `Load`: when it started, how long it took (stalls left out), and
    what came back (status 0: no response at all)."""

    started: float
    seconds: float
    status: int
    retry_after: str | None
    code: str | None


@dataclass
class Load:
    """Short chat requests sent one after another through a gateway, from a thread
    (`start` ... `stop`, or as a context manager)."""

    gateway: Gateway
    secret: str
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(180)

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        clock = stopwatch()
        with httpx.Client(timeout=120) as http:
            while not self._stop.is_set():
                started = time.monotonic()
                response, seconds = clock.measure(lambda: self._send(http))
                if response is None:
                    self.outcomes.append(Outcome(started, seconds, 0, None, None))
                    continue
                code = None
                if response.status_code >= 400:
                    code = response.json().get("error", {}).get("code")
                retry_after = response.headers.get("retry-after")
                self.outcomes.append(
                    Outcome(started, seconds, response.status_code, retry_after, code)
                )

    def _send(self, http: httpx.Client) -> httpx.Response | None:
        try:
            return http.post(
                f"{self.gateway.url}/v1/chat/completions",
                json=SHORT,
                headers={"Authorization": f"Bearer {self.secret}"},
            )
        except httpx.HTTPError:
            return None

    def since(self, moment: float) -> list[Outcome]:
        return [outcome for outcome in list(self.outcomes) if outcome.started >= moment]

    def wait_for_requests(self, count: int, after: float, budget_s: float = 60) -> None:
        eventually(lambda: len(self.since(after)) >= count, budget_s)


def burst(
    replicas: list[Gateway], secret: str, per_replica: int, body: dict[str, Any]
) -> Counter[int]:
    """`per_replica` requests on every replica, all at once (a thread each, the official
    client); their statuses. A stream admitted is closed once all have answered."""
    stream = bool(body.get("stream"))
    extra = {"ignore_eos": True} if body.get("ignore_eos") else {}

    def one(replica: Gateway) -> int | openai.Stream[Any]:
        try:
            reply: Any = replica.client(secret).chat.completions.create(
                model=body["model"], messages=body["messages"], max_tokens=body["max_tokens"],
                stream=stream, extra_body=extra,
            )  # fmt: skip
        except openai.APIStatusError as exc:
            return exc.status_code
        return reply if isinstance(reply, openai.Stream) else 200

    targets = [replica for replica in replicas for _ in range(per_replica)]
    with ThreadPoolExecutor(max_workers=len(targets)) as pool:
        outcomes = list(pool.map(one, targets))
    statuses: Counter[int] = Counter()
    for outcome in outcomes:
        if isinstance(outcome, openai.Stream):
            outcome.close()
            outcome = 200
        statuses[outcome] += 1
    return statuses


# -- the topology -----------------------------------------------------------------------
