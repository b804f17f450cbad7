"""Bytes per value for the model dtype and the KV cache dtype (vLLM's names)."""

from __future__ import annotations

from serving.errors import ServingError
from serving.vllm_flags import engine_flag

MODEL_DTYPES: dict[str, int] = {
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float32": 4,
    "float": 4,
}
KV_CACHE_DTYPES: dict[str, int | None] = {
    "auto": None,  # the model dtype
    "float16": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}
QUANTIZATIONS = ("none", "awq")


def model_dtype_bytes(dtype: str, config_dtype: str) -> int:
    """Bytes per weight/activation value; `auto` follows the checkpoint (fp32 -> 16 bit)."""
    if dtype == "auto":
        return 2 if MODEL_DTYPES.get(config_dtype, 2) == 4 else MODEL_DTYPES.get(config_dtype, 2)
    if dtype not in MODEL_DTYPES:
        known = ", ".join(MODEL_DTYPES)
        raise ServingError(
            f"{engine_flag('dtype')}: unknown dtype {dtype!r} (known: auto, {known})"
        )
    return MODEL_DTYPES[dtype]


def kv_dtype_bytes(kv_cache_dtype: str, model_bytes: int) -> int:
    """Bytes per cached K or V value."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        known = ", ".join(KV_CACHE_DTYPES)
        flag = engine_flag("kv_cache_dtype")
        raise ServingError(f"{flag}: unknown {kv_cache_dtype!r} (known: {known})")
    size = KV_CACHE_DTYPES[kv_cache_dtype]
    return model_bytes if size is None else size


def is_fp8(kv_cache_dtype: str) -> bool:
    return kv_cache_dtype.startswith("fp8")


def check_quantization(quantization: str) -> None:
    if quantization not in QUANTIZATIONS:
        known = ", ".join(QUANTIZATIONS)
        raise ServingError(
            f"{engine_flag('quantization')}: unknown {quantization!r} (known: {known})"
        )
