"""A vLLM plugin: serve AWQ checkpoints on CPUs whose vLLM build has no 4-bit GEMM kernel.

vLLM 0.32's CPU wheel compiles its W4A16 kernel (`cpu_gemm_wna16`) only into the AVX-512
library. On an AVX2-only CPU vLLM still picks that kernel for an AWQ checkpoint and the engine
dies at its first forward pass. This plugin (loaded by vLLM in every process through the
`vllm.general_plugins` entry point) registers a quantization method that claims `awq`
checkpoints in exactly that case and does W4A16 with torch: the weights stay packed 4-bit
in memory (the same bytes as on disk, so the planner's numbers hold) and each forward pass
dequantizes them group by group before the matmul. Slower than a fused kernel; correct, and
a no-op wherever vLLM has its own kernel (GPUs, AVX-512 CPUs).

vLLM's own AWQ config and weight creation are reused: only the matmul is ours.
"""

from __future__ import annotations

from functools import cache
from typing import Any

METHOD = "awq_torch_cpu"


def native_w4a16_available() -> bool:
    """True where vLLM's compiled CPU W4A16 kernel exists (AVX-512 builds)."""
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vLLM's CPU op library)

    return hasattr(torch.ops._C, "cpu_gemm_wna16")


def register() -> None:
    """Entry point: register the torch AWQ method when this process needs it."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or native_w4a16_available():
        return
    from vllm.model_executor.layers.quantization import register_quantization_config

    config_class, _ = torch_awq_classes()
    register_quantization_config(METHOD)(config_class)


@cache
def torch_awq_classes() -> tuple[type[Any], type[Any]]:
    """(quantization config, linear method) classes; built on first use (they import vLLM)."""
    import torch
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.auto_awq import (
        AutoAWQConfig,
        BaseAWQLinearMethod,
    )

    from serving.quantize.awq_math import AwqTensors, dequantize

    class TorchAwqLinearMethod(BaseAWQLinearMethod):
        """AWQ GEMM as dequantize-then-matmul in torch; parameters as vLLM creates them."""

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            for name in ("qweight", "qzeros", "scales"):
                setattr(
                    layer, name, torch.nn.Parameter(getattr(layer, name).data, requires_grad=False)
                )

        def apply(
            self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
        ) -> torch.Tensor:
            qweight, qzeros, scales = (
                getattr(layer, name) for name in ("qweight", "qzeros", "scales")
            )
            tensors = AwqTensors(qweight.data, qzeros.data, scales.data)
            weight = dequantize(tensors, self.quant_config.group_size).to(x.dtype)
            return torch.nn.functional.linear(x, weight, bias)

    class TorchAwqConfig(AutoAWQConfig):
        @classmethod
        def get_name(cls) -> str:  # type: ignore[override]  # vLLM types it as its built-in names
            return METHOD

        @classmethod
        def get_min_capability(cls) -> int:
            return -1

        @classmethod
        def get_supported_act_dtypes(cls) -> list[torch.dtype]:
            return [torch.bfloat16, torch.float16, torch.float32]

        @classmethod
        def override_quantization_method(  # type: ignore[override]
            cls, hf_quant_cfg: dict[str, Any], user_quant: str | None, hf_config: Any = None
        ) -> str | None:
            claims = str(hf_quant_cfg.get("quant_method", "")).lower() == "awq"
            return METHOD if claims and user_quant in (None, "awq", METHOD) else None

        def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
            if isinstance(layer, LinearBase):
                return TorchAwqLinearMethod(self)
            return None

    return TorchAwqConfig, TorchAwqLinearMethod
