"""The tiny Qwen2.5-VL builder: byte-identical rebuilds, files transformers reads as a
Qwen2.5-VL checkpoint, the image token rule of its preprocessor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from serving.errors import ServingError
from serving.models import tiny_tokenizer as tt
from serving.models.cached_build import Progress
from serving.models.tiny_vl_model import (
    IMAGE_PAD,
    PREPROCESSOR_CONFIG,
    VISION_END,
    VISION_START,
    VISION_TOKENS,
    TinyVlParams,
    ensure_tiny_vl_model,
    planned_config,
)
from serving.planner.config_json import load_config_dir
from serving.planner.vision import image_tokens


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_vl_model(tmp_path_factory.mktemp("vl") / "m", progress=Progress(quiet=True))


def test_a_second_build_writes_the_same_bytes(built: Path, tmp_path: Path) -> None:
    again = ensure_tiny_vl_model(tmp_path / "m", progress=Progress(quiet=True))
    names = sorted(path.name for path in built.iterdir())
    assert names == sorted(path.name for path in again.iterdir())
    assert PREPROCESSOR_CONFIG in names and "model.safetensors" in names
    for name in names:
        assert (built / name).read_bytes() == (again / name).read_bytes(), name


def test_a_matching_build_is_reused(built: Path) -> None:
    stamp = (built / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_vl_model(built, progress=Progress(quiet=True)) == built
    assert (built / "model.safetensors").stat().st_mtime_ns == stamp


def test_the_planner_knows_the_config_without_building(built: Path) -> None:
    config = json.loads((built / "config.json").read_text())
    assert config == planned_config(TinyVlParams())
    info = json.loads((built / "build-info.json").read_text())
    spec = load_config_dir(built)
    from serving.planner.weights import param_count

    assert param_count(spec) == info["parameters"]
    assert spec.vision_params == info["vision_parameters"]


def test_transformers_loads_every_weight(built: Path) -> None:
    from transformers import Qwen2_5_VLForConditionalGeneration

    loaded: Any = Qwen2_5_VLForConditionalGeneration.from_pretrained(
        built, output_loading_info=True
    )
    model, loading = loaded
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    assert model.config.vision_config.out_hidden_size == model.config.text_config.hidden_size


def test_vision_tokens_are_single_special_tokens_with_the_ids_config_names(built: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    config = json.loads((built / "config.json").read_text())
    named = {
        VISION_START: config["vision_start_token_id"],
        VISION_END: config["vision_end_token_id"],
        IMAGE_PAD: config["image_token_id"],
    }
    for token, expected in named.items():
        assert tokenizer.convert_tokens_to_ids(token) == expected
    block = "".join(VISION_TOKENS)
    assert len(tokenizer(block, add_special_tokens=False)["input_ids"]) == len(VISION_TOKENS)


def test_the_chat_template_renders_an_image_part_as_one_vision_block(built: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    parts: Any = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": parts}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    plain = [{"role": "user", "content": "Hi"}]
    assert tokenizer.apply_chat_template(plain, tokenize=False) == tt.render_chat(
        plain, add_generation_prompt=False
    )


@pytest.mark.parametrize(("width", "height"), [(28, 28), (100, 60), (300, 200), (1000, 800)])
def test_the_preprocessor_makes_the_tokens_the_planner_counts(
    built: Path, width: int, height: int
) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(built)
    grid = processor(images=[Image.new("RGB", (width, height))])["image_grid_thw"][0].tolist()
    merged = grid[0] * grid[1] * grid[2] // 4  # merge 2 x 2
    vision = load_config_dir(built).vision
    assert vision is not None
    assert merged == image_tokens(height, width, vision)
    assert merged <= 64  # max_pixels 28*28*64 caps every image


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"mrope_section": (4, 4, 4)}, "mrope_section"),
        ({"num_key_value_heads": 3}, "KV heads"),
        ({"fullatt_block_indexes": (5,)}, "fullatt_block_indexes"),
        ({"min_pixels": 10**9}, "min_pixels"),
    ],
)
def test_impossible_params_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ServingError, match=message):
        TinyVlParams(**change)  # type: ignore[arg-type]
