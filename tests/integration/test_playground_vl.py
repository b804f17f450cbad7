"""The playground sends an image to the vision model (the tiny Qwen2.5-VL, profile
`cpu-tiny-vl`) in headless Chromium, and the image shows in the prompt tokens it reports.

A stack of its own for this module: `serving up --profile cpu-tiny-vl`, started as a user
starts it and stopped with SIGINT, like the session's text stack.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest
from playwright.sync_api import Browser

from tests.integration.conftest import REPO, descendants, serving_env, wait_for
from tests.integration.playground_page import (
    attach_image,
    chromium,
    open_playground,
    png,
    send,
    stats,
)
from tests.ports import free_port

pytestmark = pytest.mark.timeout(1500)

PROFILE = "cpu-tiny-vl"
KEY = "sk-test-playground-vl-0123456789abcdef"


@pytest.fixture(scope="module")
def vl_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a gateway in front of the tiny vision model; its dev key is `KEY`."""
    assert (REPO / "serving" / "profiles" / f"{PROFILE}.yaml").exists(), f"no {PROFILE} profile"
    port, engine_port, launcher_port = free_port(), free_port(), free_port()
    workdir = tmp_path_factory.mktemp("vl-stack")
    output = workdir / "serving-up.out"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "up", "--profile", PROFILE,
             "--port", str(port), "--engine-port", str(engine_port),
             "--metrics-port", str(launcher_port), "--keys-db", str(workdir / "keys.db")],
            env=serving_env(SERVING_API_KEY=KEY), stdout=sink, stderr=subprocess.STDOUT,
            text=True, cwd=REPO,
        )  # fmt: skip
    try:
        # The first run builds the model and vLLM compiles nothing (eager): minutes at most.
        wait_for(f"http://127.0.0.1:{port}/healthz", process, output, timeout=900)
        wait_for(f"http://127.0.0.1:{engine_port}/health", process, output, timeout=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        children = descendants(process.pid)
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive, f"processes left behind by serving up: {alive}"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


def test_an_uploaded_image_is_answered_and_counted_in_the_prompt(
    vl_gateway: str, browser: Browser
) -> None:
    page, log = open_playground(browser, vl_gateway, KEY)
    assert page.eval_on_selector("#model", "select => select.options.length") == 1
    page.fill("#max-tokens", "64")
    question = "What colour is this picture?"
    text_only = send(page, question)
    assert text_only.get_attribute("data-state") == "done"
    without_image = stats(text_only)["promptTokens"]

    page.click("#new-chat")
    # 112 x 112 pixels: 4 x 4 merged 28-pixel patches, 16 image tokens in Qwen2.5-VL.
    attach_image(page, "red.png", "image/png", png(112, 112))
    page.wait_for_selector("#attachment:has-text('red.png attached')")
    with_image = send(page, question)
    assert with_image.get_attribute("data-state") == "done", with_image.text_content()
    assert with_image.locator(".content").text_content()  # an answer (noise: random weights)
    assert page.locator(".message.user img").count() == 1  # the picture shows in the chat
    assert stats(with_image)["promptTokens"] >= without_image + 16
    assert page.text_content("#attachment") == ""  # sent: no longer attached
    assert not log.csp_violations() and not log.errors, (log.console, log.errors)
