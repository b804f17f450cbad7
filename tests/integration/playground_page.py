"""Headless Debian Chromium driving the playground page, for the playground's tests.

    with chromium() as browser:
        page, log = open_playground(browser, stack.gateway_url, key)   # a fresh tab, connected
        answer = send(page, "Hello")        # the answer's element, finished
        stats(answer)                       # {"promptTokens": ..., ...} as the page shows them
        log.csp_violations()                # what the console said about the policy

Chromium is the system's (/usr/bin/chromium, `make system-deps`), launched through
playwright's driver with `executable_path`: nothing downloads a browser. Without the
background-networking flags Chromium's own connections get refused in this sandbox and
its requests to the gateway stall behind them.
"""

from __future__ import annotations

import json
import shutil
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from playwright.sync_api import (
    Browser,
    ConsoleMessage,
    FilePayload,
    Locator,
    Page,
    Request,
    Route,
    ViewportSize,
    sync_playwright,
)

from tests.services import require

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = ViewportSize(width=1200, height=800)
# Generous: on a busy 2-core machine vLLM's first answer can take many seconds.
WAIT_MS = 120_000
ANSWER_TIMEOUT_MS = 180_000


@contextmanager
def chromium() -> Iterator[Browser]:
    require("browser")
    # make test installs it (Makefile system-deps); its absence is a set-up failure.
    assert shutil.which(CHROMIUM), f"{CHROMIUM} is missing: run make system-deps"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class PageLog:
    """What the page did that the tests check afterwards."""

    console: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def csp_violations(self) -> list[str]:
        return [line for line in self.console if "Content Security Policy" in line]


def open_playground(browser: Browser, gateway_url: str, key: str) -> tuple[Page, PageLog]:
    """A fresh tab (its own session storage) on the playground, connected with `key`; the
    model list loaded, or the connect error shown."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    # Every wait (a page load, the model list, an answer starting) on a busy 2-core machine,
    # where vLLM's first token can take far longer than playwright's default 30 s.
    context.set_default_timeout(WAIT_MS)
    page = context.new_page()
    log = PageLog()

    def on_console(message: ConsoleMessage) -> None:
        log.console.append(f"{message.type}: {message.text}")

    page.on("console", on_console)
    page.on("pageerror", lambda error: log.errors.append(str(error)))

    def on_request(request: Request) -> None:
        log.requests.append(request)

    page.on("request", on_request)
    page.goto(f"{gateway_url}/playground")
    page.fill("#api-key", key)
    page.click("#connect")
    page.wait_for_function(
        "() => document.querySelector('#model').options.length > 0"
        " || !document.querySelector('#notice').hidden"
    )
    return page, log


def text(page: Page, selector: str) -> str:
    return page.text_content(selector) or ""


# Waits poll with functions (`() => ...`), never expression strings: playwright evaluates
# those with `eval` inside the page, which the page's CSP (no 'unsafe-eval') refuses, and the
# tests keep the CSP on (no bypass_csp) since it is part of what they check.


def last_answer(page: Page) -> Locator:
    return page.locator(".message.assistant").last


def start(page: Page, text: str) -> Locator:
    """Type `text` and press Send; the answer's element (it may still be streaming)."""
    before = page.locator(".message.assistant").count()
    page.fill("#prompt", text)
    page.click("#send")
    page.wait_for_function(
        "before => document.querySelectorAll('.message.assistant').length > before", arg=before
    )
    return last_answer(page)


def finished(answer: Locator) -> str:
    """The answer's final state (done, stopped or error), once it has one."""
    answer.page.wait_for_function(
        "element => ['done', 'stopped', 'error'].includes(element.dataset.state)",
        arg=answer.element_handle(),
        timeout=ANSWER_TIMEOUT_MS,
    )
    state = answer.get_attribute("data-state")
    assert state is not None
    return state


def send(page: Page, text: str) -> Locator:
    answer = start(page, text)
    finished(answer)
    return answer


def stats(answer: Locator) -> dict[str, int]:
    """The token counts the page shows under a finished answer (from the API's usage)."""
    values = answer.locator(".stats").evaluate("element => ({...element.dataset})")
    return {name: int(value) for name, value in values.items()}


def answer_at_length(page: Page) -> None:
    """Make the page's chat requests ask vLLM for `min_tokens` = `max_tokens`.

    The tiny model ends its answers after 10 to 30 tokens; held off its stop tokens it writes
    all `max_tokens`, so a stream lasts long enough to watch and to stop. Only the request
    leaving the page changes (the response streams to it untouched)."""

    def at_length(route: Route) -> None:
        body = json.loads(route.request.post_data or "{}")
        body["min_tokens"] = body["max_tokens"]
        route.continue_(post_data=json.dumps(body))

    page.route("**/v1/chat/completions", at_length)


def attach_image(page: Page, name: str, mime_type: str, data: bytes) -> None:
    page.set_input_files("#image", files=FilePayload(name=name, mimeType=mime_type, buffer=data))


def png(width: int, height: int, rgb: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    """A solid-colour PNG, built here (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    row = b"\x00" + bytes(rgb) * width  # filter type 0, then the pixels
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )
