"""The playground sends an image to the vision model (the tiny Qwen2.5-VL, profile
`cpu-tiny-vl`) in headless Chromium, and the image shows in the prompt tokens it reports.

The stack is the package's (conftest.py): `serving up --profile cpu-tiny-vl`, started as a
user starts it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser

from tests.integration.conftest import Stack
from tests.integration.playground_page import (
    attach_image,
    chromium,
    open_playground,
    png,
    send,
    stats,
)

pytestmark = [pytest.mark.timeout(1500), pytest.mark.browser]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


def test_an_uploaded_image_is_answered_and_counted_in_the_prompt(
    vl_stack: Stack, browser: Browser
) -> None:
    page, log = open_playground(browser, vl_stack.gateway_url, vl_stack.api_key)
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
