"""The playground page in headless Chromium against the real gateway and vLLM (tiny model).

One browser for the module, one tab per test, the session's stack. The page is driven as a
user drives it (paste a key, type, click); what it shows is held against what the API
answered and what vLLM reports (its running requests on /metrics).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Locator, Page

from serving.paths import logs_dir
from tests.integration.conftest import MODEL, REPO, Stack, eventually
from tests.integration.playground_page import (
    ANSWER_TIMEOUT_MS,
    PageLog,
    answer_at_length,
    attach_image,
    chromium,
    finished,
    open_playground,
    png,
    send,
    start,
    stats,
    text,
)
from tests.integration.test_disconnect import running_requests
from tests.integration.test_gateway_quota import create_key

pytestmark = [pytest.mark.timeout(900), pytest.mark.browser]

# docs/playground.md's picture; the test writes it only when asked
# (SERVING_UPDATE_SCREENSHOTS=1), so that a test run leaves the checkout as it was (its numbers
# differ every run).
SCREENSHOT = REPO / "docs" / "images" / "playground.png"
CHAT = "**/v1/chat/completions"
# Counts each time the text of the last answer changes, with the answer's state then.
WATCH_UPDATES = """() => {
  window.updates = [];
  new MutationObserver(() => {
    const answer = [...document.querySelectorAll('.message.assistant')].pop();
    if (answer) {
      const length = answer.querySelector('.content').textContent.length;
      window.updates.push([answer.dataset.state, length]);
    }
  }).observe(document.querySelector('#messages'),
             {subtree: true, childList: true, characterData: true});
}"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as browser:
        yield browser


def test_a_conversation_streams_with_stats_quota_and_export(stack: Stack, browser: Browser) -> None:
    _, secret = create_key(stack, "playground", "--rpm", "100", "--tpm", "100000")
    page, log = open_playground(browser, stack.gateway_url, secret)
    assert page.eval_on_selector("#model", "select => select.value") == MODEL
    # /v1/models answered with the key's state
    assert "100/100 requests" in text(page, "#quota")
    page.fill("#system", "You are a helpful assistant.")
    page.fill("#max-tokens", "64")
    # Every answer at exactly max_tokens: sampled at the page's temperature, the tiny model
    # sometimes ends its first answer at once (EOS first, as CI saw), and an empty answer
    # would show nothing of the stream this test watches.
    answer_at_length(page)
    first = send(page, "Hello! What can you do?")
    assert first.get_attribute("data-state") == "done"
    assert first.locator(".content").text_content()
    assert stats(first)["completionTokens"] == 64

    # An answer of exactly max_tokens, with the history and the sampling controls.
    page.fill("#max-tokens", "200")
    with page.expect_request(CHAT) as sent, page.expect_response(CHAT) as answered:
        second = send(page, "Tell me a long story.")
    assert second.get_attribute("data-state") == "done"
    body = json.loads(sent.value.post_data or "{}")
    assert [message["role"] for message in body["messages"]] == [
        "system", "user", "assistant", "user"
    ]  # fmt: skip
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 200 and body["top_k"] == 50
    # Stats from the usage event, quota from the response headers.
    counts = stats(second)
    assert counts["completionTokens"] == 200 and counts["promptTokens"] > 0
    assert counts["totalTokens"] == counts["promptTokens"] + counts["completionTokens"]
    shown = second.locator(".stats").text_content() or ""
    assert "TTFT" in shown and "tokens/s" in shown
    headers = answered.value.headers
    remaining = headers["x-ratelimit-remaining-tokens"]
    assert f"{remaining}/100000 tokens" in text(page, "#quota")
    reset = headers["x-ratelimit-reset-tokens"]
    assert f"tokens: all back in {reset}" in (page.get_attribute("#quota", "title") or "")

    shot = page.screenshot()
    assert shot.startswith(b"\x89PNG") and len(shot) > 10_000
    if os.environ.get("SERVING_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOT.write_bytes(shot)

    # A long answer (seconds of decoding): the export holds it (that it streams in many
    # pieces is the next test's).
    page.fill("#max-tokens", "1000")
    third = send(page, "Go on.")
    assert third.get_attribute("data-state") == "done"

    with page.expect_download() as download:
        page.click("#export")
    exported = Path(download.value.path()).read_text()
    conversation = json.loads(exported)
    assert conversation["model"] == MODEL
    assert conversation["system"] == "You are a helpful assistant."
    assert [message["role"] for message in conversation["messages"]] == ["user", "assistant"] * 3
    assert conversation["messages"][3]["stats"]["completion_tokens"] == 200
    assert conversation["messages"][5]["content"] == third.locator(".content").text_content()

    # The key: sent as a header to the API only, never in a URL, an export or a log.
    api_calls = [request for request in log.requests if "/v1/" in request.url]
    assert len(api_calls) >= 3
    assert all(request.headers["authorization"] == f"Bearer {secret}" for request in api_calls)
    assert not [request for request in log.requests if secret in request.url]
    assert secret not in exported and secret not in page.url
    assert secret not in stack.output.read_text()
    gateway_log = logs_dir() / "gateway.log"
    assert secret not in (gateway_log.read_text() if gateway_log.exists() else "")
    # Kept for this tab only: a reload reconnects with it, the conversation is gone.
    assert page.evaluate("() => localStorage.length") == 0
    assert page.evaluate("() => sessionStorage.getItem('playground.apiKey')") == secret
    assert page.context.cookies() == []
    page.reload()
    page.wait_for_function("() => document.querySelector('#model').options.length > 0")
    assert page.locator(".message").count() == 0
    assert not log.csp_violations() and not log.errors, (log.console, log.errors)


def test_a_long_answer_is_shown_in_many_pieces(stack: Stack, browser: Browser) -> None:
    """1,000 tokens (seconds of decoding) shown as they stream: the page's text grows through
    at least two lengths before the last. Asked again in a fresh tab (up to three) when the
    answer came in fewer pieces: on a stalled 2-core machine vLLM's API server falls behind
    its engine and merges what it has into one chunk (CI saw a whole answer arrive at once)."""
    seen: list[list[tuple[str, int]]] = []
    for _ in range(3):
        page, log = open_playground(browser, stack.gateway_url, stack.api_key)
        answer_at_length(page)
        page.fill("#max-tokens", "1000")
        page.evaluate(WATCH_UPDATES)
        answer = send(page, "Tell me a long story.")
        assert answer.get_attribute("data-state") == "done"
        assert stats(answer)["completionTokens"] == 1000
        final = len(answer.locator(".content").text_content() or "")
        updates: list[tuple[str, int]] = page.evaluate("window.updates")
        assert not log.errors
        page.context.close()
        seen.append(updates)
        growing = {n for state, n in updates if state == "streaming" and 0 < n < final}
        if len(growing) >= 2:
            return
    pytest.fail(f"three answers of 1,000 tokens came in at most two pieces each: {seen}")


def stop_a_streaming_answer(stack: Stack, browser: Browser) -> tuple[Page, PageLog, Locator]:
    """A fresh tab whose long answer is streaming, with vLLM running it, stopped with the
    page's Stop button. Asked again in a fresh tab (up to three) when the answer ended before
    Stop could act: on a stalled 2-core machine vLLM's API server can fall behind its engine
    and hand over the tokens in merged chunks (CI saw 1,800 tokens arrive within 17 ms after
    a 7 s first token), and then nothing is left to stop."""
    for _ in range(3):
        page, log = open_playground(browser, stack.gateway_url, stack.api_key)
        answer_at_length(page)
        page.fill("#max-tokens", "1800")
        eventually(lambda: running_requests(stack.engine_url) == 0)  # nothing else running
        answer = start(page, "Tell me a long story.")
        # Text streaming in, or an end (an error fails here with what the page showed,
        # rather than a timeout that says nothing).
        page.wait_for_function(
            "element => ['done', 'stopped', 'error'].includes(element.dataset.state)"
            " || (element.dataset.state === 'streaming'"
            " && element.querySelector('.content').textContent.length > 0)",
            arg=answer.element_handle(),
            timeout=ANSWER_TIMEOUT_MS,
        )
        state = answer.get_attribute("data-state")
        assert state in ("streaming", "done"), answer.text_content()
        if state == "streaming":
            # vLLM sets its gauge after an engine step: wait for it (or for the answer's end).
            def running_or_over(current: Locator = answer) -> bool:
                streaming = current.get_attribute("data-state") == "streaming"
                return not streaming or running_requests(stack.engine_url) >= 1

            eventually(running_or_over)
            if page.is_enabled("#stop"):
                assert not page.is_enabled("#send")
                page.click("#stop", force=True)  # no wait: a button just disabled is a miss
                if finished(answer) == "stopped":
                    return page, log, answer
        assert finished(answer) == "done", answer.text_content()
        assert stats(answer)["completionTokens"] == 1800  # all of it, before Stop could act
        page.context.close()
    pytest.fail("three answers of 1,800 tokens each ended before Stop could act")


def test_stop_aborts_the_answer_in_vllm(stack: Stack, browser: Browser) -> None:
    page, log, answer = stop_a_streaming_answer(stack, browser)
    # Within 5 s of running time (host stalls excluded: see `eventually`).
    eventually(lambda: running_requests(stack.engine_url) == 0, budget_s=5)
    assert "Stopped after" in (answer.locator(".stats").text_content() or "")
    assert page.is_enabled("#send") and not page.is_enabled("#stop")
    assert not log.csp_violations() and not log.errors


def test_a_spent_token_limit_shows_the_429_with_its_retry_time(
    stack: Stack, browser: Browser
) -> None:
    prompt = "Tell me about the weather."
    # What the page's request reserves of the minute's tokens (prompt estimate + max_tokens),
    # as the gateway reports it to a roomy key.
    _, roomy = create_key(stack, "playground-measure", "--tpm", "100000")
    page, _ = open_playground(browser, stack.gateway_url, roomy)
    page.fill("#max-tokens", "64")
    with page.expect_response(CHAT) as answered:
        assert finished(start(page, prompt)) == "done"
    need = 100_000 - int(answered.value.headers["x-ratelimit-remaining-tokens"])
    page.context.close()

    # A key with exactly that: the first answer fits, the same request again does not while
    # the first one's tokens are in the minute.
    _, tight = create_key(stack, "playground-tight", "--tpm", str(need))
    page, log = open_playground(browser, stack.gateway_url, tight)
    page.fill("#max-tokens", "64")
    assert finished(start(page, prompt)) == "done"
    page.click("#new-chat")
    with page.expect_response(CHAT) as refused:
        answer = send(page, prompt)
    response = refused.value
    assert response.status == 429
    message = response.json()["error"]["message"]
    assert message.startswith("Rate limit reached for tokens per minute")
    wait = math.ceil(int(response.headers["retry-after-ms"]) / 1000)
    assert 0 < wait <= 61
    assert answer.get_attribute("data-state") == "error"
    assert answer.locator(".content").text_content() == (
        f"Rate limited (429): {message} Retry in {wait} s."
    )
    remaining = response.headers["x-ratelimit-remaining-tokens"]
    assert f"{remaining}/{need} tokens" in text(page, "#quota")
    assert page.input_value("#prompt") == prompt  # back in the box, to send again later
    assert not log.csp_violations() and not log.errors


def test_a_bad_key_shows_the_401(stack: Stack, browser: Browser) -> None:
    page, log = open_playground(browser, stack.gateway_url, "sk-not-a-real-key-0123456789")
    assert text(page, "#notice") == (
        "Invalid API key (401): Invalid API key. Send a valid key as 'Authorization: Bearer <key>'."
    )
    assert page.eval_on_selector("#model", "select => select.options.length") == 0
    assert not page.is_enabled("#send")
    assert not log.csp_violations() and not log.errors


def test_an_image_for_a_text_model_shows_the_apis_400(stack: Stack, browser: Browser) -> None:
    page, log = open_playground(browser, stack.gateway_url, stack.api_key)
    attach_image(page, "notes.txt", "text/plain", b"not an image")
    assert "only JPEG, PNG, GIF and WEBP" in text(page, "#notice")
    attach_image(page, "red.png", "image/png", png(32, 32))
    page.wait_for_selector("#attachment:has-text('red.png attached')")
    with page.expect_response(CHAT) as answered:
        answer = send(page, "What is in this picture?")
    response = answered.value
    assert response.status == 400
    shown = answer.locator(".content").text_content() or ""
    assert answer.get_attribute("data-state") == "error"
    assert f"(400): {response.json()['error']['message']}" in shown
    assert "may not accept images" in shown
    # Refused turns stay out of the conversation: without the image, the chat goes on.
    page.click("#remove-image")
    assert send_text_only(page) == "done"
    assert not log.csp_violations() and not log.errors


def send_text_only(page: Page) -> str:
    with page.expect_request(CHAT) as sent:
        answer = send(page, "Then just say hello.")
    body = json.loads(sent.value.post_data or "{}")
    assert [message["content"] for message in body["messages"]] == ["Then just say hello."]
    return answer.get_attribute("data-state") or ""
