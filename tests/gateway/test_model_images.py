"""A model directory's image rule as gateway settings, held against what transformers loads
from the same files (vLLM loads them through transformers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import Qwen2_5_VLConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from serving.errors import ServingError
from serving.gateway.images import ImagePolicy
from serving.gateway.model_images import image_settings
from serving.gateway.settings import GatewaySettings

QWEN25_VL_CONFIG = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"],
    "model_type": "qwen2_5_vl",
    "vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2},
}
# (preprocessor_config.json, the min and max pixels transformers' processor ends up with)
PREPROCESSORS: list[tuple[dict[str, Any], tuple[int, int]]] = [
    ({"min_pixels": 3136, "max_pixels": 12845056}, (3136, 12845056)),  # Qwen2.5-VL's hub file
    ({"size": {"shortest_edge": 784, "longest_edge": 50176}}, (784, 50176)),  # transformers 5
    # both: min/max_pixels win over size, as in Qwen2VLImageProcessor.__init__
    ({"size": {"shortest_edge": 1, "longest_edge": 2}, "min_pixels": 784, "max_pixels": 50176},
     (784, 50176)),
]  # fmt: skip


def write(model_dir: Path, config: dict[str, Any], processor: dict[str, Any] | None) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(config))
    if processor is not None:
        base = {"image_processor_type": "Qwen2VLImageProcessor", "patch_size": 14,
                "merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
        (model_dir / "preprocessor_config.json").write_text(json.dumps({**base, **processor}))
    return model_dir


@pytest.mark.parametrize(("processor", "pixels"), PREPROCESSORS)
def test_settings_are_what_transformers_loads_from_the_files(
    tmp_path: Path, processor: dict[str, Any], pixels: tuple[int, int]
) -> None:
    model_dir = write(tmp_path / "vl", QWEN25_VL_CONFIG, processor)
    found = image_settings(model_dir, limit=4)
    loaded: Any = Qwen2VLImageProcessorPil.from_pretrained(model_dir)
    vision: Any = Qwen2_5_VLConfig.from_pretrained(model_dir).vision_config
    assert (loaded.size.shortest_edge, loaded.size.longest_edge) == pixels
    assert found == {
        "max_images_per_request": 4,
        "image_patch_size": vision.patch_size,
        "image_merge_size": vision.spatial_merge_size,
        "image_min_pixels": pixels[0],
        "image_max_pixels": pixels[1],
    }
    settings = GatewaySettings.create(upstream="http://127.0.0.1:1", api_keys=["k"], **found)
    policy = ImagePolicy.from_settings(settings)
    assert (policy.min_pixels, policy.max_pixels, policy.max_images) == (*pixels, 4)


def test_a_text_model_takes_no_images(tmp_path: Path) -> None:
    model_dir = write(tmp_path / "text", {"model_type": "qwen3"}, None)
    assert image_settings(model_dir) == {"max_images_per_request": 0}
    assert image_settings(model_dir, limit=5) == {"max_images_per_request": 0}


def test_an_unknown_model_keeps_the_defaults_and_the_profile_limit(tmp_path: Path) -> None:
    assert image_settings(tmp_path / "absent") == {}
    assert image_settings(tmp_path / "absent", limit=2) == {"max_images_per_request": 2}


def test_without_a_preprocessor_the_pixel_bounds_stay_default(tmp_path: Path) -> None:
    model_dir = write(tmp_path / "vl", QWEN25_VL_CONFIG, None)
    assert image_settings(model_dir) == {"image_patch_size": 14, "image_merge_size": 2}


def test_a_broken_config_names_the_file(tmp_path: Path) -> None:
    model_dir = tmp_path / "broken"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(ServingError, match=r"config\.json"):
        image_settings(model_dir)
