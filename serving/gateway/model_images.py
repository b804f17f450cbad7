"""What a model's files say about the images it takes, as gateway settings.

    image_settings(Path("/models/Qwen2.5-VL-7B-Instruct"), limit=4)
    # {"max_images_per_request": 4, "image_patch_size": 14, "image_merge_size": 2,
    #  "image_min_pixels": 3136, "image_max_pixels": 12845056}
    image_settings(Path("/models/Qwen3-8B"))   # {"max_images_per_request": 0}: text only
    image_settings(Path("/not/downloaded"))    # {}: the gateway's defaults

The values are the ones vLLM's Qwen2-VL processor counts with: the patch and merge sizes
from config.json's `vision_config` (vLLM reads them there, not from the preprocessor), the
pixel bounds as transformers resolves them from preprocessor_config.json (`size`, then
`min_pixels`/`max_pixels` over it). A bound the files do not give is left to the gateway's
default, which is never below a Qwen-VL checkpoint's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.errors import ServingError

CONFIG = "config.json"
PREPROCESSOR_CONFIG = "preprocessor_config.json"


def image_settings(model_dir: Path, *, limit: int | None = None) -> dict[str, int]:
    """Gateway settings (field -> value) for the model in `model_dir`; `limit` is the
    engine's images per prompt (a profile's limit_mm_per_prompt.image), if it sets one."""
    found: dict[str, int] = {}
    if limit is not None:
        found["max_images_per_request"] = limit
    config = _read_json(model_dir / CONFIG)
    if config is None:
        return found  # not known here (a hub model not downloaded yet): the defaults
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return {"max_images_per_request": 0}  # a text model: vLLM refuses images too
    _put(found, "image_patch_size", vision.get("patch_size"))
    _put(found, "image_merge_size", vision.get("spatial_merge_size"))
    processor = _read_json(model_dir / PREPROCESSOR_CONFIG) or {}
    size = processor.get("size")
    if isinstance(size, dict):
        _put(found, "image_min_pixels", size.get("shortest_edge"))
        _put(found, "image_max_pixels", size.get("longest_edge"))
    _put(found, "image_min_pixels", processor.get("min_pixels"))
    _put(found, "image_max_pixels", processor.get("max_pixels"))
    return found


def _put(found: dict[str, int], name: str, value: object) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        found[name] = value


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ServingError(f"{path}: cannot be read as JSON ({exc})") from exc
    return data if isinstance(data, dict) else None
