"""The planner's MoE weight count against the parameters vLLM's own model class allocates.

A child process builds vLLM's `Qwen3MoeForCausalLM` for small Qwen3-MoE configs on the meta
device (shapes and dtypes, no memory, no weights) at TP 1, the way its loader would, and
reports the parameters and bytes it holds: every routed expert as one fused tensor, the
router, dense MLP layers where `decoder_sparse_step`/`mlp_only_layers` put them, a shared
expert, the padded vocabulary. The planner must count exactly those. It runs in its own
process because it sets up vLLM's (single-rank) distributed state; about 8 s, mostly imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from serving.planner import resolve_model
from serving.planner.weights import param_count, weight_bytes

BASE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,  # vLLM pads it to 320
    "max_position_embeddings": 512,
    "norm_topk_prob": True,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
CONFIGS = {
    "every-layer-sparse": BASE,
    "dense-and-shared": {
        **BASE,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "shared_expert_intermediate_size": 48,
    },
}

CHILD = """
import json, sys, torch
from vllm.config import set_current_vllm_config
from vllm.distributed import init_distributed_environment, initialize_model_parallel
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import initialize_model
from vllm.utils.torch_utils import set_default_torch_dtype

result = {}
for index, directory in enumerate(sys.argv[2:]):
    args = EngineArgs(model=directory, skip_tokenizer_init=True, load_format="dummy",
                      enforce_eager=True, max_model_len=256)
    config = args.create_engine_config()
    with set_current_vllm_config(config):
        if index == 0:
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method="file://" + sys.argv[1])
            initialize_model_parallel(1, 1)
        # as BaseModelLoader.load_model creates it, on the meta device instead of the GPU
        with set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            model = initialize_model(vllm_config=config)
    params = list(model.parameters())
    result[directory] = {
        "class": type(model).__name__,
        "parameters": sum(p.numel() for p in params),
        "bytes": sum(p.numel() * p.element_size() for p in params),
        "names": [name for name, _ in model.named_parameters()],
    }
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def allocated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("moe")
    directories = []
    for name, config in CONFIGS.items():
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config), encoding="utf-8")
        directories.append(str(root / name))
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(root / "dist-init"), *directories],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    found: dict[str, dict[str, Any]] = json.loads(lines[-1].removeprefix("RESULT "))
    return {Path(directory).name: value for directory, value in found.items()}


@pytest.mark.parametrize("name", CONFIGS)
def test_planner_counts_what_vllm_allocates(
    name: str, allocated: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS[name]), encoding="utf-8")
    spec = resolve_model(str(tmp_path))
    vllm = allocated[name]
    assert vllm["class"] == "Qwen3MoeForCausalLM"
    assert param_count(spec) == vllm["parameters"]
    assert weight_bytes(spec, 1, dtype_bytes=2, awq_group_size=None).total == vllm["bytes"]


def test_the_configs_exercise_dense_layers_and_a_shared_expert(
    allocated: dict[str, dict[str, Any]],
) -> None:
    names = set(allocated["dense-and-shared"]["names"])
    assert "model.layers.1.mlp.gate.weight" in names  # sparse: (1 + 1) % 2 == 0
    assert "model.layers.3.mlp.gate_up_proj.weight" in names  # dense: in mlp_only_layers
    assert "model.layers.1.mlp.shared_expert.gate_up_proj.weight" in names
    assert not any(".mlp.gate_up_proj." in n for n in allocated["every-layer-sparse"]["names"])
