"""The vLLM plugin: torch W4A16 where vLLM's CPU build has no kernel, and nowhere else."""

from __future__ import annotations

from importlib.metadata import entry_points

import torch
from torch import nn

from serving.quantize.awq_math import fake_quantize, quantize_linear
from serving.quantize.vllm_plugin import (
    METHOD,
    native_w4a16_available,
    register,
    torch_awq_classes,
)


def test_vllm_finds_the_plugin_through_its_entry_point_group() -> None:
    plugins = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert plugins["serving_awq"] == "serving.quantize.vllm_plugin:register"


def test_registered_exactly_when_the_native_kernel_is_missing() -> None:
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    register()
    assert (METHOD in QUANTIZATION_METHODS) == (not native_w4a16_available())


def test_claims_awq_checkpoints_only() -> None:
    config_class, _ = torch_awq_classes()
    awq = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    assert config_class.override_quantization_method(awq, None) == METHOD
    assert config_class.override_quantization_method(awq, "awq") == METHOD
    assert config_class.override_quantization_method(awq, "gptq") is None
    assert config_class.override_quantization_method({"quant_method": "gptq"}, None) is None


def test_linear_method_computes_x_times_the_dequantized_weight() -> None:
    config_class, method_class = torch_awq_classes()
    config = config_class.from_config({"bits": 4, "group_size": 128, "zero_point": True})
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(4))
    packed = quantize_linear(weight, 128)
    layer = nn.Module()
    for name in ("qweight", "qzeros", "scales"):
        layer.register_parameter(name, nn.Parameter(getattr(packed, name), requires_grad=False))
    method = method_class(config)
    method.process_weights_after_loading(layer)
    x = torch.randn(3, 5, 256, generator=torch.Generator().manual_seed(5))
    bias = torch.randn(64)
    expected = x @ fake_quantize(weight, 128).t() + bias
    torch.testing.assert_close(method.apply(layer, x, bias), expected, rtol=1e-5, atol=1e-5)
    assert layer.qweight.dtype == torch.int32  # stays packed: 4 bits per weight in memory
