"""Image input served for real: `serving up --profile cpu-tiny-vl` (vLLM on the tiny
Qwen2.5-VL), images as data URLs through the official `openai` client, and the prompt tokens
each image costs exactly as our own smart_resize rule says."""

from __future__ import annotations

import base64
import io
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionContentPartParam

from serving.engine.resolve import resolve_model
from serving.planner.command import profile_plan
from serving.planner.config_json import load_config_dir
from serving.planner.vision import Qwen25VisionConfig, image_tokens
from serving.profiles import load_profile
from tests.integration.conftest import REPO, TEST_KEY, Stack, descendants, serving_env, wait_for
from tests.integration.planner_truth import planned_capacity, vllm_cache_info
from tests.ports import free_port
from tests.safetensors_bytes import model_tensor_bytes

PROFILE = "cpu-tiny-vl"
QUESTION = "What is in the picture?"
# <|vision_start|> and <|vision_end|> around each image's <|image_pad|> tokens.
VISION_DELIMITERS = 2


@pytest.fixture(scope="module")
def vision_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    port, engine_port, launcher_port = free_port(), free_port(), free_port()
    workdir = tmp_path_factory.mktemp("vision-stack")
    output, keys_db = workdir / "serving-up.out", workdir / "keys.db"
    with output.open("w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.cli", "up", "--profile", PROFILE,
             "--port", str(port), "--engine-port", str(engine_port),
             "--metrics-port", str(launcher_port), "--keys-db", str(keys_db)],
            env=serving_env(SERVING_API_KEY=TEST_KEY),
            stdout=sink, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        )  # fmt: skip
    stack = Stack(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{engine_port}", TEST_KEY,
                  process, output, keys_db, f"http://127.0.0.1:{launcher_port}")  # fmt: skip
    try:
        wait_for(f"{stack.gateway_url}/healthz", process, output, timeout=900)
        wait_for(f"{stack.engine_url}/health", process, output, timeout=60)
        yield stack
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
    vision_stack: Stack, vision: Qwen25VisionConfig
) -> None:
    client = vision_stack.direct_client()
    text_only = prompt_tokens(client, [{"type": "text", "text": QUESTION}])
    expected = [image_tokens(height, width, vision) for width, height in SIZES]
    assert expected == [8, 56]
    for (width, height), tokens in zip(SIZES, expected, strict=True):
        grown = prompt_tokens(client, with_image(width, height)) - text_only
        assert grown == tokens + VISION_DELIMITERS, (width, height)
    both = prompt_tokens(client, [*with_image(*SIZES[0]), *with_image(*SIZES[1])[:1]])
    assert both - text_only == sum(expected) + 2 * VISION_DELIMITERS


def test_the_gateway_serves_images_with_vllms_usage(vision_stack: Stack) -> None:
    direct = prompt_tokens(vision_stack.direct_client(), with_image(*SIZES[1]))
    assert prompt_tokens(vision_stack.client(), with_image(*SIZES[1])) == direct


def test_the_planner_agrees_with_vllm_and_the_files(vision_stack: Stack) -> None:
    """KV capacity as vLLM reports it; weights (the vision encoder's too) as the files hold."""
    model_dir = resolve_model(load_profile(PROFILE))
    info = vllm_cache_info(vision_stack.engine_url)
    planned = planned_capacity(PROFILE, model_dir)
    assert int(info["num_gpu_blocks"]) == planned.num_blocks
    assert int(info["kv_cache_size_tokens"]) == planned.tokens
    plan = profile_plan(load_profile(PROFILE))
    assert plan.capacity == planned  # planned from the build parameters, without the files
    assert plan.weights.total == model_tensor_bytes(Path(model_dir))
