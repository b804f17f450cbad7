"""Images through the gateway to real vLLM serving the tiny Qwen2.5-VL (`cpu-tiny-vl`).

The gateway reserves an image's tokens from its header before vLLM sees it; here vLLM's own
`usage.prompt_tokens` is the ground truth: every reservation is at least what vLLM counted
(the "never over a limit" guarantee), an image costs exactly the tokens the gateway computes
for it from the model's files, whatever its file size, and a key's remaining tokens move by
that count, not by the base64 length. `serving up --profile cpu-tiny-vl` (the package's stack,
conftest.py) is started the way a user starts it and passes the model's image rule to the gateway.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from serving.engine.resolve import resolve_model
from serving.gateway.images import IMAGE_PART_TOKENS, ImagePolicy
from serving.gateway.model_images import image_settings
from serving.gateway.openai_request import BASE_TOKENS, PER_MESSAGE_TOKENS
from serving.gateway.settings import GatewaySettings
from serving.profiles import load_profile
from tests.integration.conftest import (
    Stack,
    eventually,
)
from tests.integration.test_gateway_quota import create_key, gateway_metrics
from tests.integration.vision.conftest import PROFILE

MODEL = "qwen2.5-vl-tiny"
TEXT = {"type": "text", "text": "Describe the picture."}
# (format, Pillow options, width, height): every format, below, inside and above the
# model's pixel bounds, elongated both ways
IMAGES = [
    ("PNG", {}, 1, 1),
    ("PNG", {}, 640, 480),
    ("JPEG", {"quality": 90}, 28, 28),
    ("JPEG", {"progressive": True}, 1500, 1000),
    ("GIF", {}, 100, 3000),
    ("WEBP", {"quality": 80}, 333, 77),
    ("WEBP", {"lossless": True}, 2000, 15),
]


@pytest.fixture(scope="module")
def policy() -> ImagePolicy:
    """The rule computed here from the model's own files, as `serving up` passes it."""
    found = image_settings(Path(resolve_model(load_profile(PROFILE))), limit=4)
    settings = GatewaySettings.create(upstream="http://127.0.0.1:1", api_keys=["k"], **found)
    return ImagePolicy.from_settings(settings)


def image_url(
    fmt: str, options: dict[str, Any], width: int, height: int, noise: bool = False
) -> str:
    image = Image.effect_noise((width, height), 70).convert("RGB") if noise else \
        Image.new("RGB", (width, height), (180, 40, 90))  # fmt: skip
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def ask(stack: Stack, secret: str, content: list[dict[str, Any]], **fields: Any) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 2, **fields}  # fmt: skip
    headers = {"Authorization": f"Bearer {secret}"}
    return httpx.post(f"{stack.gateway_url}/v1/chat/completions", json=body, headers=headers,
                      timeout=300)  # fmt: skip


def ask_fresh_key(stack: Stack, name: str, content: list[dict[str, Any]]) -> tuple[int, int]:
    """(tokens reserved, vLLM's prompt tokens) of one request on a key of its own, so the
    rate-limit headers show its reservation alone (max_tokens 2 included)."""
    limit = 100_000
    _, secret = create_key(stack, name, "--tpm", str(limit))
    response = ask(stack, secret, content)
    return reservation(response, limit), prompt_tokens(response)


def reservation(response: httpx.Response, limit: int) -> int:
    assert response.status_code == 200, response.text
    return limit - int(response.headers["x-ratelimit-remaining-tokens"])


def prompt_tokens(response: httpx.Response) -> int:
    usage = response.json()["usage"]
    assert isinstance(usage["prompt_tokens"], int)
    return int(usage["prompt_tokens"])


def test_serving_up_passes_the_models_image_rule(policy: ImagePolicy) -> None:
    """The tiny model's small pixel range (so an image costs tens of tokens here) and the
    profile's limit, not the gateway's defaults."""
    assert policy.max_images == 4
    assert policy.max_pixels < ImagePolicy.defaults().max_pixels


@pytest.mark.parametrize(("fmt", "options", "width", "height"), IMAGES)
def test_an_image_costs_what_vllm_counts_and_the_reservation_covers_it(
    vl_stack: Stack, policy: ImagePolicy, fmt: str, options: dict[str, Any], width: int,
    height: int,
) -> None:  # fmt: skip
    name = f"vl-{fmt}-{width}x{height}"
    text_reserved, text_prompt = ask_fresh_key(vl_stack, name, [TEXT])
    url = image_url(fmt, options, width, height)
    image_reserved, image_prompt = ask_fresh_key(vl_stack, name, [TEXT, image_part(url)])
    # vLLM's count for the image: its pads by the rule the gateway applies, plus
    # <|vision_start|> and <|vision_end|>.
    assert image_prompt - text_prompt == policy.image_tokens(width, height) + 2
    assert text_reserved - 2 >= text_prompt  # never under what vLLM counted
    assert image_reserved - 2 >= image_prompt
    assert image_reserved - text_reserved == policy.image_tokens(width, height) + IMAGE_PART_TOKENS


def test_remaining_tokens_move_by_the_images_count_not_its_base64_length(
    vl_stack: Stack, policy: ImagePolicy
) -> None:
    url = image_url("PNG", {}, 1500, 1500, noise=True)
    assert len(url) > 6_000_000  # as text, millions of tokens: no key could afford it
    limit = 1_000
    key_id, secret = create_key(vl_stack, "vl-large", "--tpm", str(limit))
    response = ask(vl_stack, secret, [TEXT, image_part(url)])
    reserved = reservation(response, limit)
    assert reserved - 2 >= prompt_tokens(response)
    # remaining = limit - (the text's bound + the image's tokens and template + max_tokens)
    text = BASE_TOKENS + PER_MESSAGE_TOKENS + len("user") + len(json.dumps(TEXT))
    image = policy.image_tokens(1500, 1500)
    assert image == 64  # scaled down to max_pixels: 8 x 8 tokens
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == limit - (
        text + image + IMAGE_PART_TOKENS + 2
    )
    # Settled with vLLM's numbers: the key is charged what vLLM reported.
    total = response.json()["usage"]["total_tokens"]
    eventually(
        lambda: (
            charged(vl_stack, key_id, "prompt") + charged(vl_stack, key_id, "completion") == total
        )
    )


def charged(stack: Stack, key_id: str, kind: str) -> float:
    labels = frozenset({"key": key_id, "model": MODEL, "kind": kind}.items())
    return gateway_metrics(stack).get(("gateway_tokens_total", labels), 0.0)


@pytest.mark.parametrize(
    ("content", "param"),
    [
        ([image_part(image_url("PNG", {}, 30, 30))] * 5, "messages[0].content[4]"),
        ([image_part("http://169.254.169.254/latest/meta-data")],
         "messages[0].content[0].image_url.url"),
    ],
)  # fmt: skip
def test_the_gateway_refuses_before_vllm_and_charges_nothing(
    vl_stack: Stack, content: list[dict[str, Any]], param: str
) -> None:
    key_id, secret = create_key(vl_stack, f"vl-refused-{len(content)}", "--tpm", "5000")
    response = ask(vl_stack, secret, content)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert response.headers["x-ratelimit-remaining-tokens"] == "5000"
    assert charged(vl_stack, key_id, "prompt") == charged(vl_stack, key_id, "completion") == 0
