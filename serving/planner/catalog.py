"""Built-in model specs, and the lookup that turns `--model` into a `ModelSpec`.

Each entry cites its source: the Hugging Face repository and the `config.json` fields used.
`resolve_model` accepts a catalog name (case-insensitive, with or without the `Qwen/` owner;
an `-AWQ` suffix names the same shapes quantized) or a local directory with a config.json.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from serving.errors import ServingError
from serving.planner.config_json import load_config_dir
from serving.planner.models import GatedDeltaNetSpec, ModelSpec, MoeSpec, hybrid_layer_types
from serving.planner.vision import VisionConfig, vision_encoder_params

# Qwen/Qwen2.5-7B-Instruct config.json: num_hidden_layers 28, hidden_size 3584,
# num_attention_heads 28, num_key_value_heads 4 (head_dim = 3584/28 = 128),
# intermediate_size 18944, vocab_size 152064, tie_word_embeddings false,
# max_position_embeddings 32768, torch_dtype bfloat16; Qwen2 has q/k/v biases.
QWEN25_7B = ModelSpec(
    name="Qwen2.5-7B-Instruct",
    layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128, intermediate=18944,
    vocab=152064, tied_embeddings=False, max_positions=32768, attention_bias=True,
)  # fmt: skip

# Qwen/Qwen2.5-14B-Instruct config.json: num_hidden_layers 48, hidden_size 5120,
# num_attention_heads 40, num_key_value_heads 8, intermediate_size 13824,
# vocab_size 152064, tie_word_embeddings false, max_position_embeddings 32768.
QWEN25_14B = ModelSpec(
    name="Qwen2.5-14B-Instruct",
    layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128, intermediate=13824,
    vocab=152064, tied_embeddings=False, max_positions=32768, attention_bias=True,
)  # fmt: skip

# Qwen/Qwen2.5-32B-Instruct config.json: num_hidden_layers 64, hidden_size 5120,
# num_attention_heads 40, num_key_value_heads 8, intermediate_size 27648,
# vocab_size 152064, tie_word_embeddings false, max_position_embeddings 32768.
QWEN25_32B = ModelSpec(
    name="Qwen2.5-32B-Instruct",
    layers=64, hidden=5120, heads=40, kv_heads=8, head_dim=128, intermediate=27648,
    vocab=152064, tied_embeddings=False, max_positions=32768, attention_bias=True,
)  # fmt: skip

# Qwen/Qwen2.5-72B-Instruct config.json: num_hidden_layers 80, hidden_size 8192,
# num_attention_heads 64, num_key_value_heads 8, intermediate_size 29568,
# vocab_size 152064, tie_word_embeddings false, max_position_embeddings 32768.
QWEN25_72B = ModelSpec(
    name="Qwen2.5-72B-Instruct",
    layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=29568,
    vocab=152064, tied_embeddings=False, max_positions=32768, attention_bias=True,
)  # fmt: skip

# Qwen/Qwen2.5-72B-Instruct-AWQ config.json: the same shapes, except intermediate_size padded
# from 29568 to 29696 so that down_proj's input splits into whole 128-groups at TP 2, 4 and 8
# (as Qwen documents for its 72B quantized checkpoints); quantization_config awq, group 128.
QWEN25_72B_AWQ = replace(
    QWEN25_72B, name="Qwen2.5-72B-Instruct-AWQ", intermediate=29696, awq_group_size=128
)

# Qwen/Qwen3-8B config.json: num_hidden_layers 36, hidden_size 4096, num_attention_heads 32,
# num_key_value_heads 8, head_dim 128, intermediate_size 12288, vocab_size 151936,
# tie_word_embeddings false, max_position_embeddings 40960, attention_bias false; q/k norm.
QWEN3_8B = ModelSpec(
    name="Qwen3-8B",
    layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, intermediate=12288,
    vocab=151936, tied_embeddings=False, max_positions=40960, qk_norm=True, lora_embeddings=True,
)  # fmt: skip

# Qwen/Qwen3-14B config.json: num_hidden_layers 40, hidden_size 5120, num_attention_heads 40,
# num_key_value_heads 8, head_dim 128, intermediate_size 17408, vocab_size 151936,
# tie_word_embeddings false, max_position_embeddings 40960.
QWEN3_14B = ModelSpec(
    name="Qwen3-14B",
    layers=40, hidden=5120, heads=40, kv_heads=8, head_dim=128, intermediate=17408,
    vocab=151936, tied_embeddings=False, max_positions=40960, qk_norm=True, lora_embeddings=True,
)  # fmt: skip

# Qwen/Qwen3-32B config.json: num_hidden_layers 64, hidden_size 5120, num_attention_heads 64,
# num_key_value_heads 8, head_dim 128, intermediate_size 25600, vocab_size 151936,
# tie_word_embeddings false, max_position_embeddings 40960.
QWEN3_32B = ModelSpec(
    name="Qwen3-32B",
    layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128, intermediate=25600,
    vocab=151936, tied_embeddings=False, max_positions=40960, qk_norm=True, lora_embeddings=True,
)  # fmt: skip

# Qwen/Qwen3.5-9B config.json `text_config` (model card: 32 layers = 8 x (3 Gated DeltaNet +
# 1 gated attention), hidden 4096, DeltaNet 16 QK / 32 V heads of dim 128, attention 16 Q /
# 4 KV heads of dim 256, intermediate 12288, vocab and LM output 248320 (untied: the text
# parameters then sum to the published 8.95B), max_position_embeddings 262144,
# full_attention_interval 4, linear_conv_kernel_dim 4, attn_output_gate true,
# mamba_ssm_dtype float32 (vLLM 0.32's Qwen3_5*Config copies it into the state cache dtype:
# 4-byte recurrent state). vision_config: depth 27, hidden 1152, intermediate 4304, 16 heads,
# patch 16, spatial merge 2, temporal patch 2, out_hidden_size 4096.
# Checked against public copies of the hub file (a test fixture of the 9B config,
# and two documents quoting huggingface.co/Qwen/Qwen3.5-9B/blob/main/config.json), which
# agree with each other; not against the hub file itself (no network here).
QWEN35_9B = ModelSpec(
    name="Qwen3.5-9B",
    layers=32, hidden=4096, heads=16, kv_heads=4, head_dim=256, intermediate=12288,
    vocab=248320, tied_embeddings=False, max_positions=262144,
    qk_norm=True, lora_embeddings=True, attention_output_gate=True,
    layer_types=hybrid_layer_types(32, 4),
    linear=GatedDeltaNetSpec(
        key_heads=16, value_heads=32, key_head_dim=128, value_head_dim=128, conv_kernel=4,
        recurrent_state_bytes=4,
    ),
    vision_params=vision_encoder_params(VisionConfig(out_hidden=4096)),
    notes=("config values from public copies of the hub config.json (see catalog.py)",),
)  # fmt: skip

# Qwen/Qwen3.5-27B config.json `text_config`: num_hidden_layers 64, hidden_size 5120,
# num_attention_heads 24, num_key_value_heads 4, head_dim 256, intermediate_size 17408,
# vocab_size 248320, tie_word_embeddings false, max_position_embeddings 262144,
# full_attention_interval 4 (48 linear + 16 full), linear_num_key_heads 16,
# linear_num_value_heads 48, linear_key_head_dim 128, linear_value_head_dim 128,
# linear_conv_kernel_dim 4, mamba_ssm_dtype float32, attn_output_gate true.
# vision_config: as the 9B's (depth 27, hidden 1152, intermediate 4304, patch 16) with
# out_hidden_size 5120: from 27B-shaped test fixtures and the later qwen3_5-architecture 27B
# configs, not from a copy of this model's own file.
QWEN35_27B = ModelSpec(
    name="Qwen3.5-27B",
    layers=64, hidden=5120, heads=24, kv_heads=4, head_dim=256, intermediate=17408,
    vocab=248320, tied_embeddings=False, max_positions=262144,
    qk_norm=True, lora_embeddings=True, attention_output_gate=True,
    layer_types=hybrid_layer_types(64, 4),
    linear=GatedDeltaNetSpec(
        key_heads=16, value_heads=48, key_head_dim=128, value_head_dim=128, conv_kernel=4,
        recurrent_state_bytes=4,
    ),
    vision_params=vision_encoder_params(VisionConfig(out_hidden=5120)),
    notes=("vision_config from 27B-shaped copies, not this model's file (see catalog.py)",),
)  # fmt: skip

# Qwen/Qwen3-Coder-30B-A3B-Instruct config.json (Qwen3MoeForCausalLM): num_hidden_layers 48,
# hidden_size 2048, num_attention_heads 32, num_key_value_heads 4, head_dim 128,
# num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768,
# shared_expert_intermediate_size 0, decoder_sparse_step 1, mlp_only_layers [] (every layer
# sparse; intermediate_size 5472 is then unused), vocab_size 151936, tie_word_embeddings false,
# max_position_embeddings 262144, torch_dtype bfloat16; q/k norm, no attention bias.
# From public copies of the hub file, whose model.safetensors.index.json gives total_size
# 61,064,245,248 bytes: the 30,532,122,624 bf16 parameters this spec counts.
QWEN3_CODER_30B_A3B = ModelSpec(
    name="Qwen3-Coder-30B-A3B-Instruct",
    layers=48, hidden=2048, heads=32, kv_heads=4, head_dim=128, intermediate=5472,
    vocab=151936, tied_embeddings=False, max_positions=262144, qk_norm=True, lora_embeddings=True,
    moe=MoeSpec(num_experts=128, experts_per_token=8, expert_intermediate=768),
)  # fmt: skip

# Qwen/Qwen3-Coder-480B-A35B-Instruct config.json (Qwen3MoeForCausalLM): num_hidden_layers 62,
# hidden_size 6144, num_attention_heads 96, num_key_value_heads 8, head_dim 128,
# num_experts 160, num_experts_per_tok 8, moe_intermediate_size 2560,
# shared_expert_intermediate_size 0, decoder_sparse_step 1, mlp_only_layers [],
# intermediate_size 8192 (unused), vocab_size 151936, tie_word_embeddings false,
# max_position_embeddings 262144. From public copies of the hub file (not the file itself).
QWEN3_CODER_480B_A35B = ModelSpec(
    name="Qwen3-Coder-480B-A35B-Instruct",
    layers=62, hidden=6144, heads=96, kv_heads=8, head_dim=128, intermediate=8192,
    vocab=151936, tied_embeddings=False, max_positions=262144, qk_norm=True, lora_embeddings=True,
    moe=MoeSpec(num_experts=160, experts_per_token=8, expert_intermediate=2560),
    notes=("config values from public copies of the hub config.json (see catalog.py)",),
)  # fmt: skip

# Qwen/Qwen3-Embedding-0.6B config.json (Qwen3ForCausalLM, served by vLLM's pooling runner):
# Qwen3-0.6B's shapes (num_hidden_layers 28, hidden_size 1024, num_attention_heads 16,
# num_key_value_heads 8, head_dim 128, intermediate_size 3072) with vocab_size 151669,
# max_position_embeddings 32768, tie_word_embeddings true. From public copies of the hub file,
# which agree with each other.
QWEN3_EMBEDDING_06B = ModelSpec(
    name="Qwen3-Embedding-0.6B",
    layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072,
    vocab=151669, tied_embeddings=True, max_positions=32768, qk_norm=True, lora_embeddings=True,
)  # fmt: skip

# Qwen/Qwen3-Embedding-8B config.json: Qwen3-8B's shapes (QWEN3_8B above) with vocab_size
# 151665, max_position_embeddings 40960, tie_word_embeddings false (a pooling runner loads no
# LM head either way). From one public copy of the hub file.
QWEN3_EMBEDDING_8B = replace(
    QWEN3_8B,
    name="Qwen3-Embedding-8B",
    vocab=151665,
    notes=("config values from a public copy of the hub config.json (see catalog.py)",),
)

# Qwen/Qwen3-Reranker-0.6B config.json: Qwen3-0.6B's shapes (QWEN3_EMBEDDING_06B's) and tied
# embeddings, as the model card's base model Qwen3-0.6B-Base; vocab_size 151669 and
# max_position_embeddings 40960 as Qwen3-Reranker-8B's file (no copy of this model's own file
# was at hand: the two differ from it by at most 0.3 MiB of embedding).
QWEN3_RERANKER_06B = replace(
    QWEN3_EMBEDDING_06B,
    name="Qwen3-Reranker-0.6B",
    max_positions=40960,
    notes=("vocab and context from Qwen3-Reranker-8B's config.json (see catalog.py)",),
)

# Qwen/Qwen3-Reranker-8B config.json (Qwen3ForCausalLM; vLLM serves it as a one-label
# classifier from the LM head's "yes" and "no" rows, dropping the rest of the head): Qwen3-8B's
# shapes with vocab_size 151669, max_position_embeddings 40960, tie_word_embeddings false.
# From a public dump of the hub file and its tensor list: 8,188,548,096 parameters with the
# LM head, this spec's count less vLLM's padding of the vocabulary to 151680 rows.
QWEN3_RERANKER_8B = replace(QWEN3_8B, name="Qwen3-Reranker-8B", vocab=151669)

CATALOG: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        QWEN25_7B, QWEN25_14B, QWEN25_32B, QWEN25_72B, QWEN25_72B_AWQ,
        QWEN3_8B, QWEN3_14B, QWEN3_32B,
        QWEN35_9B, QWEN35_27B,
        QWEN3_CODER_30B_A3B, QWEN3_CODER_480B_A35B,
        QWEN3_EMBEDDING_06B, QWEN3_EMBEDDING_8B, QWEN3_RERANKER_06B, QWEN3_RERANKER_8B,
    )
}  # fmt: skip

_AWQ_SUFFIX = "-awq"


def _lookup(name: str) -> ModelSpec | None:
    """Exact entry first (`...-AWQ` checkpoints with their own shapes), then the base model."""
    wanted = name.lower().rstrip("/").split("/")[-1]
    for candidate in (wanted, wanted.removesuffix(_AWQ_SUFFIX)):
        for spec_name, spec in CATALOG.items():
            key = spec_name.lower()
            if candidate in (key, key.removesuffix("-instruct")):
                return spec
    return None


def names_awq(name: str) -> bool:
    """Whether a model reference names an AWQ checkpoint (`Qwen/Qwen2.5-7B-Instruct-AWQ`)."""
    return name.lower().rstrip("/").endswith(_AWQ_SUFFIX)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog entry by name, or the spec read from `<path>/config.json`."""
    if not name_or_path.strip():
        raise ServingError("--model: empty model name")
    path = Path(name_or_path).expanduser()
    if path.is_dir() or path.name == "config.json":
        return load_config_dir(path)
    spec = _lookup(name_or_path)
    if spec is None:
        known = ", ".join(CATALOG)
        raise ServingError(
            f"--model: unknown model {name_or_path!r} (catalog: {known}; "
            "or a directory with a config.json)"
        )
    return spec
