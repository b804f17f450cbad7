"""Image input served for real: `serving up --profile cpu-tiny-vl` (vLLM on the tiny
Qwen2.5-VL), images as data URLs through the official `openai` client, and the prompt tokens
each image costs exactly as our own smart_resize rule says."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionContentPartParam

from serving.engine.resolve import resolve_model
from serving.planner.config_json import load_config_dir
from serving.planner.profile_plan import profile_plan
from serving.planner.vision import Qwen25VisionConfig, image_tokens
from serving.profiles import load_profile
from tests.integration.conftest import Stack
from tests.integration.planner_truth import planned_capacity, vllm_cache_info
from tests.integration.vision.conftest import PROFILE
from tests.safetensors_bytes import model_tensor_bytes

QUESTION = "What is in the picture?"
# <|vision_start|> and <|vision_end|> around each image's <|image_pad|> tokens.
VISION_DELIMITERS = 2


@pytest.fixture(scope="module")
def vision() -> Qwen25VisionConfig:
    """The served model's encoder and pixel range, read from its files by the planner."""
    spec = load_config_dir(Path(resolve_model(load_profile(PROFILE))))
    assert spec.vision is not None
    return spec.vision


def data_url(width: int, height: int) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 40)).save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def prompt_tokens(client: OpenAI, parts: list[ChatCompletionContentPartParam]) -> int:
    reply = client.chat.completions.create(
        model=load_profile(PROFILE).served_model_name,
        messages=[{"role": "user", "content": parts}],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 4
    return reply.usage.prompt_tokens


def with_image(width: int, height: int) -> list[ChatCompletionContentPartParam]:
    return [
        {"type": "image_url", "image_url": {"url": data_url(width, height)}},
        {"type": "text", "text": QUESTION},
    ]


# A small image (100x60: resized to 56x112, 2 x 4 tokens) and one over max_pixels
# (1000x800: scaled down to 196x224, 7 x 8 tokens).
SIZES = [(100, 60), (1000, 800)]


def test_each_image_costs_the_tokens_smart_resize_says(
    vl_stack: Stack, vision: Qwen25VisionConfig
) -> None:
    client = vl_stack.direct_client()
    expected = [image_tokens(height, width, vision) for width, height in SIZES]
    assert expected == [8, 56]
    with vl_stack.off_the_books():  # vLLM's own count of each image
        text_only = prompt_tokens(client, [{"type": "text", "text": QUESTION}])
        grown = [prompt_tokens(client, with_image(*size)) - text_only for size in SIZES]
        both = prompt_tokens(client, [*with_image(*SIZES[0]), *with_image(*SIZES[1])[:1]])
    assert grown == [tokens + VISION_DELIMITERS for tokens in expected]
    assert both - text_only == sum(expected) + 2 * VISION_DELIMITERS


def test_the_gateway_serves_images_with_vllms_usage(vl_stack: Stack) -> None:
    with vl_stack.off_the_books():
        direct = prompt_tokens(vl_stack.direct_client(), with_image(*SIZES[1]))
    assert prompt_tokens(vl_stack.client(), with_image(*SIZES[1])) == direct


def test_the_planner_agrees_with_vllm_and_the_files(vl_stack: Stack) -> None:
    """KV capacity as vLLM reports it; weights (the vision encoder's too) as the files hold."""
    model_dir = resolve_model(load_profile(PROFILE))
    info = vllm_cache_info(vl_stack.engine_url)
    planned = planned_capacity(PROFILE, model_dir)
    assert int(info["num_gpu_blocks"]) == planned.num_blocks
    assert int(info["kv_cache_size_tokens"]) == planned.tokens
    plan = profile_plan(load_profile(PROFILE))
    assert plan.capacity == planned  # planned from the build parameters, without the files
    assert plan.weights.total == model_tensor_bytes(Path(model_dir))
