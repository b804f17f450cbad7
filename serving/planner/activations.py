"""What vLLM's start-up profiling subtracts besides weights: an ESTIMATE, not a measurement.

vLLM runs one forward pass of `max_num_batched_tokens` dummy tokens and one sampler pass of
`max_num_seqs` rows, and takes the torch peak above the weights as activation memory
(`Worker.determine_available_memory`, vllm/v1/worker/gpu_worker.py). The two passes run one
after the other, so the peak is the larger of them. Allocator fragmentation, attention
workspaces and torch.compile buffers are not modelled; expect the real number within ~2x.

Besides that vLLM subtracts memory that torch does not allocate (NCCL and custom all-reduce
buffers with TP, cuBLAS workspaces) and, by default (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1),
its estimate of CUDA graph memory. Both are fixed guesses here.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.planner.gpus import GiB
from serving.planner.models import ModelSpec
from serving.planner.settings import PlanSettings
from serving.planner.vision import encoder_activation, encoder_profile_images
from serving.planner.weights import cdiv, kv_heads_per_gpu

LOGIT_BYTES = 4  # the sampler works on float32 logits
NON_TORCH_BYTES_TP1 = GiB // 4  # cuBLAS/cuda workspaces on one GPU
NON_TORCH_BYTES_TP = 3 * GiB // 4  # plus NCCL and custom all-reduce buffers with TP > 1
CUDA_GRAPH_BYTES = GiB // 2  # typical capture of the default batch sizes


@dataclass(frozen=True)
class Activation:
    forward_bytes: int  # peak of the prefill forward pass over max_num_batched_tokens
    sampler_bytes: int  # logits for max_num_seqs sampled tokens

    @property
    def peak_bytes(self) -> int:
        return max(self.forward_bytes, self.sampler_bytes)


def _widest_layer(spec: ModelSpec, tp: int) -> int:
    """Values per token the widest block keeps alive at once, on one GPU."""
    hd = spec.head_dim
    q = spec.heads // tp * hd
    kv = kv_heads_per_gpu(spec, tp) * hd
    gate = 2 if spec.attention_output_gate else 1
    attention = q * gate + 2 * kv + q  # qkv projection output + attention output
    widths = [attention]
    if spec.linear is not None and spec.is_hybrid:
        g = spec.linear
        # projections (q, k, v, z, b, a) + core attention output
        widths.append((g.conv_dim + g.value_dim + 2 * g.value_heads) // tp + g.value_dim // tp)
    if spec.dense_mlp_layers:
        widths.append(3 * cdiv(spec.intermediate, tp))  # gate_up output + activation
    if spec.moe is not None:
        widths.append(_moe_width(spec, tp))
    return max(widths)


def _moe_width(spec: ModelSpec, tp: int) -> int:
    """Values per token of one sparse MLP on one GPU, as vLLM's Triton fused-MoE allocates them
    (`TritonExperts.workspace_shapes`, no chunking): workspace13 of top_k x max(I, hidden),
    which also holds the output, and workspace2 of top_k x max(2I, hidden), I the expert's
    intermediate per GPU; plus the router logits and a shared expert's gate_up + activation.
    The top-k ids and weights (about 12 bytes per selected expert) are left out."""
    assert spec.moe is not None
    moe = spec.moe
    inter = cdiv(moe.expert_intermediate, tp)
    h = spec.hidden
    routed = moe.experts_per_token * (max(inter, h) + max(2 * inter, h))
    shared = 3 * cdiv(moe.shared_expert_intermediate, tp)
    return routed + shared + moe.num_experts


def activation_estimate(
    spec: ModelSpec, tp: int, *, dtype_bytes: int, max_num_batched_tokens: int, max_num_seqs: int
) -> Activation:
    """Peak activation bytes on one GPU during vLLM's profiling run (estimate).

    forward: tokens x dtype x (4 x hidden [residual, normed input, layer output, next input]
    + the widest intermediate); sampler: max_num_seqs x vocab x 4 bytes of logits.
    """
    per_token = 4 * spec.hidden + _widest_layer(spec, tp)
    return Activation(
        forward_bytes=max_num_batched_tokens * dtype_bytes * per_token,
        sampler_bytes=max_num_seqs * spec.vocab * LOGIT_BYTES,
    )


def non_torch_bytes(tp: int) -> int:
    """Estimated non-torch memory vLLM counts against the budget."""
    return NON_TORCH_BYTES_TP1 if tp == 1 else NON_TORCH_BYTES_TP


def with_vision_encoder(
    decoder_peak: int, spec: ModelSpec, settings: PlanSettings, *, dtype_bytes: int
) -> int:
    """The profiling peak of the GPU holding a Qwen2.5-VL vision encoder (the first stage).

    Before its decoder pass vLLM encodes a dummy batch of the largest images
    (`GPUModelRunner.profile_run`) and keeps their embeddings in the encoder cache during the
    decoder pass: the peak is the larger of the encoder pass and decoder pass + embeddings.
    Images only: a profile that leaves video allowed may be profiled with a larger video.
    """
    s = settings
    if spec.vision is None or s.language_model_only:
        return decoder_peak
    assert s.max_num_batched_tokens and s.max_num_seqs and s.max_model_len
    images = encoder_profile_images(
        spec.vision,
        max_num_batched_tokens=s.max_num_batched_tokens,
        max_num_seqs=s.max_num_seqs,
        max_model_len=s.max_model_len,
        images_per_prompt=s.images_per_prompt,
    )
    if images == 0:
        return decoder_peak
    encoder = encoder_activation(spec.vision, images, dtype_bytes=dtype_bytes)
    return max(encoder.peak_bytes, decoder_peak + encoder.output_bytes)
