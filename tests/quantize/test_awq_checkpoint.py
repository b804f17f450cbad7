"""The AWQ checkpoint: what vLLM's loader expects, what the planner predicts, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from serving.errors import ServingError
from serving.models.cached_build import Progress, read_build_info
from serving.planner import get_gpu, plan_for, resolve_model
from serving.planner.settings import PlanSettings
from serving.quantize.awq_build import ensure_awq_model
from serving.quantize.awq_checkpoint import AwqParams, quantize_checkpoint
from serving.quantize.awq_math import AwqTensors, dequantize
from tests.safetensors_bytes import model_tensor_bytes

QUICK = AwqParams(samples=4, seq_len=64, max_rows=256)
TEXT = ["The river ran past the old mill and the morning was quiet. " * 40]


@pytest.fixture(scope="module")
def quantized(small_qwen3: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small-awq")
    quantize_checkpoint(small_qwen3, out, QUICK, TEXT, lambda _: None)
    return out


def test_checkpoint_has_awq_config_tensors_and_side_files(quantized: Path) -> None:
    config = json.loads((quantized / "config.json").read_text())
    assert config["quantization_config"] == {
        "quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
        "version": "gemm", "modules_to_not_convert": None,
    }  # fmt: skip
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in quantized.iterdir()}
    tensors = load_file(str(quantized / "model.safetensors"))
    down = "model.layers.1.mlp.down_proj"
    assert tensors[f"{down}.qweight"].shape == (256, 16)  # [in, out/8]
    assert tensors[f"{down}.qzeros"].shape == (2, 16)
    assert (
        tensors[f"{down}.scales"].shape == (2, 128)
        and tensors[f"{down}.scales"].dtype == torch.float16
    )
    assert f"{down}.weight" not in tensors and "lm_head.weight" not in tensors  # tied
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert tensors["model.layers.0.self_attn.q_norm.weight"].dtype == torch.bfloat16


def test_dequantized_weights_stay_near_the_source(small_qwen3: Path, quantized: Path) -> None:
    source = load_file(str(small_qwen3 / "model.safetensors"))
    tensors = load_file(str(quantized / "model.safetensors"))
    name = "model.layers.0.self_attn.k_proj"  # q/k/v were scaled; the product W x is unchanged
    restored = dequantize(
        AwqTensors(
            tensors[f"{name}.qweight"], tensors[f"{name}.qzeros"], tensors[f"{name}.scales"]
        ),
        128,
    )
    norm = tensors["model.layers.0.input_layernorm.weight"].float()
    norm_source = source["model.layers.0.input_layernorm.weight"].float()
    scales = norm_source / norm  # what the norm was divided by
    original = source[f"{name}.weight"].float()
    relative = (restored / scales - original).norm() / original.norm()
    assert relative < 0.15, relative


def planned_weight_bytes(model_dir: Path) -> int:
    # No quantization given: the planner must read it from the checkpoint's config.json.
    settings = PlanSettings(dtype="bfloat16", max_model_len=256, kv_space_gib=1.0)
    return plan_for(resolve_model(str(model_dir)), get_gpu("cpu"), settings).weights.total


def test_planner_weight_bytes_equal_the_awq_files(quantized: Path) -> None:
    assert planned_weight_bytes(quantized) == model_tensor_bytes(quantized)


def test_build_is_cached_by_fingerprint(small_qwen3: Path, tmp_path: Path) -> None:
    out = tmp_path / "awq"
    first = ensure_awq_model(
        small_qwen3, out, params=QUICK, texts=TEXT, progress=Progress(quiet=True)
    )
    info = read_build_info(first)
    assert info is not None and info["awq_error"] <= info["rtn_error"]
    assert info["clip_error_after"] <= info["clip_error_before"]
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    ensure_awq_model(small_qwen3, out, params=QUICK, texts=TEXT, progress=Progress(quiet=True))
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    other = AwqParams(group_size=64, samples=4, seq_len=64, max_rows=256)
    ensure_awq_model(small_qwen3, out, params=other, texts=TEXT, progress=Progress(quiet=True))
    assert json.loads((out / "config.json").read_text())["quantization_config"]["group_size"] == 64
    assert planned_weight_bytes(out) == model_tensor_bytes(out)  # smaller groups: more scales


def test_unsupported_sources_get_one_line_errors(
    small_qwen3: Path, quantized: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ServingError, match="already quantized"):
        quantize_checkpoint(quantized, out, QUICK, TEXT, lambda _: None)
    moe = tmp_path / "moe"
    shutil.copytree(small_qwen3, moe)
    config = json.loads((moe / "config.json").read_text())
    (moe / "config.json").write_text(
        json.dumps({**config, "architectures": ["Qwen3MoeForCausalLM"]})
    )
    with pytest.raises(ServingError, match=r"Qwen3MoeForCausalLM.*not supported"):
        quantize_checkpoint(moe, out, QUICK, TEXT, lambda _: None)
    odd = tmp_path / "odd"
    shutil.copytree(small_qwen3, odd)
    (odd / "config.json").write_text(json.dumps({**config, "intermediate_size": 352}))
    with pytest.raises(
        ServingError, match="intermediate_size=352: not a multiple of group size 64"
    ):
        quantize_checkpoint(odd, out, AwqParams(group_size=64), TEXT, lambda _: None)
    (odd / "config.json").write_text(json.dumps({**config, "torch_dtype": "int8"}))
    with pytest.raises(ServingError, match="torch_dtype 'int8': expected one of bfloat16"):
        quantize_checkpoint(odd, out, QUICK, TEXT, lambda _: None)
    with pytest.raises(ServingError, match=r"calibration text is \d+ tokens"):
        quantize_checkpoint(small_qwen3, out, QUICK, ["too short"], lambda _: None)
    with pytest.raises(ServingError, match="group_size=100"):
        AwqParams(group_size=100)


def test_newer_dtype_key_is_honoured(small_qwen3: Path, tmp_path: Path) -> None:
    source = tmp_path / "fp16-source"
    shutil.copytree(small_qwen3, source)
    config = json.loads((source / "config.json").read_text())
    del config["torch_dtype"]
    (source / "config.json").write_text(json.dumps({**config, "dtype": "float16"}))
    out = tmp_path / "out"
    out.mkdir()
    quantize_checkpoint(source, out, QUICK, TEXT, lambda _: None)
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["model.embed_tokens.weight"].dtype == torch.float16
